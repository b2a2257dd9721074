// Training on one device: losses, optimizers (against hand-computed values), fit/evaluate/
// predict, callbacks, checkpoints, reproducibility and the allocation-free training step.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "../examples/huber.hpp"  // a user-defined loss, checked like the built-in ones

// ---- allocation counter: every operator new in this binary is counted ----------------------
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
using strata_test::lcg;

namespace {
std::atomic<long> g_allocations{0};
}
void* operator new(std::size_t n) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace strata::nn;
namespace fs = std::filesystem;

namespace {


// A small classification problem: 4 features, 3 classes decided by the sign of two linear forms.
strata::data::Dataset<> blobs(std::size_t n, std::uint64_t seed) {
    auto f = lcg(n * 4, seed);
    std::vector<float> x(f.begin(), f.end());
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double a = f[i * 4] + 0.5 * f[i * 4 + 1], b = f[i * 4 + 2] - f[i * 4 + 3];
        y[i] = a > 0 ? (b > 0 ? 2 : 1) : 0;
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {4}, std::move(y));
}

using Small = Sequential<Input<4>, Dense<16, Tanh>, Dense<3, Softmax>>;

std::string temp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("strata_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

}  // namespace

TEST_CASE("SGD, momentum and Nesterov follow Keras's formulas") {
    const double lr = 0.1, mom = 0.9;
    const double g1 = 0.5, g2 = -0.25;
    auto run = [&](strata::optim::Optimizer o) {
        strata::optim::OptimizerState<double, strata::place::Host> s(o, 1);
        double w = 1.0, g = g1;
        s.apply(&w, &g);
        const double w1 = w;
        g = g2;
        s.apply(&w, &g);
        return std::pair{w1, w};
    };
    auto [p1, p2] = run(strata::optim::SGD{.learning_rate = lr});
    CHECK(p1 == doctest::Approx(1.0 - lr * g1).epsilon(1e-15));
    CHECK(p2 == doctest::Approx(1.0 - lr * g1 - lr * g2).epsilon(1e-15));
    auto [m1, m2] = run(strata::optim::SGD{.learning_rate = lr, .momentum = mom});
    const double v1 = -lr * g1, v2 = mom * v1 - lr * g2;
    CHECK(m1 == doctest::Approx(1.0 + v1).epsilon(1e-15));
    CHECK(m2 == doctest::Approx(1.0 + v1 + v2).epsilon(1e-15));
    auto [n1, n2] = run(strata::optim::SGD{.learning_rate = lr, .momentum = mom, .nesterov = true});
    CHECK(n1 == doctest::Approx(1.0 + mom * v1 - lr * g1).epsilon(1e-15));
    CHECK(n2 == doctest::Approx(n1 + mom * v2 - lr * g2).epsilon(1e-15));
}

TEST_CASE("RMSprop and Adam follow Keras's formulas") {
    const double g1 = 0.3, g2 = -0.7;
    {
        strata::optim::OptimizerState<double, strata::place::Host> s(strata::optim::RMSprop{.learning_rate = 0.01}, 1);
        double w = 2.0, g = g1;
        s.apply(&w, &g);
        const double va = 0.1 * g1 * g1;
        const double w1 = 2.0 - 0.01 * g1 / std::sqrt(va + 1e-7);
        CHECK(w == doctest::Approx(w1).epsilon(1e-14));
        g = g2;
        s.apply(&w, &g);
        const double vb = 0.9 * va + 0.1 * g2 * g2;
        CHECK(w == doctest::Approx(w1 - 0.01 * g2 / std::sqrt(vb + 1e-7)).epsilon(1e-14));
    }
    {
        strata::optim::OptimizerState<double, strata::place::Host> s(strata::optim::RMSprop{.learning_rate = 0.01, .momentum = 0.5, .centered = true}, 1);
        double w = 2.0, g = g1;
        s.apply(&w, &g);
        const double v = 0.1 * g1 * g1, a = 0.1 * g1;
        const double step = 0.01 * g1 / std::sqrt(v - a * a + 1e-7);
        CHECK(w == doctest::Approx(2.0 - step).epsilon(1e-14));
    }
    {
        strata::optim::OptimizerState<double, strata::place::Host> s(strata::optim::Adam{.learning_rate = 0.01}, 1);
        double w = 1.0, g = g1;
        s.apply(&w, &g);
        double m = 0.1 * g1, v = 0.001 * g1 * g1;
        double alpha = 0.01 * std::sqrt(1 - 0.999) / (1 - 0.9);
        const double w1 = 1.0 - alpha * m / (std::sqrt(v) + 1e-7);
        CHECK(w == doctest::Approx(w1).epsilon(1e-14));
        g = g2;
        s.apply(&w, &g);
        m = m + (g2 - m) * 0.1;
        v = v + (g2 * g2 - v) * 0.001;
        alpha = 0.01 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
        CHECK(w == doctest::Approx(w1 - alpha * m / (std::sqrt(v) + 1e-7)).epsilon(1e-14));
        CHECK(s.iterations() == 2);
    }
}

