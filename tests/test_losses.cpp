// The losses' values and gradients against finite differences, and a user-defined loss
// (examples/huber.hpp) checked like the built-in ones.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "test_util.hpp"

#include "../examples/huber.hpp"

using strata_test::lcg;
using namespace strata::nn;

TEST_CASE("losses: values and gradients against finite differences") {
    using T = double;
    const std::int64_t n = 5, c = 4;
    auto pv = lcg(std::size_t(n * c), 3, -3, 3);
    auto pred = strata::from_vector<T>(pv, {n, c});
    std::vector<T> labels{0, 3, 1, 2, 3};
    auto sparse = strata::from_vector<T>(labels, {n});
    auto tv = lcg(std::size_t(n * c), 4, 0, 1);
    auto dense_t = strata::from_vector<T>(tv, {n, c});
    // Probabilities for the non-logit paths.
    strata::Tensor<T> probs({n, c});
    strata::softmax(pred.view(), probs.view());

    struct Case { strata::loss::Loss loss; strata::loss::Input input; bool use_probs; bool sparse_t; };
    const Case cases[] = {
        {strata::loss::SparseCategoricalCrossentropy{}, strata::loss::Input::Logits, false, true},
        {strata::loss::SparseCategoricalCrossentropy{}, strata::loss::Input::Probabilities, true, true},
        {strata::loss::CategoricalCrossentropy{}, strata::loss::Input::Logits, false, false},
        {strata::loss::CategoricalCrossentropy{}, strata::loss::Input::Probabilities, true, false},
        {strata::loss::MeanSquaredError{}, strata::loss::Input::Probabilities, false, false},
    };
    for (const auto& k : cases) {
        strata::Tensor<T> x = k.use_probs ? probs.clone() : pred.clone();
        const auto& target = k.sparse_t ? sparse : dense_t;
        strata::Tensor<T> grad({n, c}), scratch({n, c});
        const double denom = 7.0;
        const double l = strata::loss::loss_and_grad(k.loss, x.view(), target.view(), grad.view(), denom, k.input);
        CHECK(std::isfinite(l));
        const double h = 1e-6;
        for (std::int64_t i = 0; i < n * c; ++i) {
            const T keep = x[i];
            x[i] = keep + h;
            const double lp = strata::loss::loss_and_grad(k.loss, x.view(), target.view(), scratch.view(), denom, k.input);
            x[i] = keep - h;
            const double lm = strata::loss::loss_and_grad(k.loss, x.view(), target.view(), scratch.view(), denom, k.input);
            x[i] = keep;
            CHECK(grad[i] == doctest::Approx((lp - lm) / (2 * h) / denom).epsilon(1e-6));
        }
    }
    // Reference values: sparse CE from logits is log-sum-exp minus the label's logit.
    strata::Tensor<T> grad({n, c});
    const double l = strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::SparseCategoricalCrossentropy{}}, pred.view(),
                                                 sparse.view(), grad.view(), 1.0, strata::loss::Input::Logits);
    double ref = 0;
    for (std::int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (std::int64_t j = 0; j < c; ++j) s += std::exp(pv[std::size_t(r * c + j)]);
        ref += std::log(s) - pv[std::size_t(r * c + std::int64_t(labels[std::size_t(r)]))];
    }
    CHECK(l == doctest::Approx(ref).epsilon(1e-12));
    // Stable for huge logits.
    auto big = strata::from_vector<T>({1000.0, -1000.0, 0.0}, {1, 3});
    auto lab = strata::from_vector<T>({1.0}, {1});
    strata::Tensor<T> g3({1, 3});
    const double lb = strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::SparseCategoricalCrossentropy{}}, big.view(),
                                                  lab.view(), g3.view(), 1.0, strata::loss::Input::Logits);
    CHECK(lb == doctest::Approx(2000.0));
    CHECK(g3[0] == doctest::Approx(1.0));
    CHECK(g3[1] == doctest::Approx(-1.0));
}

