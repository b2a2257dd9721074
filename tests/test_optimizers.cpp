// The optimizers against Keras's formulas (computed by hand, and a float64 reference of every
// optimizer with global_clipnorm and moving-average ranges), their host loops against the
// per-element functors on any thread count, the learning-rate schedules (CosineDecay's warmup
// edges), clipping under the strategies, and AdamW's state through a checkpoint.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "test_images.hpp"
#include "test_util.hpp"
#include "training_util.hpp"

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

// ---- AdamW, global_clipnorm, moving-average ranges, CosineDecay ---------------------------------

namespace {
namespace so = strata::optim;

// An independent float64 reference of Keras 3's updates, element by element: the gradient
// scaled by c / max(‖g‖, c) with the norm over the trainable elements only, the moving ranges
// updated as w·m + s·(1 − m), AdamW's decay before Adam's step.
struct Reference {
    so::Optimizer config;
    std::vector<so::MovingAverageRange> moving;
    std::vector<double> s0 = {}, s1 = {}, s2 = {};  // the slots
    std::int64_t t = 0;

    const so::MovingAverageRange* range_of(std::size_t i) const {
        for (const auto& r : moving)
            if (std::int64_t(i) >= r.first && std::int64_t(i) < r.first + r.count) return &r;
        return nullptr;
    }
    void step(std::vector<double>& w, const std::vector<double>& g) {
        const std::size_t n = w.size();
        s0.resize(n, 0.0), s1.resize(n, 0.0), s2.resize(n, 0.0);
        const double c = std::visit([](const auto& o) { return o.global_clipnorm; }, config);
        const double lr = std::visit([&](const auto& o) { return o.learning_rate(t); }, config);
        double squares = 0;
        for (std::size_t i = 0; i < n; ++i)
            if (!range_of(i)) squares += g[i] * g[i];
        const double norm = std::sqrt(squares);
        const double scale = (c > 0 && norm > c) ? c / norm : 1.0;
        for (std::size_t i = 0; i < n; ++i) {
            if (const auto* r = range_of(i)) {
                w[i] = r->momentum * w[i] + (1 - r->momentum) * g[i];
                continue;
            }
            const double gi = g[i] * scale;
            std::visit(
                [&](const auto& o) {
                    using O = std::decay_t<decltype(o)>;
                    if constexpr (std::is_same_v<O, so::SGD>) {
                        if (o.momentum == 0) {
                            w[i] -= lr * gi;
                        } else {
                            s0[i] = o.momentum * s0[i] - lr * gi;
                            w[i] += o.nesterov ? o.momentum * s0[i] - lr * gi : s0[i];
                        }
                    } else if constexpr (std::is_same_v<O, so::RMSprop>) {
                        s0[i] = o.rho * s0[i] + (1 - o.rho) * gi * gi;
                        double denom = s0[i];
                        if (o.centered) {
                            s1[i] = o.rho * s1[i] + (1 - o.rho) * gi;
                            denom -= s1[i] * s1[i];
                        }
                        const double inc = lr * gi / std::sqrt(denom + o.epsilon);
                        if (o.momentum > 0) {
                            s2[i] = o.momentum * s2[i] + inc;
                            w[i] -= s2[i];
                        } else {
                            w[i] -= inc;
                        }
                    } else {
                        if constexpr (std::is_same_v<O, so::AdamW>) w[i] -= w[i] * o.weight_decay * lr;
                        s0[i] += (gi - s0[i]) * (1 - o.beta_1);
                        s1[i] += (gi * gi - s1[i]) * (1 - o.beta_2);
                        const double k = double(t + 1);
                        const double alpha = lr * std::sqrt(1 - std::pow(o.beta_2, k)) / (1 - std::pow(o.beta_1, k));
                        w[i] -= alpha * s0[i] / (std::sqrt(s1[i]) + o.epsilon);
                    }
                },
                config);
        }
        ++t;
    }
};

// Gradient k of n elements; moving-range slots get statistics (positive, larger than the
// gradients, so that a norm that counted them would differ a lot).
std::vector<double> gradient(std::size_t n, int k, const std::vector<so::MovingAverageRange>& moving = {}) {
    std::vector<double> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.013 * double(i * (k + 1)) + 0.5 * k) * 0.02;
    for (const auto& r : moving)
        for (std::int64_t i = r.first; i < r.first + r.count; ++i) g[std::size_t(i)] = 3.0 + std::cos(0.7 * double(i + k));
    return g;
}
std::vector<double> initial_weights(std::size_t n) {
    std::vector<double> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = std::cos(0.29 * double(i)) * 0.5;
    return w;
}
double gradient_norm(const std::vector<double>& g, const std::vector<so::MovingAverageRange>& moving) {
    Reference r{.config = so::SGD{}, .moving = moving};
    double s = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
        if (!r.range_of(i)) s += g[i] * g[i];
    return std::sqrt(s);
}

