// Keras's fit options beyond epochs and batches: validation_split (the last fraction of the
// arrays, taken before shuffling, validates), checked against fitting on the two parts by hand;
// class_weight and sample_weight, checked against a float64 reference of the weighted loss and
// its gradient, and against the identities the weighting implies.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <algorithm>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>

using namespace strata::nn;
using strata_test::error_of;
using strata_test::has;

namespace {

using Small = Sequential<Input<4>, Dense<8, Tanh>, Dense<3, Softmax>>;

struct Arrays {
    std::vector<float> x;
    std::vector<std::int32_t> y;
};

// n examples of 4 features; the class is decided by the signs of two linear forms.
Arrays arrays(std::size_t n, std::uint64_t seed) {
    const auto f = strata_test::lcg(n * 4, seed);
    Arrays a{std::vector<float>(f.begin(), f.end()), std::vector<std::int32_t>(n)};
    for (std::size_t i = 0; i < n; ++i) {
        const double p = f[i * 4] + 0.5 * f[i * 4 + 1], q = f[i * 4 + 2] - f[i * 4 + 3];
        a.y[i] = p > 0 ? (q > 0 ? 2 : 1) : 0;
    }
    return a;
}

// Models are not movable: each test declares its own and compiles it here.
void compile(strata::Model<Small>& m) {
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
}

}  // namespace

TEST_CASE("validation_split holds out the last fraction of the arrays, before shuffling (Keras)") {
    const std::size_t n = 103;
    const double split = 0.25;
    const auto split_at = std::size_t(std::floor(double(n) * (1.0 - split)));   // Keras: floor(n * (1 - split))
    REQUIRE(split_at == 77);
    const Arrays all = arrays(n, 3);

    strata::Model<Small> with_split(5);
    compile(with_split);
    const auto h = with_split.fit(all.x, all.y, {.epochs = 4, .verbose = 0, .batch_size = 16, .validation_split = split});

    // By hand: train on the first 77 examples (shuffled the same way: same seed, same count),
    // validate on the last 26 in their order.
    std::vector<float> tx(all.x.begin(), all.x.begin() + split_at * 4), vx(all.x.begin() + split_at * 4, all.x.end());
    std::vector<std::int32_t> ty(all.y.begin(), all.y.begin() + split_at), vy(all.y.begin() + split_at, all.y.end());
    auto val = strata::data::from_arrays(vx, {4}, vy).batch(16);
    strata::Model<Small> by_hand(5);
    compile(by_hand);
    const auto r = by_hand.fit(tx, ty, {.epochs = 4, .validation_data = val, .verbose = 0, .batch_size = 16});

    CHECK(with_split.get_weights() == by_hand.get_weights());
    REQUIRE(h["val_loss"].size() == 4);
    CHECK(h["loss"] == r["loss"]);
    CHECK(h["val_loss"] == r["val_loss"]);
    CHECK(h["val_accuracy"] == r["val_accuracy"]);
    // The validation figures of the last epoch are those of evaluate on the held-out part.
    const auto ev = with_split.evaluate(val);
    CHECK(h["val_loss"].back() == doctest::Approx(ev.loss).epsilon(1e-12));
    CHECK(h["val_accuracy"].back() == doctest::Approx(ev.accuracy).epsilon(1e-12));

    // Trained on fewer examples than without a split: the weights differ from a fit on all.
    strata::Model<Small> no_split(5);
    compile(no_split);
    const auto full = no_split.fit(all.x, all.y, {.epochs = 4, .verbose = 0, .batch_size = 16});
    CHECK(no_split.get_weights() != with_split.get_weights());
    CHECK(full.history.count("val_loss") == 0);
}

TEST_CASE("validation_split: validation_data takes precedence and nothing is held out (Keras)") {
    const Arrays all = arrays(60, 4);
    const Arrays other = arrays(20, 9);
    auto val = strata::data::from_arrays(other.x, {4}, other.y).batch(8);
    strata::Model<Small> a(5);
    compile(a);
    const auto ha = a.fit(all.x, all.y, {.epochs = 2, .validation_data = val, .verbose = 0, .batch_size = 8, .validation_split = 0.5});
    strata::Model<Small> b(5);
    compile(b);
    const auto hb = b.fit(all.x, all.y, {.epochs = 2, .validation_data = val, .verbose = 0, .batch_size = 8});
    CHECK(a.get_weights() == b.get_weights());
    CHECK(ha["val_loss"] == hb["val_loss"]);
}

