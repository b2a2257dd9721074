// Keras's fit options beyond epochs and batches: validation_split (the last fraction of the
// arrays, taken before shuffling, validates), checked against fitting on the two parts by hand;
// class_weight, checked against a float64 reference of the weighted loss and its gradient.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <algorithm>
#include <vector>

#include <strata/strata.hpp>

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
// Returns the loss before the step; `w` (kernel [4, 3] then bias [3]) is updated in place.
double reference_step(std::vector<double>& w, const std::vector<float>& x, const std::vector<std::int32_t>& y,
                      const std::map<std::int64_t, double>& class_weight, double lr) {
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
        const double cw = it == class_weight.end() ? 1.0 : it->second;
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