namespace {
// Applies `o` twice to n parameters on the host through OptimizerState (its blocked, vectorised
// loops; elements [first, n) via apply_range) and once more per element through the functors of
// optim/optimizers.hpp (the per-element definitions the device runs): the two must agree bit for bit.
template <class T>
void check_host_update_matches_functors(const strata::optim::Optimizer& o, std::int64_t n, std::int64_t first) {
    namespace so = strata::optim;
    std::vector<T> w(static_cast<std::size_t>(n)), g1(w.size()), g2(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
        w[i] = T(std::sin(0.37 * double(i)));
        g1[i] = T(std::cos(0.11 * double(i)) * 0.3);
        g2[i] = T(std::sin(0.07 * double(i) + 1) * 0.2);
    }
    so::OptimizerState<T, strata::place::Host> state(o, n);
    std::vector<T> ws = w;
    state.apply_range(ws.data(), g1.data(), first, n - first);
    state.advance();
    state.apply_range(ws.data(), g2.data(), first, n - first);
    // The reference: the functors, one element at a time, with the state's own slots zeroed.
    std::vector<T> wr = w, s0(w.size(), T(0)), s1(w.size(), T(0)), s2(w.size(), T(0));
    for (int it = 0; it < 2; ++it) {
        const std::vector<T>& g = it == 0 ? g1 : g2;
        const double lr = std::visit([&](const auto& c) { return c.learning_rate(it); }, o);
        std::visit(
            [&](const auto& c) {
                using C = std::decay_t<decltype(c)>;
                for (std::int64_t i = first; i < n; ++i) {
                    if constexpr (std::is_same_v<C, so::SGD>) {
                        so::detail::SgdStep<T>{wr.data(), g.data(), c.momentum > 0 ? s0.data() : nullptr, T(lr), T(c.momentum),
                                               c.nesterov}(i);
                    } else if constexpr (std::is_same_v<C, so::RMSprop>) {
                        so::detail::RmsStep<T>{wr.data(), g.data(), s0.data(), c.centered ? s1.data() : nullptr,
                                               c.momentum > 0 ? s2.data() : nullptr, T(lr), T(c.rho), T(c.momentum), T(c.epsilon)}(i);
                    } else {
                        const double t = double(it + 1);
                        const double alpha = lr * std::sqrt(1 - std::pow(c.beta_2, t)) / (1 - std::pow(c.beta_1, t));
                        so::detail::AdamStep<T>{wr.data(), g.data(), s0.data(), s1.data(), T(alpha), T(c.beta_1), T(c.beta_2),
                                                T(c.epsilon)}(i);
                    }
                }
            },
            o);
    }
    CHECK(ws == wr);
    CHECK(std::equal(ws.begin(), ws.begin() + first, w.begin()));  // outside the range: untouched
}
}  // namespace

