// The losses' values and gradients against finite differences, and a user-defined loss
// (examples/huber.hpp) checked like the built-in ones.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
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