// `steps` updates of OptimizerState<T> against the reference; returns the largest relative
// difference of the weights (scaled by the largest weight) and leaves the state's weights in `out`.
template <class T>
double against_reference(so::Optimizer o, const std::vector<so::MovingAverageRange>& moving, std::size_t n, int steps,
                         std::vector<T>* out = nullptr) {
    so::OptimizerState<T, strata::place::Host> state(o, std::int64_t(n), moving);
    Reference ref{.config = o, .moving = moving};
    std::vector<double> wr = initial_weights(n);
    std::vector<T> w(wr.begin(), wr.end());
    for (int k = 0; k < steps; ++k) {
        const std::vector<double> g = gradient(n, k, moving);
        const std::vector<T> gt(g.begin(), g.end());
        state.apply(w.data(), gt.data());
        ref.step(wr, std::vector<double>(gt.begin(), gt.end()));
    }
    if (out) *out = w;
    return strata_test::max_relative_difference(std::vector<double>(w.begin(), w.end()), wr);
}

std::vector<so::Optimizer> all_optimizers(double clipnorm) {
    return {
        so::SGD{.learning_rate = 0.1, .global_clipnorm = clipnorm},
        so::SGD{.learning_rate = 0.1, .momentum = 0.9, .global_clipnorm = clipnorm},
        so::SGD{.learning_rate = 0.1, .momentum = 0.9, .nesterov = true, .global_clipnorm = clipnorm},
        so::RMSprop{.learning_rate = 0.01, .global_clipnorm = clipnorm},
        so::RMSprop{.learning_rate = 0.01, .momentum = 0.5, .centered = true, .global_clipnorm = clipnorm},
        so::Adam{.learning_rate = 0.01, .global_clipnorm = clipnorm},
        so::AdamW{.learning_rate = 0.01, .global_clipnorm = clipnorm},
        so::AdamW{.learning_rate = 0.02, .weight_decay = 0.1, .beta_1 = 0.8, .beta_2 = 0.99, .epsilon = 1e-6,
                  .global_clipnorm = clipnorm},
    };
}
// Moving ranges of a 5000-element buffer: one inside the first update block, one across a block
// boundary, one at the very end.
const std::vector<so::MovingAverageRange> some_ranges = {
    {.first = 10, .count = 7, .momentum = 0.99}, {.first = 1020, .count = 9, .momentum = 0.9}, {.first = 4990, .count = 10, .momentum = 0.5}};
}  // namespace

TEST_CASE("every optimizer, with and without global_clipnorm and moving ranges, follows a float64 reference") {
    const std::size_t n = 5000;
    // The first gradient's norm is about 1; 0.3 clips every step, 1e6 none.
    for (double clip : {0.0, 0.3, 1e6})
        for (const auto& moving : {std::vector<so::MovingAverageRange>{}, some_ranges})
            for (const auto& o : all_optimizers(clip)) {
                INFO(so::describe(o), ", ", moving.size(), " moving ranges");
                CHECK(against_reference<double>(o, moving, n, 4) <= 1e-13);
                CHECK(against_reference<float>(o, moving, n, 4) <= 2e-6);
            }
    // The test's gradients are clipped at 0.3 (the negative control of the clipping case).
    CHECK(gradient_norm(gradient(n, 0, some_ranges), some_ranges) > 0.6);
}

TEST_CASE("global_clipnorm: a norm at or below the threshold leaves the update exactly as without it") {
    const std::size_t n = 5000;
    for (const auto& moving : {std::vector<so::MovingAverageRange>{}, some_ranges}) {
        const auto off = all_optimizers(0.0), high = all_optimizers(1e6);
        for (std::size_t c = 0; c < off.size(); ++c) {
            INFO(so::describe(off[c]));
            std::vector<float> a, b;
            against_reference<float>(off[c], moving, n, 3, &a);
            against_reference<float>(high[c], moving, n, 3, &b);
            CHECK(a == b);
        }
    }
}