TEST_CASE("validation_split: regression targets (several values per example) are split by example") {
    using Reg = Sequential<Input<2>, Dense<3>>;
    const std::size_t n = 40;
    const auto f = strata_test::lcg(n * 2, 7);
    std::vector<float> x(f.begin(), f.end()), y(n * 3);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < 3; ++j) y[i * 3 + j] = float(x[i * 2] * double(j) - x[i * 2 + 1]);
    auto fit = [&](bool split) {
        strata::Model<Reg> m(2);
        m.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{.learning_rate = 0.05}, {});
        if (split) return std::pair{m.fit(x, y, {.epochs = 3, .verbose = 0, .batch_size = 5, .validation_split = 0.2}), m.get_weights()};
        std::vector<float> tx(x.begin(), x.begin() + 32 * 2), ty(y.begin(), y.begin() + 32 * 3);
        auto val = strata::data::Dataset<float>::from_arrays(std::vector<float>(x.begin() + 32 * 2, x.end()), {2},
                                                              std::vector<float>(y.begin() + 32 * 3, y.end()), 3).batch(5);
        return std::pair{m.fit(tx, ty, {.epochs = 3, .validation_data = val, .verbose = 0, .batch_size = 5}), m.get_weights()};
    };
    const auto [hs, ws] = fit(true);
    const auto [hh, wh] = fit(false);
    CHECK(ws == wh);
    CHECK(hs["val_loss"] == hh["val_loss"]);
}

TEST_CASE("validation_split: errors") {
    const Arrays all = arrays(10, 1);
    for (const double bad : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
        strata::Model<Small> m(5);
    compile(m);
        const auto msg = error_of<strata::ValueError>([&] { m.fit(all.x, all.y, {.verbose = 0, .validation_split = bad}); });
        CAPTURE(bad);
        CHECK(has(msg, "validation_split must be in [0, 1)"));
    }
    {   // Keras: both parts must be non-empty (10 * (1 - 0.01) = 9.9 -> 9 train, 1 validates: fine;
        // 1 example cannot be split).
        strata::Model<Small> m(5);
    compile(m);
        CHECK_NOTHROW(m.fit(all.x, all.y, {.verbose = 0, .validation_split = 0.01}));
        const Arrays one = arrays(1, 2);
        const auto msg = error_of<strata::ValueError>([&] { m.fit(one.x, one.y, {.verbose = 0, .validation_split = 0.5}); });
        CHECK(has(msg, "1 examples cannot be split"));
    }
    {   // A Dataset cannot be split before shuffling: the message says to pass validation_data.
        strata::Model<Small> m(5);
    compile(m);
        auto ds = strata::data::from_arrays(all.x, {4}, all.y).batch(5);
        const auto msg = error_of<strata::ValueError>([&] { m.fit(ds, {.verbose = 0, .validation_split = 0.2}); });
        CHECK(has(msg, "validation_split"));
        CHECK(has(msg, "pass validation_data"));
    }
}

// ---- class_weight ------------------------------------------------------------------------------
namespace {

using Linear3 = Sequential<Input<4>, Dense<3, Softmax>>;

// One full-batch SGD step of a softmax regression in float64, weighted as Keras weighs
// (keras/src/losses/loss.py: reduce_weighted_values multiplies each example's loss by its
// weight, then the "sum_over_batch_size" reduction divides the sum by the number of examples).
// An example's weight is its class weight times its sample weight (1 when `sample_weight` is
// empty), as Keras multiplies them. Returns the loss before the step; `w` (kernel [4, 3] then
// bias [3]) is updated in place.
double reference_step(std::vector<double>& w, const std::vector<float>& x, const std::vector<std::int32_t>& y,
                      const std::map<std::int64_t, double>& class_weight, double lr,
                      const std::vector<float>& sample_weight = {}) {
    const std::size_t n = y.size();
    std::vector<double> grad(w.size(), 0.0);
    double loss = 0;
    for (std::size_t i = 0; i < n; ++i) {
        double z[3];
        for (int c = 0; c < 3; ++c) {
            z[c] = w[12 + std::size_t(c)];
            for (int k = 0; k < 4; ++k) z[c] += double(x[i * 4 + std::size_t(k)]) * w[std::size_t(k * 3 + c)];
        }
        const double m = std::max({z[0], z[1], z[2]});
        const double s = std::exp(z[0] - m) + std::exp(z[1] - m) + std::exp(z[2] - m);
        const auto it = class_weight.find(y[i]);
        const double cw = (it == class_weight.end() ? 1.0 : it->second) *
                          (sample_weight.empty() ? 1.0 : double(sample_weight[i]));
        loss += cw * (m + std::log(s) - z[y[i]]);
        for (int c = 0; c < 3; ++c) {
            const double d = cw * (std::exp(z[c] - m) / s - (c == y[i] ? 1.0 : 0.0)) / double(n);
            grad[12 + std::size_t(c)] += d;
            for (int k = 0; k < 4; ++k) grad[std::size_t(k * 3 + c)] += d * double(x[i * 4 + std::size_t(k)]);
        }
    }
    for (std::size_t j = 0; j < w.size(); ++j) w[j] -= lr * grad[j];
    return loss / double(n);
}

}  // namespace