TEST_CASE("a user-defined loss (examples/huber.hpp): gradient against finite differences, errors, training") {
    using T = double;
    const std::int64_t n = 6, c = 3;
    const double delta = 1.0;
    // Differences on both sides of ±delta, none within 1e-3 of a kink (±delta).
    auto pv = lcg(std::size_t(n * c), 21, -3, 3);
    auto tv = lcg(std::size_t(n * c), 22, -1, 1);
    for (std::size_t i = 0; i < pv.size(); ++i)
        if (std::abs(std::abs(pv[i] - tv[i]) - delta) < 1e-3) pv[i] += 0.01;
    int quadratic = 0, linear = 0;
    for (std::size_t i = 0; i < pv.size(); ++i) (std::abs(pv[i] - tv[i]) <= delta ? quadratic : linear) += 1;
    REQUIRE(quadratic > 0);
    REQUIRE(linear > 0);
    auto pred = strata::from_vector<T>(pv, {n, c});
    auto target = strata::from_vector<T>(tv, {n, c});
    const strata::loss::Loss huber = example::huber(delta);
    CHECK(std::string(strata::loss::name(huber)) == "huber");
    CHECK(strata::loss::input_kind(huber, true) == strata::loss::Input::Probabilities);
    CHECK_FALSE(strata::loss::sparse_targets(huber));
    strata::Tensor<T> grad({n, c}), scratch({n, c});
    const double denom = 7.0;
    const double l = strata::loss::loss_and_grad(huber, pred.view(), target.view(), grad.view(), denom, strata::loss::Input::Probabilities);
    double ref = 0;  // Keras's Huber by hand
    for (std::size_t i = 0; i < pv.size(); ++i) {
        const double d = std::abs(pv[i] - tv[i]);
        ref += (d <= delta ? 0.5 * d * d : delta * (d - 0.5 * delta)) / double(c);
    }
    CHECK(l == doctest::Approx(ref).epsilon(1e-12));
    const double h = 1e-6;
    bool nonzero = false;
    for (std::int64_t i = 0; i < n * c; ++i) {
        const T keep = pred[i];
        pred[i] = keep + h;
        const double lp = strata::loss::loss_and_grad(huber, pred.view(), target.view(), scratch.view(), denom, strata::loss::Input::Probabilities);
        pred[i] = keep - h;
        const double lm = strata::loss::loss_and_grad(huber, pred.view(), target.view(), scratch.view(), denom, strata::loss::Input::Probabilities);
        pred[i] = keep;
        CHECK(grad[i] == doctest::Approx((lp - lm) / (2 * h) / denom).epsilon(1e-7));
        nonzero = nonzero || grad[i] != 0;
    }
    CHECK(nonzero);

    // Typed errors name the loss and what is wrong.
    strata::Tensor<T> short_target({n, c - 1});
    CHECK_THROWS_WITH_AS(strata::loss::loss_and_grad(huber, pred.view(), short_target.view(), grad.view(), 1.0,
                                                     strata::loss::Input::Probabilities),
                         doctest::Contains("loss::Custom 'huber': predictions (6, 3) and targets (6, 2) differ"), strata::ShapeError);
    const strata::loss::Loss half = strata::loss::Custom{.name = "half", .loss = [](auto, auto) { return 0.0; }, .gradient = {}};
    CHECK_THROWS_WITH_AS(strata::loss::loss_and_grad(half, pred.view(), target.view(), grad.view(), 1.0,
                                                     strata::loss::Input::Probabilities),
                         doctest::Contains("'half': both functions are needed, got a loss and no gradient"), strata::ValueError);

    // A Custom that restates MSE trains exactly as the built-in MSE, on one device and on two replicas.
    const strata::loss::Custom my_mse{
        .name = "my_mse",
        .loss = [](std::span<const double> p, std::span<const double> t) {
            double s = 0;
            for (std::size_t i = 0; i < p.size(); ++i) s += (p[i] - t[i]) * (p[i] - t[i]);
            return s / double(p.size());
        },
        .gradient = [](std::span<const double> p, std::span<const double> t, std::span<double> g) {
            for (std::size_t i = 0; i < p.size(); ++i) g[i] = 2 * (p[i] - t[i]) / double(p.size());
        }};
    using Lin = Sequential<Input<2>, Dense<8, Tanh>, Dense<2>>;
    auto xs = lcg(2 * 200, 23);
    std::vector<float> x(xs.begin(), xs.end()), y(x.size());
    for (std::size_t i = 0; i < x.size(); i += 2) {
        y[i] = float(std::sin(x[i]) + 0.5 * x[i + 1]);
        y[i + 1] = float(x[i] * x[i + 1]);
    }
    auto ds = strata::data::Dataset<float>::from_arrays(x, {2}, y, 2).batch(25);
    auto train = [&](const strata::loss::Loss& loss) {
        strata::Model<Lin, strata::distribute::Default, double> model(5);
        model.compile(loss, strata::optim::Adam{.learning_rate = 0.01}, {});
        const auto hist = model.fit(ds, {.epochs = 20, .verbose = 0});
        return std::pair{hist["loss"], model.get_weights()};
    };
    const auto [builtin_loss, builtin_w] = train(strata::loss::MeanSquaredError{});
    const auto [custom_loss, custom_w] = train(my_mse);
    REQUIRE(custom_loss.size() == 20);
    CHECK(custom_loss.back() < custom_loss.front() / 3);  // it learns
    for (std::size_t e = 0; e < custom_loss.size(); ++e) CHECK(custom_loss[e] == doctest::Approx(builtin_loss[e]).epsilon(1e-9));
    for (std::size_t i = 0; i < custom_w.size(); ++i) CHECK(custom_w[i] == doctest::Approx(builtin_w[i]).epsilon(1e-9));

    strata::distribute::Mirrored<> strategy(2);
    strata::Model<Lin, strata::distribute::Mirrored<>> mirrored(strategy, 5);
    mirrored.compile(example::huber(0.5), strata::optim::Adam{.learning_rate = 0.01}, {});
    const auto mh = mirrored.fit(ds, {.epochs = 20, .verbose = 0});
    CHECK(mh["loss"].back() < mh["loss"].front() / 3);
}