TEST_CASE("global_clipnorm scales the gradient by c / ||g|| above c") {
    // SGD, lr 1, w = 0: the update is −g·scale. ‖(3, 4)‖ = 5.
    auto once = [](double clip) {
        so::OptimizerState<double, strata::place::Host> s(so::SGD{.learning_rate = 1.0, .global_clipnorm = clip}, 2);
        std::vector<double> w = {0, 0};
        const std::vector<double> g = {3, 4};
        s.apply(w.data(), g.data());
        CHECK(g == std::vector<double>{3, 4});  // the caller's gradient is not written
        return w;
    };
    CHECK(once(1.0)[0] == doctest::Approx(-0.6).epsilon(1e-15));
    CHECK(once(1.0)[1] == doctest::Approx(-0.8).epsilon(1e-15));
    CHECK(once(2.5)[0] == doctest::Approx(-1.5).epsilon(1e-15));
    CHECK(once(2.5)[1] == doctest::Approx(-2.0).epsilon(1e-15));
    CHECK(once(5.0) == std::vector<double>{-3, -4});  // at c: untouched
    CHECK(once(7.0) == std::vector<double>{-3, -4});  // below: untouched
    CHECK(once(0.0) == std::vector<double>{-3, -4});  // off
    // A norm that is not finite: every update NaN (Keras's scale is NaN there).
    so::OptimizerState<double, strata::place::Host> s(so::SGD{.learning_rate = 1.0, .global_clipnorm = 1.0}, 2);
    std::vector<double> w = {0, 0};
    const std::vector<double> g = {INFINITY, 1};
    s.apply(w.data(), g.data());
    CHECK(std::isnan(w[0]));
    CHECK(std::isnan(w[1]));
}

TEST_CASE("moving ranges: their own update, outside the clip norm, no weight decay, slots untouched") {
    // 6 elements: [0, 2) trained, [2, 4) a moving average (momentum 0.9), [4, 6) trained.
    // The statistics (100, 200) dwarf the gradients: counted in the norm they would make the
    // scale 1/223.6 instead of 1/5.
    const std::vector<so::MovingAverageRange> moving = {{.first = 2, .count = 2, .momentum = 0.9}};
    const std::vector<double> g = {3, 0, 100, 200, 0, 4};
    const std::vector<double> w0 = {1, 1, 10, 20, 1, 1};
    {
        so::OptimizerState<double, strata::place::Host> s(so::SGD{.learning_rate = 1.0, .global_clipnorm = 1.0}, 6, moving);
        std::vector<double> w = w0;
        s.apply(w.data(), g.data());
        CHECK(w[0] == doctest::Approx(1 - 0.6).epsilon(1e-15));
        CHECK(w[1] == 1.0);
        CHECK(w[4] == 1.0);
        CHECK(w[5] == doctest::Approx(1 - 0.8).epsilon(1e-15));
        CHECK(w[2] == doctest::Approx(0.9 * 10 + 0.1 * 100).epsilon(1e-15));
        CHECK(w[3] == doctest::Approx(0.9 * 20 + 0.1 * 200).epsilon(1e-15));
        // The negative control: as trainable elements the same buffer updates otherwise.
        so::OptimizerState<double, strata::place::Host> all(so::SGD{.learning_rate = 1.0, .global_clipnorm = 1.0}, 6);
        std::vector<double> wa = w0;
        all.apply(wa.data(), g.data());
        CHECK(std::abs(wa[0] - w[0]) > 0.5);
        CHECK(std::abs(wa[2] - w[2]) > 5);
    }
    {
        // AdamW with a large decay: the moving range is not decayed, and its slots stay 0.
        so::OptimizerState<double, strata::place::Host> s(so::AdamW{.learning_rate = 0.1, .weight_decay = 0.5}, 6, moving);
        std::vector<double> w = w0;
        const std::vector<double> zero = {0, 0, 10, 20, 0, 0};  // statistics equal to the averages
        for (int k = 0; k < 3; ++k) s.apply(w.data(), zero.data());
        CHECK(w[2] == doctest::Approx(10).epsilon(1e-15));
        CHECK(w[3] == doctest::Approx(20).epsilon(1e-15));
        CHECK(w[0] == doctest::Approx(std::pow(1 - 0.1 * 0.5, 3)).epsilon(1e-14));
        for (auto& [name, t] : s.slots()) {
            INFO(name);
            CHECK(t.data()[2] == 0.0);
            CHECK(t.data()[3] == 0.0);
        }
    }
}