TEST_CASE("the host optimizer loops equal the per-element formulas bit for bit, on any thread count") {
    // OptimizerState runs blocks of 1024 elements with the slots chosen per block and the
    // square roots vectorised; 40 blocks are shared by the team. 40·1024 + 7 elements, from
    // element 5: a partial first and last block, and a remainder below the vector width.
    namespace so = strata::optim;
    const std::vector<so::Optimizer> configs = {
        so::SGD{.learning_rate = 0.1},
        so::SGD{.learning_rate = 0.1, .momentum = 0.9},
        so::SGD{.learning_rate = 0.1, .momentum = 0.9, .nesterov = true},
        so::RMSprop{.learning_rate = 0.01},
        so::RMSprop{.learning_rate = 0.01, .momentum = 0.5, .centered = true},
        so::RMSprop{.learning_rate = 0.01, .centered = true},
        so::Adam{.learning_rate = 0.01},
    };
    const int before = strata::num_threads();
    for (int threads : {1, 2, 3}) {
        strata::set_num_threads(threads);
        for (std::size_t c = 0; c < configs.size(); ++c) {
            INFO("optimizer ", c, ", threads ", threads);
            check_host_update_matches_functors<float>(configs[c], 40 * 1024 + 7, 5);
            check_host_update_matches_functors<double>(configs[c], 40 * 1024 + 7, 5);
            check_host_update_matches_functors<float>(configs[c], 3, 0);
        }
    }
    strata::set_num_threads(before);
}

TEST_CASE("learning-rate schedules") {
    strata::optim::ExponentialDecay e{.initial_learning_rate = 0.1, .decay_steps = 10, .decay_rate = 0.5};
    CHECK(e(0) == doctest::Approx(0.1));
    CHECK(e(10) == doctest::Approx(0.05));
    CHECK(e(5) == doctest::Approx(0.1 * std::pow(0.5, 0.5)));
    e.staircase = true;
    CHECK(e(15) == doctest::Approx(0.05));
    strata::optim::PiecewiseConstantDecay pc{{10, 20}, {1.0, 0.5, 0.1}};
    CHECK(pc(10) == 1.0);
    CHECK(pc(11) == 0.5);
    CHECK(pc(100) == 0.1);
    strata::optim::StepDecay sd{.initial_learning_rate = 1.0, .factor = 0.1, .step_size = 3};
    CHECK(sd(2) == doctest::Approx(1.0));
    CHECK(sd(3) == doctest::Approx(0.1));
    // The schedule is read at each update: SGD with a callable schedule.
    strata::optim::OptimizerState<double, strata::place::Host> s(
        strata::optim::SGD{.learning_rate = [](std::int64_t step) { return step == 0 ? 1.0 : 0.5; }}, 1);
    double w = 0, g = 1;
    s.apply(&w, &g);
    s.apply(&w, &g);
    CHECK(w == doctest::Approx(-1.5));
    CHECK_THROWS_AS((strata::optim::PiecewiseConstantDecay{{1}, {1.0}}(0)), strata::ValueError);
}

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

TEST_CASE("a small model trains to near-zero loss and predicts") {
    strata::Model<Small> model(7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.02});
    auto train = blobs(512, 1).shuffle(512, 3).batch(32);
    auto before = model.evaluate(blobs(512, 1).batch(128));
    auto h = model.fit(train, {.epochs = 40, .verbose = 0});
    auto after = model.evaluate(blobs(512, 1).batch(128));
    CHECK(h["loss"].size() == 40);
    CHECK(h["loss"].back() < h["loss"].front());
    CHECK(after.loss < 0.1 * before.loss);
    CHECK(after.accuracy > 0.97);
    // Held-out data from the same rule.
    CHECK(model.evaluate(blobs(256, 99).batch(64)).accuracy > 0.9);
    auto p = model.predict(blobs(10, 5).batch(4));
    CHECK(p.shape() == strata::Shape{10, 3});
    for (std::int64_t r = 0; r < 10; ++r) CHECK(p.at(r, 0) + p.at(r, 1) + p.at(r, 2) == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("Model::build: a bad batch size is an error; building first changes no result") {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    strata::Model<Cnn> built(5), plain(5);
    for (auto* m : {&built, &plain})
        m->compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 0.01});
    const auto msg = strata_test::error_of<strata::ValueError>([&] { built.build(-3); });
    CHECK(msg.find("build: the batch size must be positive, got -3") != std::string::npos);
    CHECK(!strata_test::error_of<strata::ValueError>([&] { built.build(0); }).empty());
    // Reserve for a larger batch than the steps use, in training and inference, then train and
    // evaluate both models: build only allocates, so every bit must agree.
    built.build(48);
    built.build(100, false);
    const auto xs = lcg(24 * 64, 17);
    std::vector<float> x(xs.begin(), xs.end());
    std::vector<std::int32_t> y(24);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
    const auto ds = strata::data::Dataset<>::from_arrays(x, {8, 8, 1}, y).batch(16);
    const auto hb = built.fit(ds, {.epochs = 3, .verbose = 0});
    const auto hp = plain.fit(ds, {.epochs = 3, .verbose = 0});
    CHECK(built.get_weights() == plain.get_weights());
    CHECK(hb["loss"] == hp["loss"]);
    CHECK(built.evaluate(ds).loss == plain.evaluate(ds).loss);
    CHECK(hb["loss"].back() != hb["loss"].front());  // it did train
}