namespace {
// The float64 references of the per-token losses on pred [n, K, C] against dense targets of its
// shape, each token weighed by w (1 without weights): Σ over the examples of Σ_k w_k·loss_k / K.
double cce_reference(const std::vector<double>& z, const std::vector<double>& t, const std::vector<double>& w, std::int64_t n,
                     std::int64_t K, std::int64_t C, bool logits) {
    double total = 0;
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t k = 0; k < K; ++k) {
            const double wk = w[std::size_t(r * K + k)];
            if (wk == 0) continue;
            const std::size_t o = std::size_t((r * K + k) * C);
            double loss = 0;
            if (logits) {
                double m = z[o];
                for (std::int64_t c = 1; c < C; ++c) m = std::max(m, z[o + std::size_t(c)]);
                double s = 0;
                for (std::int64_t c = 0; c < C; ++c) s += std::exp(z[o + std::size_t(c)] - m);
                for (std::int64_t c = 0; c < C; ++c) loss += t[o + std::size_t(c)] * (m + std::log(s) - z[o + std::size_t(c)]);
            } else {
                double s = 0;
                for (std::int64_t c = 0; c < C; ++c) s += z[o + std::size_t(c)];
                for (std::int64_t c = 0; c < C; ++c) loss -= t[o + std::size_t(c)] * std::log(z[o + std::size_t(c)] / s);
            }
            total += wk * loss / double(K);
        }
    return total;
}
double mse_reference(const std::vector<double>& p, const std::vector<double>& t, const std::vector<double>& w, std::int64_t n,
                     std::int64_t K, std::int64_t C) {
    double total = 0;
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t k = 0; k < K; ++k) {
            const double wk = w[std::size_t(r * K + k)];
            if (wk == 0) continue;
            double s = 0;
            for (std::int64_t c = 0; c < C; ++c) {
                const std::size_t i = std::size_t((r * K + k) * C + c);
                s += (p[i] - t[i]) * (p[i] - t[i]);
            }
            total += wk * s / double(C) / double(K);
        }
    return total;
}
}  // namespace