TEST_CASE("AdamW: the weight decay is decoupled, w·(1 − lr·wd) per step with a zero gradient") {
    const double lr = 0.01, wd = 0.004;
    for (const double w0 : {1.0, -3.5, 0.25}) {
        so::OptimizerState<double, strata::place::Host> s(so::AdamW{}, 1);  // Keras's defaults
        double w = w0, g = 0, expect = w0;
        so::OptimizerState<double, strata::place::Host> s2(so::AdamW{.learning_rate = lr, .weight_decay = wd}, 1);
        double w2 = w0;
        for (int k = 1; k <= 5; ++k) {
            s.apply(&w, &g);
            s2.apply(&w2, &g);
            expect = expect - expect * 0.004 * 0.001;  // Keras: w − w·wd·lr
            CHECK(w == expect);
            CHECK(w == doctest::Approx(w0 * std::pow(1 - 0.001 * 0.004, k)).epsilon(1e-15));
            CHECK(w2 == doctest::Approx(w0 * std::pow(1 - lr * wd, k)).epsilon(1e-15));
        }
    }
    // Adam with a zero gradient leaves w as it is; AdamW with weight_decay 0 is Adam bit for bit.
    std::vector<double> adam, adamw0;
    against_reference<double>(so::Adam{.learning_rate = 0.01}, {}, 3000, 3, &adam);
    against_reference<double>(so::AdamW{.learning_rate = 0.01, .weight_decay = 0}, {}, 3000, 3, &adamw0);
    CHECK(adam == adamw0);
    so::OptimizerState<double, strata::place::Host> a(so::Adam{}, 1);
    double w = 2, g = 0;
    a.apply(&w, &g);
    CHECK(w == 2.0);
    // The decay uses the step's scheduled learning rate.
    so::OptimizerState<double, strata::place::Host> sch(
        so::AdamW{.learning_rate = [](std::int64_t step) { return step == 0 ? 0.1 : 0.2; }, .weight_decay = 1.0}, 1);
    double v = 1;
    sch.apply(&v, &g);
    CHECK(v == doctest::Approx(0.9).epsilon(1e-15));
    sch.apply(&v, &g);
    CHECK(v == doctest::Approx(0.9 * 0.8).epsilon(1e-15));
}

TEST_CASE("apply_range over slices equals apply over the whole buffer with global_clipnorm (CentralStorage)") {
    const std::size_t n = 5000;
    for (const auto& o : {so::Optimizer{so::AdamW{.learning_rate = 0.01, .global_clipnorm = 0.3}},
                          so::Optimizer{so::RMSprop{.learning_rate = 0.01, .momentum = 0.5, .centered = true, .global_clipnorm = 0.3}},
                          so::Optimizer{so::SGD{.learning_rate = 0.1, .momentum = 0.9, .global_clipnorm = 0.3}}}) {
        INFO(so::describe(o));
        so::OptimizerState<float, strata::place::Host> whole(o, std::int64_t(n), some_ranges), sliced(o, std::int64_t(n), some_ranges);
        const auto w0 = initial_weights(n);
        std::vector<float> a(w0.begin(), w0.end()), b = a;
        // Slices cut inside the first two moving ranges and in the middle of update blocks.
        const std::vector<std::int64_t> cuts = {0, 13, 1024, 3001, std::int64_t(n)};
        for (int k = 0; k < 3; ++k) {
            const auto gd = gradient(n, k, some_ranges);
            const std::vector<float> g(gd.begin(), gd.end());
            whole.apply(a.data(), g.data());
            sliced.prepare_step(g.data());
            for (std::size_t c = 0; c + 1 < cuts.size(); ++c) sliced.apply_range(b.data(), g.data(), cuts[c], cuts[c + 1] - cuts[c]);
            sliced.advance();
            CHECK(a == b);
        }
        // Without prepare_step for the step, apply_range refuses (it cannot see the whole norm).
        const auto msg = strata_test::error_of<strata::ValueError>([&] { sliced.apply_range(b.data(), b.data(), 0, 10); });
        CHECK(msg.find("prepare_step") != std::string::npos);
    }
}