TEST_CASE("class_weight weighs each example's loss by its class, as Keras does (float64 reference)") {
    const Arrays a = arrays(24, 6);
    const std::map<std::int64_t, double> cw{{0, 2.5}, {2, 0.25}};   // class 1 unlisted: weight 1
    strata::Model<Linear3, strata::distribute::Default, double> model(3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.5});
    std::vector<double> w = model.get_weights();
    auto ds = strata::data::from_arrays(a.x, {4}, a.y).batch(24);   // one full batch per epoch
    const auto h = model.fit(ds, {.epochs = 3, .verbose = 0, .class_weight = cw});
    for (int e = 0; e < 3; ++e) {
        const double ref_loss = reference_step(w, a.x, a.y, cw, 0.5);
        CAPTURE(e);
        CHECK(h["loss"][std::size_t(e)] == doctest::Approx(ref_loss).epsilon(1e-12));
    }
    CHECK(strata_test::max_relative_difference(model.get_weights(), w) < 1e-12);
    // Unweighted afterwards: class_weight lasts for its fit only.
    std::vector<double> w2 = model.get_weights();
    const auto h2 = model.fit(ds, {.epochs = 1, .verbose = 0});
    CHECK(h2["loss"][0] == doctest::Approx(reference_step(w2, a.x, a.y, {}, 0.5)).epsilon(1e-12));
    // Accuracy is not weighted (Keras's `metrics`, as opposed to `weighted_metrics`).
    const auto ev = model.evaluate(ds);
    CHECK(h2["accuracy"][0] >= 0.0);
    CHECK(ev.examples == 24);
}

TEST_CASE("class_weight: one-hot targets use the argmax; Mirrored weighs as one device does; errors") {
    const Arrays a = arrays(32, 8);
    const std::map<std::int64_t, double> cw{{1, 3.0}, {2, 0.5}};
    // Sparse labels and their one-hot rows with CategoricalCrossentropy give the same training.
    std::vector<float> onehot(a.y.size() * 3, 0.0f);
    for (std::size_t i = 0; i < a.y.size(); ++i) onehot[i * 3 + std::size_t(a.y[i])] = 1.0f;
    strata::Model<Linear3, strata::distribute::Default, double> sparse(4), dense(4);
    sparse.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.3});
    dense.compile(strata::loss::CategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.3});
    const auto hs = sparse.fit(strata::data::from_arrays(a.x, {4}, a.y).batch(8), {.epochs = 2, .verbose = 0, .class_weight = cw});
    const auto hd = dense.fit(strata::data::Dataset<float>::from_arrays(a.x, {4}, onehot, 3).batch(8),
                              {.epochs = 2, .verbose = 0, .class_weight = cw});
    CHECK(strata_test::max_relative_difference(sparse.get_weights(), dense.get_weights()) < 1e-12);
    CHECK(hs["loss"].back() == doctest::Approx(hd["loss"].back()).epsilon(1e-12));

    // Two replicas: each weighs its share; the summed gradient is the one-device one.
    strata::distribute::Mirrored<> strategy(2);
    strata::Model<Linear3, strata::distribute::Mirrored<>, double> mirrored(strategy, 4);
    mirrored.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.3});
    const auto hm = mirrored.fit(strata::data::from_arrays(a.x, {4}, a.y).batch(8), {.epochs = 2, .verbose = 0, .class_weight = cw});
    CHECK(strata_test::max_relative_difference(mirrored.get_weights(), sparse.get_weights()) < 1e-12);
    CHECK(hm["loss"].back() == doctest::Approx(hs["loss"].back()).epsilon(1e-12));

    strata::Model<Small> m(1);
    compile(m);
    auto ds = strata::data::from_arrays(a.x, {4}, a.y).batch(8);
    for (const auto& bad : {std::map<std::int64_t, double>{{3, 1.0}}, std::map<std::int64_t, double>{{-1, 1.0}},
                            std::map<std::int64_t, double>{{0, -1.0}},
                            std::map<std::int64_t, double>{{0, std::numeric_limits<double>::infinity()}}}) {
        const auto msg = error_of<strata::ValueError>([&] { m.fit(ds, {.verbose = 0, .class_weight = bad}); });
        CHECK(has(msg, "fit: class_weight {"));
    }
}