TEST_CASE("linear regression with MSE and SGD learns y = 2x + 1") {
    using Lin = Sequential<Input<1>, Dense<1>>;
    strata::Model<Lin, strata::distribute::Default, double> model(1);
    model.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{.learning_rate = 0.1}, {});
    auto xs = lcg(256, 11);
    std::vector<float> x(xs.begin(), xs.end());
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = 2 * x[i] + 1;
    auto ds = strata::data::Dataset<float>::from_arrays(x, {1}, y).batch(32);
    model.fit(ds, {.epochs = 100, .verbose = 0});
    const auto w = model.get_weights();
    CHECK(w[0] == doctest::Approx(2.0).epsilon(1e-4));
    CHECK(w[1] == doctest::Approx(1.0).epsilon(1e-4));
    CHECK(model.evaluate(ds).loss < 1e-8);
}

TEST_CASE("same seed, same weights: training is bitwise reproducible") {
    auto train_once = [] {
        strata::Model<Small> model(123);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 0.01});
        model.fit(blobs(300, 2).shuffle(100, 9).batch(25), {.epochs = 3, .verbose = 0});
        return model.get_weights();
    };
    const auto a = train_once(), b = train_once();
    CHECK(a == b);
    strata::Model<Small> other(124);
    CHECK(other.get_weights() != strata::Model<Small>(123).get_weights());
}

TEST_CASE("save, load, continue gives the same weights as training straight through") {
    const auto path = temp_path("ckpt.safetensors");
    auto data = blobs(256, 4).batch(32);
    auto make = [] {
        auto m = std::make_unique<strata::Model<Small>>(5);
        m->compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
        return m;
    };
    auto straight = make();
    straight->fit(data, {.epochs = 4, .verbose = 0});

    auto first = make();
    first->fit(data, {.epochs = 2, .verbose = 0});
    first->save(path);
    auto resumed = make();
    resumed->load(path);
    CHECK(resumed->epoch() == 2);
    resumed->fit(data, {.epochs = 4, .verbose = 0, .initial_epoch = 2});
    CHECK(resumed->get_weights() == straight->get_weights());

    // The file is a plain safetensors file with the documented names.
    auto f = strata::io::SafetensorsFile::load(path);
    CHECK(f.contains("dense/kernel"));
    CHECK(f.contains("dense_1/bias"));
    CHECK(f.contains("optimizer/momentum/dense/kernel"));
    CHECK(f.metadata("format") == "strata-checkpoint");

    // Another model's checkpoint: the error names the tensor and both shapes.
    using Other = Sequential<Input<4>, Dense<8, Tanh>, Dense<3, Softmax>>;
    strata::Model<Other> other(1);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    CHECK_THROWS_WITH_AS(other.load(path), doctest::Contains("dense/kernel"), strata::CheckpointError);
    fs::remove(path);
}