TEST_CASE("sharded states clip by the whole model's norm through prepare_step_from_squared_norm") {
    const std::size_t n = 3000, half = 1700;
    const so::Optimizer o = so::Adam{.learning_rate = 0.01, .global_clipnorm = 0.2};
    const std::vector<so::MovingAverageRange> moving = {{.first = 1000, .count = 50}, {.first = 2500, .count = 5}};
    so::OptimizerState<double, strata::place::Host> whole(o, std::int64_t(n), moving);
    so::OptimizerState<double, strata::place::Host> p0(o, std::int64_t(half), {{.first = 1000, .count = 50}});
    so::OptimizerState<double, strata::place::Host> p1(o, std::int64_t(n - half), {{.first = 2500 - std::int64_t(half), .count = 5}});
    std::vector<double> a = initial_weights(n), b = a;
    for (int k = 0; k < 3; ++k) {
        const auto g = gradient(n, k, moving);
        whole.apply(a.data(), g.data());
        const double squares = p0.squared_gradient_norm(g.data()) + p1.squared_gradient_norm(g.data() + half);
        CHECK(std::sqrt(squares) == doctest::Approx(gradient_norm(g, moving)).epsilon(1e-14));
        p0.prepare_step_from_squared_norm(squares);
        p1.prepare_step_from_squared_norm(squares);
        p0.apply_range(b.data(), g.data(), 0, std::int64_t(half));
        p1.apply_range(b.data() + half, g.data() + half, 0, std::int64_t(n - half));
        p0.advance();
        p1.advance();
    }
    CHECK(strata_test::max_relative_difference(b, a) <= 1e-14);
}

TEST_CASE("the host loops equal the functors bit for bit with AdamW and global_clipnorm") {
    // Gradients k/16 (|k| <= 8): their squares sum exactly in double in any grouping, so the test
    // computes the same scale as the state, and hands the functors a pointer to it.
    const std::int64_t n = 40 * 1024 + 7, first = 5;
    for (const auto& o : all_optimizers(0.5)) {
        INFO(so::describe(o));
        std::vector<float> w(static_cast<std::size_t>(n)), g(w.size());
        double squares = 0;
        for (std::size_t i = 0; i < w.size(); ++i) {
            w[i] = float(std::sin(0.37 * double(i)));
            g[i] = float(int((i * 37) % 17) - 8) / 16.0f;
            squares += double(g[i]) * double(g[i]);
        }
        const double scale = 0.5 / std::sqrt(squares);
        so::OptimizerState<float, strata::place::Host> state(o, n);
        std::vector<float> ws = w;
        state.prepare_step(g.data());
        state.apply_range(ws.data(), g.data(), first, n - first);
        std::vector<float> wr = w, s0(w.size(), 0.0f), s1(w.size(), 0.0f), s2(w.size(), 0.0f);
        const double lr = std::visit([](const auto& c) { return c.learning_rate(0); }, o);
        std::visit(
            [&](const auto& c) {
                using C = std::decay_t<decltype(c)>;
                for (std::int64_t i = first; i < n; ++i) {
                    if constexpr (std::is_same_v<C, so::SGD>) {
                        so::detail::SgdStep<float>{wr.data(), g.data(), c.momentum > 0 ? s0.data() : nullptr, float(lr),
                                                   float(c.momentum), c.nesterov, &scale}(i);
                    } else if constexpr (std::is_same_v<C, so::RMSprop>) {
                        so::detail::RmsStep<float>{wr.data(), g.data(), s0.data(), c.centered ? s1.data() : nullptr,
                                                   c.momentum > 0 ? s2.data() : nullptr, float(lr), float(c.rho), float(c.momentum),
                                                   float(c.epsilon), &scale}(i);
                    } else {
                        double wd = 0;
                        if constexpr (std::is_same_v<C, so::AdamW>) wd = c.weight_decay;
                        const double alpha = lr * std::sqrt(1 - c.beta_2) / (1 - c.beta_1);
                        so::detail::AdamStep<float>{wr.data(), g.data(), s0.data(), s1.data(), float(alpha), float(c.beta_1),
                                                    float(c.beta_2), float(c.epsilon), &scale, float(wd), float(lr)}(i);
                    }
                }
            },
            o);
        CHECK(ws == wr);
        CHECK(std::equal(ws.begin(), ws.begin() + first, w.begin()));
    }
}