// ---- sample_weight -----------------------------------------------------------------------------
namespace {

// The examples of each batch of epoch `epoch` of a dataset of n examples shuffled with `seed`
// and batched by `batch` (what the array overload of fit builds, with the model's seed): a
// dataset whose labels are the example indices, shuffled the same way, names them (a shuffle's
// order depends on its seed, the pass and the number of examples only).
std::vector<std::vector<std::size_t>> shuffled_batches(std::size_t n, std::uint64_t seed, std::size_t batch,
                                                       std::uint64_t epoch) {
    std::vector<std::int32_t> index(n);
    for (std::size_t i = 0; i < n; ++i) index[i] = std::int32_t(i);
    const auto ds = strata::data::from_arrays(std::vector<float>(n, 0.0f), {1}, std::move(index)).shuffle(n, seed).batch(batch);
    std::vector<std::vector<std::size_t>> out;
    for (auto it = ds.iterate(epoch); it != std::default_sentinel; ++it) out.emplace_back(it->y.begin(), it->y.end());
    return out;
}

// One epoch of reference_step over the given batches of `a` (example weights `sw`); returns the
// epoch's loss as fit reports it: the weighted sum over all examples / their number.
double reference_epoch(std::vector<double>& w, const Arrays& a, const std::vector<float>& sw,
                       const std::vector<std::vector<std::size_t>>& batches, double lr) {
    double sum = 0;
    std::size_t n = 0;
    for (const auto& b : batches) {
        std::vector<float> bx, bw;
        std::vector<std::int32_t> by;
        for (const std::size_t i : b) {
            bx.insert(bx.end(), a.x.begin() + std::ptrdiff_t(i * 4), a.x.begin() + std::ptrdiff_t(i * 4 + 4));
            by.push_back(a.y[i]);
            bw.push_back(sw[i]);
        }
        sum += reference_step(w, bx, by, {}, lr, bw) * double(b.size());
        n += b.size();
    }
    return sum / double(n);
}

// Sparse cross-entropy of predicted probabilities, each example weighted, / the examples.
double weighted_cross_entropy(const strata::Tensor<float>& p, const std::vector<std::int32_t>& y, const std::vector<float>& sw) {
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s -= double(sw[i]) * std::log(double(p.at(std::int64_t(i), y[i])));
    return s / double(y.size());
}

double accuracy_of(const strata::Tensor<float>& p, const std::vector<std::int32_t>& y) {
    std::size_t right = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
        std::int64_t best = 0;
        for (std::int64_t c = 1; c < p.dim(1); ++c)
            if (p.at(std::int64_t(i), c) > p.at(std::int64_t(i), best)) best = c;
        right += best == y[i];
    }
    return double(right) / double(y.size());
}

}  // namespace

TEST_CASE("sample_weight weighs each example's loss and gradient, shuffled with its example (float64 reference)") {
    const std::size_t n = 30;
    const Arrays a = arrays(n, 12);
    std::vector<float> sw(n);
    for (std::size_t i = 0; i < n; ++i) sw[i] = 0.25f * float((i * 7) % 11);   // 0 to 2.5, three zeros
    const double lr = 0.5;

    // The array overload: shuffled mini-batches of 8 (the last of 6), from the model's seed.
    strata::Model<Linear3, strata::distribute::Default, double> model(3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = lr});
    std::vector<double> w = model.get_weights();
    const std::vector<double> w0 = w;
    const auto h = model.fit(a.x, a.y, {.epochs = 3, .verbose = 0, .batch_size = 8, .sample_weight = sw});
    for (std::uint64_t e = 0; e < 3; ++e) {
        CAPTURE(e);
        const double ref = reference_epoch(w, a, sw, shuffled_batches(n, 3, 8, e), lr);
        CHECK(h["loss"][std::size_t(e)] == doctest::Approx(ref).epsilon(1e-12));
    }
    CHECK(strata_test::max_relative_difference(model.get_weights(), w) < 1e-12);
    // The reference can tell: weights left in their unshuffled order, or ignored, train otherwise.
    std::vector<double> misaligned = w0, ignored = w0;
    for (std::uint64_t e = 0; e < 3; ++e) {
        auto batches = shuffled_batches(n, 3, 8, e);
        std::vector<float> by_position(n);
        std::size_t k = 0;
        for (const auto& b : batches)
            for (const std::size_t i : b) by_position[i] = sw[k++];
        reference_epoch(misaligned, a, by_position, batches, lr);
        reference_epoch(ignored, a, std::vector<float>(n, 1.0f), batches, lr);
    }
    CHECK(strata_test::max_relative_difference(misaligned, w) > 1e-6);
    CHECK(strata_test::max_relative_difference(ignored, w) > 1e-6);

    // A Dataset that carries the weights: the same, shuffled by its own seed.
    strata::Model<Linear3, strata::distribute::Default, double> from_ds(3);
    from_ds.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = lr});
    std::vector<double> wd = from_ds.get_weights();
    const auto weighted = strata::data::from_arrays(a.x, {4}, a.y, sw).shuffle(n, 77).batch(7);
    const auto hd = from_ds.fit(weighted, {.epochs = 2, .verbose = 0});
    for (std::uint64_t e = 0; e < 2; ++e)
        CHECK(hd["loss"][std::size_t(e)] == doctest::Approx(reference_epoch(wd, a, sw, shuffled_batches(n, 77, 7, e), lr)).epsilon(1e-12));
    CHECK(strata_test::max_relative_difference(from_ds.get_weights(), wd) < 1e-12);
}

TEST_CASE("sample_weight: all ones is unweighted bit for bit; all twos double the loss and the gradient") {
    const std::size_t n = 40;
    const Arrays a = arrays(n, 13);
    auto run = [&](std::vector<float> sw, double lr) {
        strata::Model<Small> m(7);
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = lr});
        auto h = m.fit(a.x, a.y, {.epochs = 3, .verbose = 0, .batch_size = 8, .sample_weight = std::move(sw)});
        return std::pair{h, m.get_weights()};
    };
    const auto [h0, w0] = run({}, 0.1);
    const auto [h1, w1] = run(std::vector<float>(n, 1.0f), 0.1);
    CHECK(w1 == w0);
    CHECK(h1["loss"] == h0["loss"]);
    CHECK(h1["accuracy"] == h0["accuracy"]);
    // Weight 2: each loss and gradient doubles (exactly, a power of two). With half the rate
    // plain SGD takes the very same steps, and every reported loss is twice the unweighted one.
    const auto [h2, w2] = run(std::vector<float>(n, 2.0f), 0.05);
    CHECK(w2 == w0);
    for (std::size_t e = 0; e < 3; ++e) CHECK(h2["loss"][e] == 2.0 * h0["loss"][e]);
    CHECK(h2["accuracy"] == h0["accuracy"]);   // metrics are not weighted
    // At the same rate the doubled gradient takes other steps.
    CHECK(run(std::vector<float>(n, 2.0f), 0.1).second != w0);
}