TEST_CASE("CategoricalCrossentropy and MeanSquaredError on [n, K, C]: along the last axis, token weights, a float64 "
          "reference and finite differences") {
    using T = double;
    const std::int64_t n = 3, K = 4, C = 5;
    const auto z = lcg(std::size_t(n * K * C), 31, -2, 2);
    std::vector<double> probs(z.size()), soft(z.size());
    const auto u = lcg(z.size(), 32, 0.05, 1);
    for (std::int64_t row = 0; row < n * K; ++row) {  // each token's probabilities and soft target sum to 1
        double s = 0, su = 0;
        for (std::int64_t c = 0; c < C; ++c) s += std::exp(z[std::size_t(row * C + c)]), su += u[std::size_t(row * C + c)];
        for (std::int64_t c = 0; c < C; ++c) {
            probs[std::size_t(row * C + c)] = std::exp(z[std::size_t(row * C + c)]) / s;
            soft[std::size_t(row * C + c)] = u[std::size_t(row * C + c)] / su;
        }
    }
    // Weights: two tokens left out (0), the others 0.5, 1 or 2.5; the left-out tokens' targets NaN
    // (never read).
    std::vector<double> w(std::size_t(n * K)), ones(std::size_t(n * K), 1.0);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = i == 2 || i == 7 ? 0.0 : (i % 3 == 0 ? 0.5 : i % 3 == 1 ? 1.0 : 2.5);
    std::vector<double> holes = soft;
    for (std::size_t i : {2u, 7u})
        for (std::int64_t c = 0; c < C; ++c) holes[i * std::size_t(C) + std::size_t(c)] = std::nan("");
    const auto tw = strata::from_vector<T>(w, {n * K});

    struct Case { strata::loss::Loss loss; strata::loss::Input input; bool probs; bool mse; };
    const Case cases[] = {
        {strata::loss::CategoricalCrossentropy{}, strata::loss::Input::Logits, false, false},
        {strata::loss::CategoricalCrossentropy{}, strata::loss::Input::Probabilities, true, false},
        {strata::loss::MeanSquaredError{}, strata::loss::Input::Probabilities, false, true},
    };
    for (const auto& k : cases) {
        for (const bool weighed : {false, true}) {
            const std::string what = std::string(strata::loss::name(k.loss)) + (k.probs ? " from probabilities" : "") +
                                     (weighed ? ", token weights" : "");
            INFO(what);
            const auto& pv = k.probs ? probs : z;
            auto x = strata::from_vector<T>(pv, {n, K, C});
            auto target = strata::from_vector<T>(weighed ? holes : soft, {n, K, C});
            const T* token_weights = weighed ? tw.data() : nullptr;
            strata::Tensor<T> grad({n, K, C}), scratch({n, K, C});
            const double denom = 7.0;
            const double l = strata::loss::loss_and_grad(k.loss, x.view(), target.view(), grad.view(), denom, k.input, static_cast<const T*>(nullptr),
                                                         token_weights);
            const auto& wr = weighed ? w : ones;
            const double ref = k.mse ? mse_reference(pv, soft, wr, n, K, C) : cce_reference(pv, soft, wr, n, K, C, !k.probs);
            CHECK(l == doctest::Approx(ref).epsilon(1e-12));
            const double h = 1e-6;
            for (std::int64_t i = 0; i < n * K * C; ++i) {
                const T keep = x[i];
                x[i] = keep + h;
                const double lp = strata::loss::loss_and_grad(k.loss, x.view(), target.view(), scratch.view(), denom, k.input,
                                                              static_cast<const T*>(nullptr), token_weights);
                x[i] = keep - h;
                const double lm = strata::loss::loss_and_grad(k.loss, x.view(), target.view(), scratch.view(), denom, k.input,
                                                              static_cast<const T*>(nullptr), token_weights);
                x[i] = keep;
                CHECK(std::isfinite(grad[i]));
                // Relative 1e-6, or 1e-9 absolute for the smallest (central differences in float64
                // at h = 1e-6 carry about 1e-10 / denom).
                CHECK(grad[i] == doctest::Approx((lp - lm) / (2 * h) / denom).epsilon(1e-6).scale(1e-3));
                if (weighed && wr[std::size_t(i / C)] == 0) CHECK(grad[i] == 0.0);  // left out: exactly no gradient
            }
        }
    }
    // The negative control: one softmax over each example's K·C values (what a row-wise loss
    // would compute) gives another number, so the reference above tells the two apart.
    auto x = strata::from_vector<T>(z, {n, K, C});
    auto target = strata::from_vector<T>(soft, {n, K, C});
    strata::Tensor<T> grad({n, K, C});
    const double per_token = strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::CategoricalCrossentropy{}}, x.view(),
                                                         target.view(), grad.view(), 1.0, strata::loss::Input::Logits);
    auto flat = strata::from_vector<T>(z, {n, K * C});
    auto flat_target = strata::from_vector<T>(soft, {n, K * C});
    strata::Tensor<T> flat_grad({n, K * C});
    const double whole = strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::CategoricalCrossentropy{}}, flat.view(),
                                                     flat_target.view(), flat_grad.view(), 1.0, strata::loss::Input::Logits);
    CHECK(std::abs(per_token - whole) > 0.5);
    // A custom loss sees whole examples: it takes no token weights.
    const strata::loss::Loss huber = example::huber(1.0);
    CHECK_THROWS_WITH_AS(strata::loss::loss_and_grad(huber, x.view(), target.view(), grad.view(), 1.0,
                                                     strata::loss::Input::Probabilities, static_cast<const T*>(nullptr), tw.data()),
                         doctest::Contains("a custom loss takes no mask"), strata::ValueError);
}