namespace {
// Keras's CosineDecay, written out from its documentation.
double cosine_reference(double initial, double decay_steps, double alpha, std::optional<double> target, double warmup_steps,
                        double step) {
    const double pi = 3.14159265358979323846;
    auto decay = [&](double s, double from) {
        s = std::min(s, decay_steps);
        return from * ((1 - alpha) * 0.5 * (1 + std::cos(pi * s / decay_steps)) + alpha);
    };
    if (!target) return decay(step, initial);
    if (step < warmup_steps) return initial + (*target - initial) * step / warmup_steps;
    return decay(step - warmup_steps, *target);
}
}  // namespace

TEST_CASE("CosineDecay: Keras's values, warmup edges included") {
    const so::CosineDecay plain{.initial_learning_rate = 0.1, .decay_steps = 1000};
    CHECK(plain(0) == 0.1);
    CHECK(plain(500) == doctest::Approx(0.05).epsilon(1e-14));
    CHECK(std::abs(plain(1000)) < 1e-17);
    CHECK(std::abs(plain(5000)) < 1e-17);  // clamped at decay_steps
    const so::CosineDecay with_alpha{.initial_learning_rate = 0.1, .decay_steps = 100, .alpha = 0.1};
    CHECK(with_alpha(100) == doctest::Approx(0.01).epsilon(1e-14));
    CHECK(with_alpha(1000) == doctest::Approx(0.01).epsilon(1e-14));
    const so::CosineDecay warm{.initial_learning_rate = 0.0, .decay_steps = 100, .alpha = 0.05, .warmup_target = 0.2, .warmup_steps = 10};
    CHECK(warm(0) == 0.0);
    CHECK(warm(5) == doctest::Approx(0.1).epsilon(1e-14));
    CHECK(warm(9) == doctest::Approx(0.18).epsilon(1e-14));
    CHECK(warm(10) == 0.2);  // the end of the warmup: the decay starts from the target
    CHECK(warm(60) == doctest::Approx(0.2 * (0.95 * 0.5 + 0.05)).epsilon(1e-14));
    CHECK(warm(110) == doctest::Approx(0.2 * 0.05).epsilon(1e-14));
    CHECK(warm(100000) == doctest::Approx(0.2 * 0.05).epsilon(1e-14));
    // A warmup target without warmup steps: the decay starts from the target at once.
    const so::CosineDecay target_only{.initial_learning_rate = 1.0, .decay_steps = 10, .warmup_target = 0.5};
    CHECK(target_only(0) == 0.5);
    struct Case { double initial; std::int64_t decay; double alpha; std::optional<double> target; std::int64_t warmup; };
    for (const Case& c : {Case{0.1, 1000, 0.0, std::nullopt, 0}, Case{0.3, 7, 0.2, std::nullopt, 0}, Case{0.01, 50, 0.0, 0.1, 20},
                          Case{0.5, 13, 0.3, 0.05, 3}, Case{0.0, 1, 0.5, 1.0, 1}})
        for (std::int64_t step : {0, 1, 2, 3, 4, 6, 7, 8, 12, 13, 16, 19, 20, 21, 49, 50, 69, 70, 71, 999, 1000, 1001, 1020, 5000}) {
            const so::CosineDecay d{.initial_learning_rate = c.initial, .decay_steps = c.decay, .alpha = c.alpha,
                                    .warmup_target = c.target, .warmup_steps = c.warmup};
            INFO(d.describe(), " at step ", step);
            CHECK(d(step) == doctest::Approx(cosine_reference(c.initial, double(c.decay), c.alpha, c.target, double(c.warmup),
                                                              double(step)))
                                 .epsilon(1e-13)
                                 .scale(1e-3));
        }
    // As a learning rate: SGD reads it at each step.
    so::OptimizerState<double, strata::place::Host> s(so::SGD{.learning_rate = warm}, 1);
    double w = 0, g = 1, expect = 0;
    for (int k = 0; k < 15; ++k) {
        CHECK(s.current_learning_rate() == warm(k));
        s.apply(&w, &g);
        expect -= warm(k);
    }
    CHECK(w == doctest::Approx(expect).epsilon(1e-14));
    // describe names it with its arguments.
    CHECK(so::describe(so::SGD{.learning_rate = warm}) ==
          "SGD(learning_rate=CosineDecay(initial_learning_rate=0, decay_steps=100, alpha=0.050000000000000003, "
          "warmup_target=0.20000000000000001, warmup_steps=10), momentum=0, nesterov=false)");
    CHECK(so::describe(so::LearningRate(plain)).find("warmup_target=none") != std::string::npos);
}