TEST_CASE("sample_weight: a zero weight leaves the loss's numerator, not its denominator (sum_over_batch_size)") {
    // 24 examples in one batch; the 6 with i % 4 == 3 weigh 0. Keras divides the weighted sum by
    // all 24, so the gradient is 18/24 of the mean gradient over the 18 others: training on those
    // 18 alone at 18/24 of the rate is the same training.
    const Arrays a = arrays(24, 15);
    std::vector<float> sw(24, 1.0f);
    Arrays kept;
    for (std::size_t i = 0; i < 24; ++i) {
        if (i % 4 == 3) {
            sw[i] = 0.0f;
            continue;
        }
        kept.x.insert(kept.x.end(), a.x.begin() + std::ptrdiff_t(i * 4), a.x.begin() + std::ptrdiff_t(i * 4 + 4));
        kept.y.push_back(a.y[i]);
    }
    REQUIRE(kept.y.size() == 18);
    using M = strata::Model<Small, strata::distribute::Default, double>;
    M zeros(2), fewer(2), dropped(2);
    zeros.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.4});
    fewer.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.4 * 18.0 / 24.0});
    dropped.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.4});
    const auto weighted = strata::data::from_arrays(a.x, {4}, a.y, sw).batch(24);
    const auto hz = zeros.fit(weighted, {.epochs = 3, .verbose = 0});
    const auto hf = fewer.fit(strata::data::from_arrays(kept.x, {4}, kept.y).batch(18), {.epochs = 3, .verbose = 0});
    dropped.fit(strata::data::from_arrays(kept.x, {4}, kept.y).batch(18), {.epochs = 3, .verbose = 0});
    CHECK(strata_test::max_relative_difference(zeros.get_weights(), fewer.get_weights()) < 1e-12);
    for (std::size_t e = 0; e < 3; ++e) CHECK(hz["loss"][e] == doctest::Approx(hf["loss"][e] * 18.0 / 24.0).epsilon(1e-12));
    // Dividing by the 18 weighted examples instead (dropping the others) would train otherwise.
    CHECK(strata_test::max_relative_difference(zeros.get_weights(), dropped.get_weights()) > 1e-6);
    // evaluate: the same rule; accuracy counts every example.
    const auto ev = zeros.evaluate(weighted);
    const auto ev_kept = zeros.evaluate(strata::data::from_arrays(kept.x, {4}, kept.y).batch(18));
    const auto ev_all = zeros.evaluate(strata::data::from_arrays(a.x, {4}, a.y).batch(24));
    CHECK(ev.loss == doctest::Approx(ev_kept.loss * 18.0 / 24.0).epsilon(1e-12));
    CHECK(ev.accuracy == ev_all.accuracy);
    CHECK(ev.examples == 24);
}

TEST_CASE("sample_weight and class_weight multiply, as in Keras (float64 reference)") {
    const Arrays a = arrays(24, 16);
    std::vector<float> sw(24);
    for (std::size_t i = 0; i < 24; ++i) sw[i] = 0.5f + 0.25f * float(i % 5);
    const std::map<std::int64_t, double> cw{{0, 3.0}, {1, 0.5}};
    strata::Model<Linear3, strata::distribute::Default, double> model(9);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.5});
    std::vector<double> w = model.get_weights(), only_class = w, only_sample = w;
    const auto h = model.fit(strata::data::from_arrays(a.x, {4}, a.y, sw).batch(24), {.epochs = 3, .verbose = 0, .class_weight = cw});
    for (std::size_t e = 0; e < 3; ++e) {
        CAPTURE(e);
        CHECK(h["loss"][e] == doctest::Approx(reference_step(w, a.x, a.y, cw, 0.5, sw)).epsilon(1e-12));
        reference_step(only_class, a.x, a.y, cw, 0.5);
        reference_step(only_sample, a.x, a.y, {}, 0.5, sw);
    }
    CHECK(strata_test::max_relative_difference(model.get_weights(), w) < 1e-12);
    CHECK(strata_test::max_relative_difference(only_class, w) > 1e-6);
    CHECK(strata_test::max_relative_difference(only_sample, w) > 1e-6);
    // The array overload combines them the same way.
    strata::Model<Linear3, strata::distribute::Default, double> arrays_model(9);
    arrays_model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.5});
    arrays_model.fit(a.x, a.y, {.epochs = 3, .verbose = 0, .batch_size = 24, .shuffle = false, .class_weight = cw, .sample_weight = sw});
    CHECK(strata_test::max_relative_difference(arrays_model.get_weights(), w) < 1e-12);
}