TEST_CASE("callbacks: history, CSV log, checkpoints, early stopping, LR schedule, user callback") {
    const auto csv = temp_path("log.csv");
    const auto ckpt = temp_path("ckpt_{epoch:02d}.safetensors");
    const auto named = temp_path("w-{epoch}-{val_accuracy:.4f}.safetensors");
    strata::Model<Small> model(3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    auto stopper = std::make_shared<strata::train::EarlyStopping>(
        strata::train::EarlyStopping::Options{.monitor = "loss", .min_delta = 10.0, .patience = 2});
    auto saver = std::make_shared<strata::train::ModelCheckpoint>(ckpt);
    auto namer = std::make_shared<strata::train::ModelCheckpoint>(named);
    std::vector<double> lrs;
    auto sched = std::make_shared<strata::train::LearningRateScheduler>([](int epoch, double lr) { return epoch == 0 ? lr : lr * 0.5; });
    int batches = 0;
    auto user = std::make_shared<strata::train::LambdaCallback>();
    user->batch_end = [&](strata::train::TrainingContext&, std::int64_t, const strata::train::Logs& l) {
        ++batches;
        CHECK(l.contains("loss"));
    };
    user->epoch_end = [&](strata::train::TrainingContext& c, int, const strata::train::Logs&) { lrs.push_back(c.learning_rate()); };
    auto h = model.fit(blobs(64, 8).batch(16), {.epochs = 10,
                                                .validation_data = blobs(32, 9).batch(16),
                                                .callbacks = {std::make_shared<strata::train::CsvLogger>(csv), stopper, saver, namer, sched, user},
                                                .verbose = 0});
    // min_delta 10 can never be met: stops after patience epochs (the first epoch sets the best).
    CHECK(h.epoch.size() == 3);
    CHECK(stopper->stopped_epoch() == 2);
    CHECK(batches == 3 * 4);
    REQUIRE(lrs.size() == 3);
    CHECK(lrs[1] == doctest::Approx(0.025));
    CHECK(lrs[2] == doctest::Approx(0.0125));
    CHECK(h["val_loss"].size() == 3);
    CHECK(saver->saved() == 3);
    CHECK(fs::exists(temp_path("ckpt_03.safetensors")));
    for (int e = 0; e < 3; ++e) {  // Keras's names: the epoch as is, the figure with 4 decimals
        char want[64];
        std::snprintf(want, sizeof want, "w-%d-%.4f.safetensors", e + 1, h["val_accuracy"][std::size_t(e)]);
        CHECK(fs::exists(temp_path(want)));
        fs::remove(temp_path(want));
    }
    std::ifstream in(csv);
    std::string header, line;
    std::getline(in, header);
    CHECK(header.find("epoch,loss,accuracy,val_loss,val_accuracy,lr") == 0);
    int rows = 0;
    while (std::getline(in, line)) ++rows;
    CHECK(rows == 3);
    for (int e = 1; e <= 3; ++e) fs::remove(temp_path("ckpt_0" + std::to_string(e) + ".safetensors"));
    fs::remove(csv);
}

TEST_CASE("ModelCheckpoint paths are filled as Python's str.format fills Keras's") {
    using strata::train::format_filepath;
    strata::train::Logs logs;
    logs.set("loss", 0.123456789);
    logs.set("val_accuracy", 0.98125);
    logs.set("lr", 1e-5);
    logs.set("updates", 100);
    logs.set("val_loss", -2.5);
    // Expected strings are Python's: "{epoch:02d}".format(epoch=3), etc.
    CHECK(format_filepath("w-{epoch:02d}-{val_accuracy:.4f}.safetensors", 2, logs) == "w-03-0.9812.safetensors");
    CHECK(format_filepath("ckpt-{epoch}.st", 11, logs) == "ckpt-12.st");
    CHECK(format_filepath("{epoch:03}", 0, logs) == "001");
    CHECK(format_filepath("{loss}", 0, logs) == "0.123456789");
    CHECK(format_filepath("{lr}", 0, logs) == "1e-05");
    CHECK(format_filepath("{updates}", 0, logs) == "100.0");
    CHECK(format_filepath("{updates:d}", 0, logs) == "100");
    CHECK(format_filepath("{loss:e}", 0, logs) == "1.234568e-01");
    CHECK(format_filepath("{loss:.2E}", 0, logs) == "1.23E-01");
    CHECK(format_filepath("{lr:g}|{loss:.3g}", 0, logs) == "1e-05|0.123");
    CHECK(format_filepath("{val_accuracy:.1%}", 0, logs) == "98.1%");
    CHECK(format_filepath("{val_loss:.2f}|{val_loss:+.1f}|{loss:+.1f}|{loss: .1f}", 0, logs) == "-2.50|-2.5|+0.1| 0.1");
    CHECK(format_filepath("{val_loss:08.3f}|{epoch:>4}|{epoch:<4}|{epoch:*^5}", 6, logs) == "-002.500|   7|7   |**7**");
    CHECK(format_filepath("{{epoch}}-{{{epoch}}}-}}{{", 0, logs) == "{epoch}-{1}-}{");
    CHECK(format_filepath("no fields.safetensors", 0, logs) == "no fields.safetensors");

    using strata::ValueError;
    CHECK_THROWS_WITH_AS(format_filepath("w-{val_acc:.4f}", 0, logs),
                         "format: 'w-{val_acc:.4f}' names 'val_acc', which is not a figure of this epoch (available: epoch, "
                         "loss, val_accuracy, lr, updates, val_loss)",
                         ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-{}", 0, logs), doctest::Contains("names '', which is not a figure"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-{loss:.4q}", 0, logs),
                         doctest::Contains("bad format spec '.4q' for 'loss' in 'w-{loss:.4q}': unknown or unsupported type"),
                         ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{loss:.}", 0, logs), doctest::Contains("'.' without a precision"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{loss:,.2f}", 0, logs), doctest::Contains("bad format spec ',.2f'"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{epoch:.2d}", 0, logs), doctest::Contains("a precision is not allowed"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{loss:d}", 0, logs), doctest::Contains("'loss' is 0.123457, not an integer"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-{epoch", 0, logs), doctest::Contains("is not closed (write '{{' for a brace)"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-}", 0, logs), doctest::Contains("a single '}' at position 2"), ValueError);

    // In fit: a path naming a figure that training does not produce fails at the first epoch.
    strata::Model<Small> model(3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    auto bad = std::make_shared<strata::train::ModelCheckpoint>(temp_path("w-{val_accuracy:.4f}.safetensors"));
    CHECK_THROWS_WITH_AS(model.fit(blobs(32, 8).batch(16), {.epochs = 2, .callbacks = {bad}, .verbose = 0}),
                         doctest::Contains("names 'val_accuracy', which is not a figure of this epoch (available: epoch, loss, accuracy"),
                         ValueError);
    CHECK(bad->saved() == 0);
}

TEST_CASE("the progress bar prints small learning rates and counts readably") {
    auto fmt = [](const char* name, double v) {
        char buf[40];
        strata::train::format_figure(buf, sizeof buf, name, v);
        return std::string(buf);
    };
    CHECK(fmt("lr", 1e-5) == "1.0000e-05");  // not 0.0000
    CHECK(fmt("lr", 0.001) == "0.0010");
    CHECK(fmt("lr", 0.00099) == "9.9000e-04");
    CHECK(fmt("lr", 0.05) == "0.0500");
    CHECK(fmt("loss", 0.04213) == "0.0421");
    CHECK(fmt("loss", 2.5e-6) == "2.5000e-06");
    CHECK(fmt("val_loss", 0.0) == "0.0000");
    CHECK(fmt("accuracy", 1.0) == "1.0000");  // a rate keeps its decimals when it is whole
    CHECK(fmt("val_accuracy", 0.0) == "0.0000");
    CHECK(fmt("loss", std::nan("")) == "nan");
    CHECK(fmt("updates", 100) == "100");
    CHECK(fmt("dropped", 0) == "0");
    CHECK(fmt("staleness_mean", 1.25) == "1.2500");
    CHECK(fmt("seconds", 12.0) == "12");

    // The line of an epoch (verbose 2, written to a file: no terminal control characters).
    const auto path = temp_path("progress.txt");
    std::FILE* f = std::fopen(path.c_str(), "w+");
    REQUIRE(f != nullptr);
    strata::train::ProgressBar bar(2, f);
    strata::train::Logs logs;
    logs.set("loss", 0.5);
    logs.set("lr", 1e-5);
    logs.set("updates", 100);
    bar.epoch_begin(0, 3, 10);
    bar.epoch_end(10, logs);
    std::fclose(f);
    std::ifstream in(path);
    std::string epoch_line, line;
    std::getline(in, epoch_line);
    std::getline(in, line);
    CHECK(epoch_line == "Epoch 1/3");
    INFO(line);
    CHECK(line.find("10/10 - ") == 0);
    CHECK(strata_test::has(line, " - loss: 0.5000 - lr: 1.0000e-05 - updates: 100"));
    fs::remove(path);
}

TEST_CASE("bad input gets a clear error") {
    strata::Model<Small> model(1);
    auto data = blobs(8, 1).batch(4);
    CHECK_THROWS_WITH_AS(model.fit(data, {.verbose = 0}), doctest::Contains("compile"), strata::ValueError);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    std::vector<float> x(8, 0.5f);
    auto bad_label = strata::data::Dataset<>::from_arrays(x, {4}, std::vector<std::int32_t>{0, 7}).batch(2);
    CHECK_THROWS_WITH_AS(model.fit(bad_label, {.verbose = 0}), doctest::Contains("label 7"), strata::ValueError);
    auto bad_shape = strata::data::Dataset<>::from_arrays(std::vector<float>(10, 0.f), {5}, std::vector<std::int32_t>{0, 1}).batch(2);
    CHECK_THROWS_WITH_AS(model.fit(bad_shape, {.verbose = 0}), doctest::Contains("(None, 4)"), strata::ShapeError);
    CHECK_THROWS_AS(model.fit(blobs(8, 1), {.verbose = 0}), strata::ValueError);  // not batched
    CHECK_THROWS_AS(model.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{}, {"precision"}), strata::ValueError);
    CHECK_THROWS_AS(model.load(temp_path("does_not_exist.safetensors")), strata::IoError);
}