TEST_CASE("describe: AdamW, and global_clipnorm only where set") {
    CHECK(so::describe(so::AdamW{}) == "AdamW(learning_rate=0.001, weight_decay=0.0040000000000000001, beta_1=0.90000000000000002, "
                                       "beta_2=0.999, epsilon=9.9999999999999995e-08)");
    CHECK(so::describe(so::Adam{}) == "Adam(learning_rate=0.001, beta_1=0.90000000000000002, beta_2=0.999, epsilon=9.9999999999999995e-08)");
    CHECK(so::describe(so::SGD{.global_clipnorm = 1.5}) == "SGD(learning_rate=0.01, momentum=0, nesterov=false, global_clipnorm=1.5)");
    so::OptimizerState<float, strata::place::Host> s(so::AdamW{}, 4);
    CHECK(std::string(s.name()) == "AdamW");
    REQUIRE(s.slots().size() == 2);
    CHECK(s.slots()[0].first == "momentum");
    CHECK(s.slots()[1].first == "velocity");
    CHECK(so::Optimizer(so::AdamW{}).index() == 3);  // appended: the others keep their indices
}

TEST_CASE("bad arguments: ValueError naming the field") {
    auto error = [](auto make) { return strata_test::error_of<strata::ValueError>(make); };
    using State = so::OptimizerState<float, strata::place::Host>;
    auto has = [](const std::string& msg, const char* part) {
        INFO(msg);
        return msg.find(part) != std::string::npos;
    };
    CHECK(has(error([] { State(so::AdamW{.weight_decay = -0.1}, 4); }), "AdamW: weight_decay"));
    CHECK(has(error([] { State(so::AdamW{.weight_decay = NAN}, 4); }), "weight_decay"));
    CHECK(has(error([] { State(so::AdamW{.weight_decay = INFINITY}, 4); }), "weight_decay"));
    CHECK(has(error([] { State(so::AdamW{.beta_1 = 1.0}, 4); }), "AdamW: beta_1"));
    CHECK(has(error([] { State(so::SGD{.global_clipnorm = -1}, 4); }), "SGD: global_clipnorm"));
    CHECK(has(error([] { State(so::Adam{.global_clipnorm = INFINITY}, 4); }), "Adam: global_clipnorm"));
    CHECK(has(error([] { State(so::RMSprop{.global_clipnorm = NAN}, 4); }), "RMSprop: global_clipnorm"));
    CHECK(has(error([] { State(so::SGD{}, 10, {{.first = 8, .count = 3}}); }), "MovingAverageRange 0"));
    CHECK(has(error([] { State(so::SGD{}, 10, {{.first = -1, .count = 3}}); }), "MovingAverageRange 0"));
    CHECK(has(error([] { State(so::SGD{}, 10, {{.first = 2, .count = 3}, {.first = 4, .count = 1}}); }), "sorted and disjoint"));
    CHECK(has(error([] { State(so::SGD{}, 10, {{.first = 5, .count = 1}, {.first = 2, .count = 1}}); }), "MovingAverageRange 1"));
    CHECK(has(error([] { State(so::SGD{}, 10, {{.first = 5, .count = 1, .momentum = 1.5}}); }), "momentum"));
    CHECK(has(error([] { State(so::SGD{}, 10, {{.first = 5, .count = 1, .momentum = NAN}}); }), "momentum"));
    CHECK(has(error([] { (void)so::CosineDecay{.decay_steps = 0}(1); }), "CosineDecay: decay_steps"));
    CHECK(has(error([] { (void)so::CosineDecay{.warmup_target = 0.1, .warmup_steps = -2}(1); }), "CosineDecay: warmup_steps"));
    // Valid edges: adjacent ranges, empty ones, a range covering everything.
    CHECK_NOTHROW(State(so::SGD{}, 10, {{.first = 2, .count = 3}, {.first = 5, .count = 0}, {.first = 5, .count = 5}}));
    CHECK_NOTHROW(State(so::SGD{.global_clipnorm = 1}, 10, {{.first = 0, .count = 10}}));
}