TEST_CASE("sample_weight: Mirrored, CentralStorage and ParameterServer weigh as one device does on the same global batches") {
    const std::size_t n = 45;
    const Arrays a = arrays(n, 17);
    std::vector<float> sw(n);
    for (std::size_t i = 0; i < n; ++i) sw[i] = 0.25f * float((i * 5) % 9);   // zeros included
    const auto data = strata::data::from_arrays(a.x, {4}, a.y, sw).shuffle(n, 5);
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.3, .momentum = 0.9};
    auto train = [&](auto& strategy, std::size_t batch) {
        strata::Model<Small, std::remove_reference_t<decltype(strategy)>, double> m(strategy, 4);
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        const auto h = m.fit(data.batch(batch), {.epochs = 2, .verbose = 0});
        return std::pair{h["loss"], m.get_weights()};
    };
    strata::distribute::OneDevice<> one;
    const auto [loss, reference] = train(one, 7);   // 7: splits unevenly over 2 and 3 replicas
    for (int r : {2, 3}) {
        CAPTURE(r);
        strata::distribute::Mirrored<> mirrored(r);
        const auto [lm, wm] = train(mirrored, 7);
        CHECK(strata_test::max_relative_difference(wm, reference) < 1e-12);
        CHECK(strata_test::max_relative_difference(lm, loss) < 1e-12);
        strata::distribute::CentralStorage<> central(r);
        const auto [lc, wc] = train(central, 7);
        CHECK(strata_test::max_relative_difference(wc, reference) < 1e-12);
        CHECK(strata_test::max_relative_difference(lc, loss) < 1e-12);
    }
    // ParameterServer, Synchronous: 3 workers' mini-batches of 5 make one update, as one device
    // makes one step on the 15 examples; the workers' weights come with their mini-batches.
    strata::distribute::ParameterServer<strata::place::Host, strata::sync::Synchronous> ps(3, 2);
    const auto [lp, wp] = train(ps, 5);
    const auto [l15, w15] = train(one, 15);
    CHECK(strata_test::max_relative_difference(wp, w15) < 1e-12);
    CHECK(strata_test::max_relative_difference(lp, l15) < 1e-12);
    // Unweighted, one device trains otherwise: the equalities above saw the weights.
    strata::Model<Small, strata::distribute::OneDevice<>, double> plain(one, 4);
    plain.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    plain.fit(strata::data::from_arrays(a.x, {4}, a.y).shuffle(n, 5).batch(7), {.epochs = 2, .verbose = 0});
    CHECK(strata_test::max_relative_difference(plain.get_weights(), reference) > 1e-6);
}

TEST_CASE("validation_split holds out the last examples with their weights: val_loss is weighted (by hand)") {
    const std::size_t n = 50;
    const Arrays all = arrays(n, 18);
    std::vector<float> sw(n);
    for (std::size_t i = 0; i < n; ++i) sw[i] = 0.25f * float(i % 7);   // the held-out 10 weigh 0 to 1.5
    strata::Model<Small> with_split(5);
    compile(with_split);
    const auto h = with_split.fit(all.x, all.y, {.epochs = 3, .verbose = 0, .batch_size = 8, .validation_split = 0.2, .sample_weight = sw});

    // By hand: the first 40 examples with their weights train, the last 10 with theirs validate.
    const std::size_t split_at = 40;
    std::vector<float> tx(all.x.begin(), all.x.begin() + split_at * 4), vx(all.x.begin() + split_at * 4, all.x.end());
    std::vector<std::int32_t> ty(all.y.begin(), all.y.begin() + split_at), vy(all.y.begin() + split_at, all.y.end());
    std::vector<float> tw(sw.begin(), sw.begin() + split_at), vw(sw.begin() + split_at, sw.end());
    strata::Model<Small> by_hand(5);
    compile(by_hand);
    const auto r = by_hand.fit(tx, ty, {.epochs = 3, .validation_data = strata::data::from_arrays(vx, {4}, vy, vw).batch(8),
                                        .verbose = 0, .batch_size = 8, .sample_weight = tw});
    CHECK(with_split.get_weights() == by_hand.get_weights());
    CHECK(h["loss"] == r["loss"]);
    CHECK(h["val_loss"] == r["val_loss"]);
    CHECK(h["val_accuracy"] == r["val_accuracy"]);

    // The last val_loss, computed from the model's predictions: Σ w_i · −log p_i(y_i) / 10;
    // val_accuracy counts every held-out example alike.
    const auto p = with_split.predict(vx);
    const double ref = weighted_cross_entropy(p, vy, vw);
    CHECK(h["val_loss"].back() == doctest::Approx(ref).epsilon(1e-5));
    CHECK(std::abs(ref - weighted_cross_entropy(p, vy, std::vector<float>(10, 1.0f))) > 1e-3);
    CHECK(h["val_accuracy"].back() == doctest::Approx(accuracy_of(p, vy)).epsilon(1e-12));
}