TEST_CASE("after the first step, a training step allocates no heap memory") {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    strata::Model<Cnn> model(2);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{});
    auto f = lcg(64 * 64, 3, 0, 1);
    std::vector<std::int32_t> y(64);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
    auto ds = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, y).batch(16);
    auto it = ds.iterate(0);
    model.train_step(*it);  // first step: buffers grow
    ++it;
    const long before = g_allocations.load();
    for (int i = 0; i < 3 && it != std::default_sentinel; ++i, ++it) model.train_step(*it);
    CHECK(g_allocations.load() - before == 0);
}

TEST_CASE("a Mirrored training step allocates no heap memory either (buckets and all)") {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    for (std::size_t bucket_bytes : {std::size_t(4) << 20, std::size_t(64)}) {
        CAPTURE(bucket_bytes);
        strata::distribute::Mirrored<> strategy(2, {.bucket_bytes = bucket_bytes});
        strata::Model<Cnn, strata::distribute::Mirrored<>> model(strategy, 2);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
        auto f = lcg(64 * 64, 3, 0, 1);
        std::vector<std::int32_t> y(64);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
        auto ds = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, y).batch(16);
        auto it = ds.iterate(0);
        model.train_step(*it);
        ++it;
        model.train_step(*it);  // the communication threads' queues have grown too
        ++it;
        const long before = g_allocations.load();
        for (int i = 0; i < 2 && it != std::default_sentinel; ++i, ++it) model.train_step(*it);
        CHECK(g_allocations.load() - before == 0);
    }
}

TEST_CASE("a float checkpoint loads into a double model") {
    const auto path = temp_path("f32.safetensors");
    strata::Model<Small> f32(8);
    f32.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    f32.fit(blobs(64, 2).batch(16), {.epochs = 1, .verbose = 0});
    f32.save(path);
    strata::Model<Small, strata::distribute::Default, double> f64(1);
    f64.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    f64.load(path);
    const auto a = f32.get_weights();
    const auto b = f64.get_weights();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(double(a[i]) == b[i]);
    fs::remove(path);
}