namespace {
using SmallNet = strata::nn::Sequential<strata::nn::Input<6, 6, 2>, strata::nn::Flatten, strata::nn::Dense<5, strata::nn::Tanh>,
                                        strata::nn::Dense<3, strata::nn::Softmax>>;
template <class Strategy>
std::vector<double> train_small(Strategy& s, const so::Optimizer& o) {
    strata::Model<SmallNet, Strategy, double> model(s, 7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, o);
    model.fit(strata_test::images(40, 3).batch(10), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}
}  // namespace

TEST_CASE("global_clipnorm clips the reduced gradient: Mirrored and CentralStorage equal OneDevice") {
    namespace dist = strata::distribute;
    for (const so::Optimizer& o : {so::Optimizer{so::AdamW{.learning_rate = 0.05, .weight_decay = 0.1, .global_clipnorm = 0.01}},
                                   so::Optimizer{so::SGD{.learning_rate = 0.5, .momentum = 0.9, .global_clipnorm = 0.01}}}) {
        INFO(so::describe(o));
        dist::OneDevice<> one;
        const auto reference = train_small(one, o);
        for (int n : {2, 3}) {
            INFO(n, " replicas");
            dist::Mirrored<> mirrored(n);
            CHECK(strata_test::max_relative_difference(train_small(mirrored, o), reference) <= 1e-12);
            dist::CentralStorage<> central(n);
            CHECK(strata_test::max_relative_difference(train_small(central, o), reference) <= 1e-12);
        }
        // The control: the clipping is engaged (the same run without it ends elsewhere).
        so::Optimizer unclipped = o;
        std::visit([](auto& x) { x.global_clipnorm = 0; }, unclipped);
        dist::OneDevice<> again;
        CHECK(strata_test::max_relative_difference(train_small(again, unclipped), reference) > 1e-3);
    }
}

TEST_CASE("AdamW with global_clipnorm and CosineDecay: save, load, continue equals training straight through") {
    namespace fs = std::filesystem;
    const auto path = strata_test::temp_path("adamw.safetensors");
    const so::Optimizer o = so::AdamW{.learning_rate = so::CosineDecay{.initial_learning_rate = 0.0, .decay_steps = 20,
                                                                         .alpha = 0.1, .warmup_target = 0.05, .warmup_steps = 5},
                                      .weight_decay = 0.1, .global_clipnorm = 0.02};
    auto data = strata_test::images(40, 3).batch(10);
    auto make = [&] {
        auto m = std::make_unique<strata::Model<SmallNet, strata::distribute::Default, double>>(7);
        m->compile(strata::loss::SparseCategoricalCrossentropy{}, o);
        return m;
    };
    auto straight = make();
    straight->fit(data, {.epochs = 4, .verbose = 0});
    auto first = make();
    first->fit(data, {.epochs = 2, .verbose = 0});
    first->save(path);
    {
        auto f = strata::io::SafetensorsFile::load(path);
        CHECK(f.contains("optimizer/momentum/dense/kernel"));
        CHECK(f.contains("optimizer/velocity/dense_1/bias"));
        CHECK(f.metadata("optimizer") == "AdamW");
        CHECK(f.metadata("optimizer_iterations") == "8");
    }
    auto resumed = make();
    resumed->load(path);
    resumed->fit(data, {.epochs = 4, .verbose = 0, .initial_epoch = 2});
    CHECK(resumed->get_weights() == straight->get_weights());
    // Adam's state is not AdamW's: refused when strict.
    strata::Model<SmallNet, strata::distribute::Default, double> adam(7);
    adam.compile(strata::loss::SparseCategoricalCrossentropy{}, so::Adam{});
    CHECK_THROWS_WITH_AS(adam.load(path), doctest::Contains("AdamW"), strata::CheckpointError);
    fs::remove(path);
}