TEST_CASE("evaluate on a weighted dataset weighs the loss, not the accuracy; Mirrored agrees") {
    const std::size_t n = 37;
    const Arrays a = arrays(n, 19);
    std::vector<float> sw(n);
    for (std::size_t i = 0; i < n; ++i) sw[i] = 0.2f * float((i * 3) % 8);
    strata::Model<Small> model(8);
    compile(model);
    model.fit(a.x, a.y, {.epochs = 2, .verbose = 0, .batch_size = 8});
    const auto weighted = strata::data::from_arrays(a.x, {4}, a.y, sw).batch(10);
    const auto ev = model.evaluate(weighted);
    const auto plain = model.evaluate(strata::data::from_arrays(a.x, {4}, a.y).batch(10));
    const auto p = model.predict(a.x);
    CHECK(ev.loss == doctest::Approx(weighted_cross_entropy(p, a.y, sw)).epsilon(1e-5));
    CHECK(std::abs(ev.loss - plain.loss) > 1e-3);
    CHECK(ev.accuracy == plain.accuracy);
    CHECK(ev.accuracy == doctest::Approx(accuracy_of(p, a.y)).epsilon(1e-12));
    CHECK(ev.examples == std::int64_t(n));

    strata::distribute::Mirrored<> strategy(2);
    strata::Model<Small, strata::distribute::Mirrored<>> mirrored(strategy, 8);
    mirrored.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    mirrored.set_weights(model.get_weights());
    const auto em = mirrored.evaluate(weighted);
    CHECK(em.loss == doctest::Approx(ev.loss).epsilon(1e-6));
    CHECK(em.accuracy == ev.accuracy);
}

TEST_CASE("sample_weight: errors") {
    const Arrays a = arrays(10, 20);
    strata::Model<Small> m(1);
    compile(m);
    {   // Keras: sample_weight is not supported with a dataset; the dataset carries them.
        auto ds = strata::data::from_arrays(a.x, {4}, a.y).batch(5);
        const auto msg = error_of<strata::ValueError>([&] { m.fit(ds, {.verbose = 0, .sample_weight = std::vector<float>(10, 1.0f)}); });
        CHECK(has(msg, "fit: options.sample_weight (10 weights) is for the array overload"));
        CHECK(has(msg, "from_arrays(x, shape, y, sample_weight)"));
        auto weighted = strata::data::from_arrays(a.x, {4}, a.y, std::vector<float>(10, 1.0f)).batch(5);
        CHECK_THROWS_AS(m.fit(weighted, {.verbose = 0, .sample_weight = std::vector<float>(10, 1.0f)}), strata::ValueError);
        CHECK_NOTHROW(m.fit(weighted, {.verbose = 0}));
    }
    const auto count = error_of<strata::ShapeError>([&] { m.fit(a.x, a.y, {.verbose = 0, .sample_weight = std::vector<float>(9, 1.0f)}); });
    CHECK(has(count, "fit: x holds 10 examples, so options.sample_weight must hold 10 weights (one per example) or none, but it holds 9"));
    std::vector<float> bad(10, 1.0f);
    bad[9] = -1.0f;   // in the held-out part: the index named is still the caller's
    const auto negative = error_of<strata::ValueError>([&] { m.fit(a.x, a.y, {.verbose = 0, .validation_split = 0.3, .sample_weight = bad}); });
    CHECK(has(negative, "fit: options.sample_weight[9] is -1; sample weights must be finite and >= 0"));
    bad[9] = std::numeric_limits<float>::quiet_NaN();
    CHECK(has(error_of<strata::ValueError>([&] { m.fit(a.x, a.y, {.verbose = 0, .sample_weight = bad}); }), "sample_weight[9] is nan"));
}

// ---- metrics beyond accuracy -------------------------------------------------------------------
namespace {

// The reference, from predict's outputs: tf.math.in_top_k (ties at the boundary count as in).
double top_k_reference(const strata::Tensor<float>& p, const std::vector<std::int32_t>& y, int k) {
    std::int64_t in = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
        int higher = 0;
        for (std::int64_t c = 0; c < p.dim(1); ++c) higher += p.at(std::int64_t(i), c) > p.at(std::int64_t(i), y[i]) ? 1 : 0;
        in += higher < k;
    }
    return double(in) / double(y.size());
}

}  // namespace