TEST_CASE("accuracy along the last axis: categorical [n, K, C] and binary [n, K, 1] per token, with token weights; "
          "precision and recall count every token that counts") {
    using T = double;
    const std::int64_t n = 4, K = 3, C = 4;
    const auto z = lcg(std::size_t(n * K * C), 41, -1, 1);
    const auto u = lcg(std::size_t(n * K * C), 42, 0, 1);
    std::vector<double> w(std::size_t(n * K));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = i % 4 == 3 ? 0.0 : 1.0;
    const auto tw = strata::from_vector<T>(w, {n * K});
    auto argmax = [&](const std::vector<double>& v, std::size_t o) {
        std::size_t b = 0;
        for (std::size_t c = 1; c < std::size_t(C); ++c)
            if (v[o + c] > v[o + b]) b = c;
        return b;
    };
    double share = 0, right = 0;
    for (std::int64_t r = 0; r < n; ++r) {
        double rr = 0;
        for (std::int64_t k = 0; k < K; ++k) {
            const std::size_t row = std::size_t(r * K + k), o = row * std::size_t(C);
            const bool ok = argmax(z, o) == argmax(u, o);
            rr += ok ? 1 : 0;
            right += ok ? w[row] : 0;
        }
        share += rr / double(K);
    }
    auto p = strata::from_vector<T>(z, {n, K, C});
    auto t = strata::from_vector<T>(u, {n, K, C});
    const auto cat = strata::metrics::AccuracyKind::Categorical;
    CHECK(strata::metrics::count_correct(p.view(), t.view(), cat) == doctest::Approx(share).epsilon(1e-12));
    CHECK(strata::metrics::count_correct(p.view(), t.view(), cat, tw.data()) == doctest::Approx(right).epsilon(1e-12));
    // The negative control: one argmax over each example's K·C values counts something else.
    auto pf = strata::from_vector<T>(z, {n, K * C});
    auto tf = strata::from_vector<T>(u, {n, K * C});
    CHECK(strata::metrics::count_correct(pf.view(), tf.view(), cat) != doctest::Approx(share));

    // Binary [n, K, 1]: each token's output and target on the same side of 0.5; precision and
    // recall over the tokens weighed 1.
    std::vector<double> bp(std::size_t(n * K)), bt(std::size_t(n * K));
    for (std::size_t i = 0; i < bp.size(); ++i) bp[i] = 0.5 + 0.5 * z[i], bt[i] = u[i] > 0.5 ? 1.0 : 0.0;
    double bshare = 0, bright = 0;
    std::int64_t tp = 0, fp = 0, fn = 0, decided_all = 0;
    for (std::int64_t r = 0; r < n; ++r) {
        double rr = 0;
        for (std::int64_t k = 0; k < K; ++k) {
            const std::size_t i = std::size_t(r * K + k);
            const bool ok = (bp[i] > 0.5) == (bt[i] > 0.5);
            rr += ok ? 1 : 0;
            decided_all += (bp[i] > 0.5 || bt[i] > 0.5) ? 1 : 0;
            if (w[i] == 0) continue;
            bright += ok ? 1 : 0;
            tp += bp[i] > 0.5 && bt[i] > 0.5, fp += bp[i] > 0.5 && bt[i] <= 0.5, fn += bp[i] <= 0.5 && bt[i] > 0.5;
        }
        bshare += rr / double(K);
    }
    REQUIRE(tp > 0);
    REQUIRE(fp + fn > 0);
    auto bpv = strata::from_vector<T>(bp, {n, K, 1});
    auto btv = strata::from_vector<T>(bt, {n, K, 1});
    const auto bin = strata::metrics::AccuracyKind::Binary;
    CHECK(strata::metrics::count_correct(bpv.view(), btv.view(), bin) == doctest::Approx(bshare).epsilon(1e-12));
    CHECK(strata::metrics::count_correct(bpv.view(), btv.view(), bin, tw.data()) == doctest::Approx(bright).epsilon(1e-12));
    const auto counts = strata::metrics::count_binary(bpv.view(), btv.view(), tw.data());
    CHECK(counts.true_positives == tp);
    CHECK(counts.false_positives == fp);
    CHECK(counts.false_negatives == fn);
    REQUIRE(decided_all > tp + fp + fn);  // the left-out tokens hold positives: the mask must change the counts
    const auto all = strata::metrics::count_binary(bpv.view(), btv.view());
    CHECK(all.true_positives + all.false_positives + all.false_negatives == decided_all);
    // Targets that do not match the predictions value for value: a ShapeError naming both shapes.
    auto short_targets = strata::from_vector<T>(std::vector<T>(bt.begin(), bt.end() - K), {n - 1, K, 1});
    const auto msg = strata_test::error_of<strata::ShapeError>(
        [&] { (void)strata::metrics::count_binary(bpv.view(), short_targets.view()); });
    CHECK(msg.find("precision/recall: predictions of shape (" + std::to_string(n) + ", " + std::to_string(K) + ", 1)") !=
          std::string::npos);
    CHECK(msg.find("got (" + std::to_string(n - 1) + ", " + std::to_string(K) + ", 1)") != std::string::npos);
}
