// The optimizers against Keras's formulas (computed by hand), their host loops against the
// per-element functors on any thread count, and the learning-rate schedules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "test_util.hpp"

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