TEST_CASE("sparse_top_k_categorical_accuracy(k): evaluate and fit against a reference from predict") {
    const Arrays a = arrays(50, 12);
    auto ds = strata::data::from_arrays(a.x, {4}, a.y).batch(50);
    strata::Model<Small> model(2);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.2},
                  {"accuracy", strata::metrics::sparse_top_k_categorical_accuracy(2)});
    const auto before = model.evaluate(ds);
    const auto p = model.predict(ds);
    REQUIRE(before.metrics.count("sparse_top_k_categorical_accuracy") == 1);
    CHECK(before.metrics.at("sparse_top_k_categorical_accuracy") == top_k_reference(p, a.y, 2));
    CHECK(top_k_reference(p, a.y, 2) > before.accuracy);   // the figure is not accuracy in disguise
    // One full batch per epoch: the epoch's training figure is that of the weights before its step.
    const auto h = model.fit(ds, {.epochs = 2, .validation_data = ds, .verbose = 0});
    CHECK(h["sparse_top_k_categorical_accuracy"][0] == before.metrics.at("sparse_top_k_categorical_accuracy"));
    CHECK(h["val_sparse_top_k_categorical_accuracy"][1] == top_k_reference(model.predict(ds), a.y, 2));
    // k = 1 is accuracy; k = classes is 1.
    strata::Model<Small> m1(2), m3(2);
    m1.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{}, {"accuracy", strata::metrics::sparse_top_k_categorical_accuracy(1)});
    m3.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{}, {strata::metrics::sparse_top_k_categorical_accuracy(3)});
    const auto e1 = m1.evaluate(ds);
    CHECK(e1.metrics.at("sparse_top_k_categorical_accuracy") == e1.accuracy);
    CHECK(m3.evaluate(ds).metrics.at("sparse_top_k_categorical_accuracy") == 1.0);
    // The string alone means Keras's default k = 5.
    CHECK(strata::metrics::Metric("sparse_top_k_categorical_accuracy").k == 5);
}

TEST_CASE("precision and recall of one binary output, against a reference; Mirrored agrees") {
    using Bin = Sequential<Input<4>, Dense<6, Tanh>, Dense<1, Sigmoid>>;
    const Arrays a = arrays(64, 21);
    std::vector<float> y(a.y.size());
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = a.y[i] == 2 ? 1.0f : 0.0f;
    auto ds = strata::data::Dataset<float>::from_arrays(a.x, {4}, y).batch(16);
    auto reference = [&](const strata::Tensor<float>& p) {
        double tp = 0, fp = 0, fn = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            const bool pos = p.at(std::int64_t(i), 0) > 0.5f, t = y[i] > 0.5f;
            tp += pos && t;
            fp += pos && !t;
            fn += !pos && t;
        }
        return std::pair{tp + fp > 0 ? tp / (tp + fp) : 0.0, tp + fn > 0 ? tp / (tp + fn) : 0.0};
    };
    strata::Model<Bin> model(9);
    model.compile(strata::loss::MeanSquaredError{}, strata::optim::Adam{.learning_rate = 0.05}, {"accuracy", "precision", "recall"});
    const auto h = model.fit(ds, {.epochs = 5, .validation_data = ds, .verbose = 0});
    const auto [prec, rec] = reference(model.predict(ds));
    const auto ev = model.evaluate(ds);
    CAPTURE(prec);
    CAPTURE(rec);
    CHECK(prec > 0.0);
    CHECK(rec > 0.0);
    CHECK(ev.metrics.at("precision") == doctest::Approx(prec).epsilon(1e-15));
    CHECK(ev.metrics.at("recall") == doctest::Approx(rec).epsilon(1e-15));
    CHECK(h["val_precision"].back() == ev.metrics.at("precision"));
    CHECK(h["val_recall"].back() == ev.metrics.at("recall"));
    CHECK(h["precision"].size() == 5);
    CHECK(h["recall"].size() == 5);

    // Two replicas count their shares; the ratio is over the summed counts.
    strata::distribute::Mirrored<> strategy(2);
    strata::Model<Bin, strata::distribute::Mirrored<>> mirrored(strategy, 9);
    mirrored.compile(strata::loss::MeanSquaredError{}, strata::optim::Adam{.learning_rate = 0.05}, {"precision", "recall"});
    mirrored.set_weights(model.get_weights());
    const auto em = mirrored.evaluate(ds);
    const auto [mp, mr] = reference(mirrored.predict(ds));
    CHECK(em.metrics.at("precision") == doctest::Approx(mp).epsilon(1e-15));
    CHECK(em.metrics.at("recall") == doctest::Approx(mr).epsilon(1e-15));
}

TEST_CASE("metrics: misuse is a ValueError that names the metric") {
    strata::Model<Small> m(1);
    auto msg = error_of<strata::ValueError>([&] { m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{}, {"precision"}); });
    CHECK(has(msg, "precision is for one binary output"));
    msg = error_of<strata::ValueError>([&] {
        m.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{}, {"sparse_top_k_categorical_accuracy"});
    });
    CHECK(has(msg, "needs class ids"));
    msg = error_of<strata::ValueError>([&] {
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{}, {strata::metrics::sparse_top_k_categorical_accuracy(0)});
    });
    CHECK(has(msg, "k must be >= 1"));
    msg = error_of<strata::ValueError>([&] { m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{}, {"auc"}); });
    CHECK(has(msg, "unknown metric 'auc'"));
    // Without "accuracy" in the list, there is no accuracy figure.
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{}, {strata::metrics::sparse_top_k_categorical_accuracy(2)});
    const Arrays a = arrays(8, 1);
    const auto h = m.fit(strata::data::from_arrays(a.x, {4}, a.y).batch(4), {.verbose = 0});
    CHECK(h.history.count("accuracy") == 0);
    CHECK(h.history.count("sparse_top_k_categorical_accuracy") == 1);
}
