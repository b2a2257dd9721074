// The transformer layers (issue 43): GELU and its tanh approximation, LayerNormalization and
// MultiHeadAttention, each against a float64 reference written plainly here and its backward
// against central finite differences (f = sum(w ⊙ y), h = 1e-6, the error measured against the
// gradient's own scale as in test_layers.cpp), plus negative controls that show each check can
// fail: a derivative taken from the output instead of the input, the causal mask switched off.
//
// The cases templated on the place also run on Cuda when this file is compiled by nvcc
// (test_transformer.cu); the host is the oracle. Training through Model is host-only here.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/nn/layers.hpp>

#include "test_places.hpp"

#if !defined(__CUDACC__)
#include <strata/strata.hpp>

#include "training_util.hpp"
#endif

using strata::Shape;
using strata::StaticShape;
using strata::Tensor;
using strata::TensorView;
using namespace strata::nn;
using strata_test::reference_values;

namespace {

using Host = strata::place::Host;

template <class T, class P>
Tensor<T, P> on_place(const std::vector<double>& v, const Shape& shape) {
    std::vector<T> t(v.begin(), v.end());
    return strata::copy_to<P>(strata::from_vector(t, shape).view());
}

template <class T, class P>
std::vector<double> as_double(const TensorView<T, P>& t) {
    auto v = strata::to_vector(t);
    return std::vector<double>(v.begin(), v.end());
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// max_i |a_i − b_i| / max_i |b_i| (0 when both are all zeros).
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(a[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return scale == 0 ? diff : diff / scale;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

/// One bound layer with its parameters and input as host float64 vectors (which the finite
/// differences perturb), run on place P in precision T.
template <class Spec, class In, class T = double, class P = Host>
struct LayerRun {
    using Layer = typename Spec::template bind<In, T, P>;
    using Out = typename Layer::output_shape;
    Layer layer{};
    std::int64_t n;
    Mode mode;
    std::vector<double> params, x;

    LayerRun(std::int64_t batch, std::vector<double> p, std::vector<double> in, Mode m = {})
        : n(batch), mode(m), params(std::move(p)), x(std::move(in)) {
        REQUIRE(std::int64_t(params.size()) == Layer::num_params);
        REQUIRE(std::int64_t(x.size()) == n * In::size);
    }
    std::int64_t out_size() const { return n * Out::size; }

    struct Result {
        std::vector<double> y, dx, dparams;
    };
    /// Forward, then (when w is given) backward with dy = w.
    Result run(const std::vector<double>* w = nullptr) {
        auto p = on_place<T, P>(params, Shape{Layer::num_params});
        auto xt = on_place<T, P>(x, In::batched(n));
        Tensor<T, P> y(Out::batched(n));
        layer.forward(p.data(), xt.view(), y.view(), mode);
        Result r;
        r.y = as_double(y.view());
        if (!w) return r;
        auto dy = on_place<T, P>(*w, Out::batched(n));
        Tensor<T, P> dx(In::batched(n)), g(Shape{Layer::num_params});
        strata::fill(g.view(), T(12345));  // backward must overwrite every slot
        layer.backward(p.data(), g.data(), xt.view(), y.view(), dy.view(), dx.view(), mode);
        r.dx = as_double(dx.view());
        r.dparams = as_double(g.view());
        return r;
    }
    std::vector<double> forward() { return run().y; }
};

/// Central differences of f = sum(w ⊙ y) w.r.t. every entry of `v` (a vector of `run`).
template <class Run>
std::vector<double> finite_differences(Run& run, std::vector<double>& v, const std::vector<double>& w) {
    const double h = 1e-6;
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        const double old = v[i];
        v[i] = old + h;
        const double fp = dot(w, run.forward());
        v[i] = old - h;
        const double fm = dot(w, run.forward());
        v[i] = old;
        out[i] = (fp - fm) / (2 * h);
    }
    return out;
}

/// The input and parameter gradients of `run` against finite differences; per named variable
/// when `info` is given (a small variable's error is not hidden by a large one's scale).
/// A variable named in `zero` has a gradient that is 0 in exact arithmetic (attention's key
/// bias: it adds q·b to every score of a row, which the softmax ignores): both it and the finite
/// differences must be at rounding level.
template <class Run>
void check_gradients(Run& run, std::uint64_t seed, const std::vector<ParamInfo>& info = {}, const std::vector<std::string>& zero = {}) {
    const auto w = reference_values(run.out_size(), seed + 7, -1, 1);
    const auto g = run.run(&w);
    const auto fd_x = finite_differences(run, run.x, w);
    const auto fd_p = finite_differences(run, run.params, w);
    INFO("input gradient relative error " << relative_error(fd_x, g.dx));
    CHECK(relative_error(fd_x, g.dx) <= 1e-6);
    CHECK(std::any_of(g.dx.begin(), g.dx.end(), [](double v) { return v != 0; }));
    if (info.empty()) {
        INFO("parameter gradient relative error " << relative_error(fd_p, g.dparams));
        CHECK(relative_error(fd_p, g.dparams) <= 1e-6);
    }
    for (const auto& p : info) {
        const auto first = std::ptrdiff_t(p.offset), count = std::ptrdiff_t(p.shape.size());
        std::vector<double> a(fd_p.begin() + first, fd_p.begin() + first + count), b(g.dparams.begin() + first, g.dparams.begin() + first + count);
        if (std::find(zero.begin(), zero.end(), p.name) != zero.end()) {
            INFO(p.name << ": largest |gradient| " << max_abs_diff(b, std::vector<double>(b.size(), 0.0)) << ", largest |finite difference| "
                        << max_abs_diff(a, std::vector<double>(a.size(), 0.0)));
            CHECK(max_abs_diff(b, std::vector<double>(b.size(), 0.0)) <= 1e-12);
            CHECK(max_abs_diff(a, std::vector<double>(a.size(), 0.0)) <= 1e-8);
            continue;
        }
        INFO(p.name << ": relative error " << relative_error(a, b));
        CHECK(relative_error(a, b) <= 1e-6);
        // A variable whose gradient is identically zero would pass the relative test trivially.
        CHECK(std::any_of(b.begin(), b.end(), [](double v) { return v != 0; }));
    }
}

// ---- GELU ------------------------------------------------------------------------------------

// The references in long double (x86's 80-bit: 11 more bits than double), Keras' formulas
// (keras.activations.gelu): exact 0.5 x (1 + erf(x / √2)), written through erfc for x < 0 so
// the tail keeps its digits; tanh form 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
long double gelu_ref(long double x) {
    return x >= 0 ? 0.5L * x * (1.0L + std::erf(x / std::sqrt(2.0L))) : 0.5L * x * std::erfc(-x / std::sqrt(2.0L));
}
long double gelu_tanh_ref(long double x) {
    const long double k = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
    return 0.5L * x * (1.0L + std::tanh(k * (x + 0.044715L * x * x * x)));
}

// Points: 0, a spread over [-8, 8] (the tail, the minimum near -0.75, the bend), and large ±.
std::vector<double> gelu_points() {
    std::vector<double> v{0.0, 1.0, -1.0, 0.5, -0.5, -0.7517915, 3.0, -3.0, -6.0, 6.0, -12.0, 12.0, 1e-8, -1e-8};
    for (int i = 0; i <= 64; ++i) v.push_back(-8.0 + 0.25 * i + 0.0123);
    return v;
}

template <class Act>
long double act_ref(long double x) {
    if constexpr (std::is_same_v<Act, GELU>) return gelu_ref(x);
    else return gelu_tanh_ref(x);
}

template <class Act>
void check_gelu_values_and_derivative() {
    INFO(Act::name);
    for (double x : gelu_points()) {
        CAPTURE(x);
        const long double ref = act_ref<Act>(x);
        const double y = Act::apply(x);
        // The exact form relative to the value (erfc keeps the far tail's digits; the rounding
        // of x/√2 is amplified ~z² there); the tanh form, like Keras' own, computes 1 + tanh(u),
        // which cancels in the tail: absolute, at the rounding of x.
        constexpr bool exact = std::is_same_v<Act, GELU>;
        const double tol = exact ? 1e-15 * (1 + x * x) * std::abs(double(ref)) : 4e-16 * (1 + std::abs(x));
        CHECK(std::abs(y - double(ref)) <= tol);
        const float yf = Act::apply(float(x));
        const double ref_f = double(act_ref<Act>(float(x)));
        CHECK(std::abs(double(yf) - ref_f) <= (exact ? 1e-6 * (1 + x * x) * std::abs(ref_f) : 3e-7 * (1 + std::abs(x))));
        // The derivative against central differences of the long double reference (h = 1e-5:
        // truncation ~h² f''' ~ 1e-10, rounding ~1e-19 / h).
        const long double h = 1e-5L;
        const double fd = double((act_ref<Act>(x + h) - act_ref<Act>(x - h)) / (2 * h));
        const double d = Act::grad_from_input(x, 1.0);
        CHECK(std::abs(d - fd) <= 1e-9);
        CHECK(Act::grad_from_input(x, -2.5) == doctest::Approx(-2.5 * d).epsilon(1e-15));
        const float df = Act::grad_from_input(float(x), 1.0f);
        CHECK(std::abs(double(df) - d) <= 2e-6);
    }
    // Exact values: GELU(0) = 0 and GELU'(0) = 1/2 (both forms); the far sides are x and 0.
    CHECK(Act::apply(0.0) == 0.0);
    CHECK(Act::grad_from_input(0.0, 1.0) == 0.5);
    for (double big : {50.0, 1e3, 1e30, std::numeric_limits<double>::max()}) {
        CHECK(Act::apply(big) == big);
        CHECK(Act::apply(-big) == 0.0);
        CHECK(Act::grad_from_input(big, 1.0) == 1.0);
        CHECK(Act::grad_from_input(-big, 1.0) == 0.0);
        CHECK(Act::apply(float(std::min(big, 1e30))) == float(std::min(big, 1e30)));
        CHECK(Act::apply(-float(std::min(big, 1e30))) == 0.0f);
    }
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    CHECK(Act::apply(inf) == inf);
    CHECK(Act::apply(-inf) == 0.0);
    CHECK(Act::grad_from_input(inf, 1.0) == 1.0);
    CHECK(Act::grad_from_input(-inf, 1.0) == 0.0);
    CHECK(std::isnan(Act::apply(nan)));
    CHECK(std::isnan(Act::grad_from_input(nan, 1.0)));
    CHECK(std::isnan(Act::grad_from_input(1.0, nan)));
    CHECK(std::isnan(Act::grad_from_input(-50.0, nan)));
}

// ---- LayerNormalization ---------------------------------------------------------------------

// The reference: per row (the last axis), mean and biased variance in long double,
// y = gamma (x - mean) / sqrt(var + eps) + beta.
std::vector<double> layer_norm_ref(const std::vector<double>& x, std::int64_t C, const double* gamma, const double* beta, double eps) {
    std::vector<double> y(x.size());
    const std::int64_t rows = std::int64_t(x.size()) / C;
    for (std::int64_t r = 0; r < rows; ++r) {
        long double m = 0, v = 0;
        for (std::int64_t c = 0; c < C; ++c) m += x[std::size_t(r * C + c)];
        m /= C;
        for (std::int64_t c = 0; c < C; ++c) v += (x[std::size_t(r * C + c)] - m) * (x[std::size_t(r * C + c)] - m);
        v /= C;
        for (std::int64_t c = 0; c < C; ++c)
            y[std::size_t(r * C + c)] = double((gamma ? gamma[c] : 1.0) * (x[std::size_t(r * C + c)] - m) / std::sqrt(v + eps) + (beta ? beta[c] : 0.0));
    }
    return y;
}

template <class Spec, class In>
LayerRun<Spec, In> random_run(std::int64_t n, std::uint64_t seed) {
    using L = typename Spec::template bind<In, double, Host>;
    auto p = reference_values(L::num_params, seed, 0.5, 1.5);  // gamma near 1, beta in [0.5, 1.5)
    return LayerRun<Spec, In>(n, p, reference_values(n * In::size, seed + 1, -2, 2));
}

}  // namespace

TEST_CASE("GELU and GELUTanh: values against a long double reference, derivatives against finite differences, the far sides, inf and NaN") {
    check_gelu_values_and_derivative<GELU>();
    check_gelu_values_and_derivative<GELUTanh>();
    // Published values (Python's math.erfc and math.tanh): the two forms differ by ~1e-4 near 1.
    CHECK(GELU::apply(1.0) == doctest::Approx(0.8413447460685429).epsilon(1e-15));
    CHECK(GELU::apply(-1.0) == doctest::Approx(-0.15865525393145707).epsilon(1e-15));
    CHECK(GELU::apply(-6.0) == doctest::Approx(-5.919525870226207e-09).epsilon(1e-14));
    CHECK(GELUTanh::apply(1.0) == doctest::Approx(0.8411919906082768).epsilon(1e-15));
    CHECK(GELUTanh::apply(-3.0) == doctest::Approx(-0.0036373920817729943).epsilon(1e-14));
    CHECK(std::abs(GELU::apply(1.0) - GELUTanh::apply(1.0)) > 1e-4);
    static_assert(grad_needs_input_v<GELU> && grad_needs_input_v<GELUTanh> && !grad_needs_input_v<ReLU>);
}

TEST_CASE("GELU in Dense and ActivationLayer: finite-difference gradients, and the derivative from the output fails them") {
    using In = StaticShape<7>;
    {
        auto run = random_run<Dense<5, GELU>, In>(3, 1);
        check_gradients(run, 1);
    }
    {
        auto run = random_run<Dense<5, GELUTanh, false>, In>(3, 2);
        check_gradients(run, 2);
    }
    {
        LayerRun<ActivationLayer<GELU>, StaticShape<4, 6>> run(3, {}, reference_values(3 * 24, 3, -4, 4));
        check_gradients(run, 3);
        // The layer's output is GELU of its input, value by value.
        const auto y = run.forward();
        for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == GELU::apply(run.x[i]));
    }
    {
        LayerRun<ActivationLayer<GELUTanh>, StaticShape<9>> run(2, {}, reference_values(18, 4, -4, 4));
        check_gradients(run, 4);
    }
    // Negative control: the derivative evaluated at the output y (what an output-based
    // activation does) instead of the input is far from the finite differences.
    const auto x = reference_values(64, 5, -3, 3);
    double worst = 0;
    for (double v : x) {
        const double fd = (GELU::apply(v + 1e-6) - GELU::apply(v - 1e-6)) / 2e-6;
        worst = std::max(worst, std::abs(GELU::grad_from_input(GELU::apply(v), 1.0) - fd));
        CHECK(std::abs(GELU::grad_from_input(v, 1.0) - fd) <= 1e-8);
    }
    CHECK(worst > 0.1);
}

TEST_CASE("Dense<GELU> in a Network: the parameter gradients through the flat buffers, forward without backward keeps nothing") {
    using Seq = Sequential<Input<6>, Dense<8, GELU>, Dense<4, GELUTanh>, Dense<3>>;
    Network<Seq, double, Host> net;
    std::vector<double> params(std::size_t(Seq::num_params)), grads(params.size());
    net.init(params.data(), 3);
    params = reference_values(Seq::num_params, 4, -0.8, 0.8);
    const std::int64_t n = 5;
    auto x = on_place<double, Host>(reference_values(n * 6, 5, -2, 2), Seq::input_shape::batched(n));
    const auto w = reference_values(n * 3, 6);
    auto objective = [&] { return dot(w, as_double(net.forward(params.data(), x.view(), Mode{}))); };
    objective();
    std::copy(w.begin(), w.end(), net.output_grad().data());
    net.backward(params.data(), grads.data(), Mode{});
    std::vector<double> fd(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
        const double old = params[i];
        params[i] = old + 1e-6;
        const double fp = objective();
        params[i] = old - 1e-6;
        const double fm = objective();
        params[i] = old;
        fd[i] = (fp - fm) / 2e-6;
    }
    for (const auto& p : Seq::parameters()) {
        const auto first = std::ptrdiff_t(p.offset), count = std::ptrdiff_t(p.shape.size());
        std::vector<double> a(fd.begin() + first, fd.begin() + first + count), b(grads.begin() + first, grads.begin() + first + count);
        INFO(p.name << ": relative error " << relative_error(a, b));
        CHECK(relative_error(a, b) <= 1e-6);
    }
    // Inference (no_backward) gives the same output.
    const auto train_y = as_double(net.forward(params.data(), x.view(), Mode{}));
    CHECK(as_double(net.forward(params.data(), x.view(), Mode{.no_backward = true})) == train_y);
}

TEST_CASE_TEMPLATE("GELU layers on every place match the host's float64 values", P, STRATA_TEST_PLACES) {
    const auto x = reference_values(2 * 40, 8, -7, 7);
    LayerRun<ActivationLayer<GELU>, StaticShape<40>, float, P> f(2, {}, x);
    LayerRun<ActivationLayer<GELUTanh>, StaticShape<40>, double, P> d(2, {}, x);
    const auto w = reference_values(80, 9);
    const auto rf = f.run(&w);
    const auto rd = d.run(&w);
    for (std::size_t i = 0; i < x.size(); ++i) {
        CHECK(std::abs(rf.y[i] - GELU::apply(x[i])) <= 1e-6 * (1 + std::abs(x[i])));
        CHECK(std::abs(rf.dx[i] - GELU::grad_from_input(x[i], w[i])) <= 1e-6);
        CHECK(std::abs(rd.y[i] - GELUTanh::apply(x[i])) <= 1e-15 * (1 + std::abs(x[i])));
        CHECK(std::abs(rd.dx[i] - GELUTanh::grad_from_input(x[i], w[i])) <= 1e-15);
    }
}

TEST_CASE("the exact GELU in float on the host, eight lanes: against long double, the same bits wherever a value sits, and Dense's rows use it") {
    using strata::nn::detail::gelu_grad_simd;
    using strata::nn::detail::gelu_row_simd;
    if (!strata::nn::detail::gelu_simd) {
        MESSAGE("this unit is compiled without AVX2 and FMA: Dense keeps the per-value std::erfc form, checked above");
        return;
    }
    // GELU'(x) = Φ(x) + x φ(x), in long double.
    auto grad_ref = [](long double x) {
        return 0.5L * std::erfc(-x / std::sqrt(2.0L)) +
               x * std::exp(-0.5L * x * x) / std::sqrt(2.0L * 3.14159265358979323846264338327950288L);
    };
    // 1. 200 001 points of [-12, 12] (and NaN, ±inf, ±0, ±50 below): within 2e-6 of the value
    //    wherever it is a normal float, the derivative within 1e-6; and not the per-value form's bits
    //    (which of the two ran is told apart).
    const int n = 200001;
    std::vector<float> x(static_cast<std::size_t>(n)), y, dy(static_cast<std::size_t>(n), 1.0f);
    for (int i = 0; i < n; ++i) x[std::size_t(i)] = -12.0f + 24.0f * float(i) / float(n - 1);
    y = x;
    gelu_row_simd(y.data(), nullptr, nullptr, n);
    gelu_grad_simd(x.data(), dy.data(), n);
    double worst = 0, worst_grad = 0;
    int other_bits = 0;
    for (int i = 0; i < n; ++i) {
        const float xi = x[std::size_t(i)];
        const long double ref = gelu_ref(xi);
        if (std::abs(double(ref)) >= double(std::numeric_limits<float>::min()))
            worst = std::max(worst, std::abs(double((y[std::size_t(i)] - ref) / ref)));
        worst_grad = std::max(worst_grad, std::abs(double(dy[std::size_t(i)] - grad_ref(xi))));
        const float per_value = GELU::apply(xi);
        other_bits += std::memcmp(&per_value, &y[std::size_t(i)], sizeof(float)) != 0;
    }
    INFO("worst relative error " << worst << ", derivative " << worst_grad);
    CHECK(worst <= 2e-6);
    CHECK(worst_grad <= 1e-6);
    CHECK(other_bits > 1000);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> sx{inf, -inf, nan, 0.0f, -0.0f, 50.0f, -50.0f, 1e30f, -1e30f, -20.0f, 1.0f};
    std::vector<float> sy = sx, sd(sx.size(), 1.0f);
    gelu_row_simd(sy.data(), nullptr, nullptr, std::int64_t(sy.size()));
    gelu_grad_simd(sx.data(), sd.data(), std::int64_t(sd.size()));
    CHECK(sy[0] == inf);
    CHECK(sd[0] == 1.0f);
    CHECK(sy[1] == 0.0f);
    CHECK(sd[1] == 0.0f);
    CHECK(std::isnan(sy[2]));
    CHECK(std::isnan(sd[2]));
    CHECK(sy[3] == 0.0f);
    CHECK(sd[3] == 0.5f);
    CHECK(sd[4] == 0.5f);
    CHECK(sy[5] == 50.0f);
    CHECK(sd[5] == 1.0f);
    CHECK(sy[6] == 0.0f);
    CHECK(sd[6] == 0.0f);
    CHECK(sy[7] == 1e30f);
    CHECK(sy[8] == 0.0f);
    CHECK(sy[9] == 0.0f);  // Φ(-20) is far below float's least subnormal
    CHECK(std::abs(double(sy[10]) - 0.8413447460685429) <= 1e-7);
    std::vector<float> nan_dy{nan}, at{-50.0f};
    gelu_grad_simd(at.data(), nan_dy.data(), 1);
    CHECK(std::isnan(nan_dy[0]));  // dy · 0 stays NaN, as the per-value form's

    // 2. A value's bits do not depend on where it sits: rows of 1 to 19 copies (full lanes and
    //    padded tails), with and without a bias, kept pre-activations included.
    for (float v : {-0.7517915f, 2.5f, -6.125f, 1e-3f}) {
        CAPTURE(v);
        float one = v, g1 = 1.0f, pre1 = v;
        gelu_row_simd(&one, nullptr, nullptr, 1);
        gelu_grad_simd(&pre1, &g1, 1);
        for (std::int64_t len = 1; len <= 19; ++len) {
            std::vector<float> row(static_cast<std::size_t>(len), 0.0f), bias(static_cast<std::size_t>(len), v), keep(static_cast<std::size_t>(len)), g(static_cast<std::size_t>(len), 1.0f);
            gelu_row_simd(row.data(), keep.data(), bias.data(), len);
            std::vector<float> pre(std::size_t(len), v);
            gelu_grad_simd(pre.data(), g.data(), len);
            for (std::int64_t c = 0; c < len; ++c) {
                CHECK(std::memcmp(&row[std::size_t(c)], &one, sizeof(float)) == 0);
                CHECK(keep[std::size_t(c)] == v);
                CHECK(std::memcmp(&g[std::size_t(c)], &g1, sizeof(float)) == 0);
            }
        }
    }

    // 3. Dense<11, GELU> in float on the host is Dense<11> (the same GEMM and bias) followed by the
    //    eight-lane GELU, bit for bit, forward and backward.
    using Gelu = Sequential<Input<6>, Dense<11, GELU>>;
    using Lin = Sequential<Input<6>, Dense<11>>;
    Network<Gelu, float, Host> g;
    Network<Lin, float, Host> l;
    const auto pd = reference_values(Gelu::num_params, 21, -0.8, 0.8);
    std::vector<float> params(pd.begin(), pd.end()), gg(params.size()), gl(params.size());
    const std::int64_t rows = 5;
    auto xin = on_place<float, Host>(reference_values(rows * 6, 22, -2, 2), Gelu::input_shape::batched(rows));
    const auto yg = g.forward(params.data(), xin.view(), Mode{});
    const auto yl = l.forward(params.data(), xin.view(), Mode{});
    std::vector<float> pre(yl.data(), yl.data() + yl.size()), want = pre;
    gelu_row_simd(want.data(), nullptr, nullptr, std::int64_t(want.size()));
    CHECK(std::memcmp(want.data(), yg.data(), want.size() * sizeof(float)) == 0);
    const auto wd = reference_values(rows * 11, 23, -1, 1);
    std::vector<float> w(wd.begin(), wd.end()), wpre = w;
    gelu_grad_simd(pre.data(), wpre.data(), std::int64_t(wpre.size()));
    std::copy(w.begin(), w.end(), g.output_grad().data());
    g.backward(params.data(), gg.data(), Mode{});
    std::copy(wpre.begin(), wpre.end(), l.output_grad().data());
    l.backward(params.data(), gl.data(), Mode{});
    CHECK(std::memcmp(gg.data(), gl.data(), gg.size() * sizeof(float)) == 0);

    // 4. ActivationLayer<GELU> in float on the host: the same lanes, forward and backward (1300
    //    values: a block of 1024 and a tail).
    using Act = Sequential<Input<13>, ActivationLayer<GELU>>;
    Network<Act, float, Host> a;
    const std::int64_t arows = 100;
    const auto ad = reference_values(arows * 13, 24, -7, 7);
    auto ax = on_place<float, Host>(ad, Act::input_shape::batched(arows));
    const auto ay = a.forward(nullptr, ax.view(), Mode{});
    std::vector<float> axv(ax.data(), ax.data() + ax.size()), aw = axv;
    gelu_row_simd(aw.data(), nullptr, nullptr, std::int64_t(aw.size()));
    CHECK(std::memcmp(aw.data(), ay.data(), aw.size() * sizeof(float)) == 0);
    const auto agd = reference_values(arows * 13, 25, -1, 1);
    std::vector<float> ag(agd.begin(), agd.end()), agw = ag;
    gelu_grad_simd(axv.data(), agw.data(), std::int64_t(agw.size()));
    std::copy(ag.begin(), ag.end(), a.output_grad().data());
    auto adx = on_place<float, Host>(std::vector<double>(ag.size()), Act::input_shape::batched(arows));
    a.backward(nullptr, nullptr, Mode{}, nullptr, adx.view());
    CHECK(std::memcmp(agw.data(), adx.data(), agw.size() * sizeof(float)) == 0);
}

TEST_CASE("the attention's softmax in float on the host, eight lanes: against long double, masked tails, the same bits for the same row") {
    using strata::nn::detail::softmax_row_simd;
    if (!strata::nn::detail::gelu_simd) {
        MESSAGE("this unit is compiled without AVX2 and FMA: the attention keeps its per-row std::exp form");
        return;
    }
    double worst = 0;
    for (std::int64_t S : {1, 2, 7, 8, 9, 16, 49, 50}) {
        for (std::int64_t valid : {std::int64_t(1), S / 2 + 1, S}) {
            CAPTURE(S);
            CAPTURE(valid);
            const auto d = reference_values(S, std::uint64_t(100 + S * 7 + valid), -12, 12);
            std::vector<float> row(d.begin(), d.end());
            std::vector<float> copy = row;
            softmax_row_simd(row.data(), valid, S);
            long double m = copy[0], sum = 0;
            for (std::int64_t j = 1; j < valid; ++j) m = std::max<long double>(m, copy[std::size_t(j)]);
            for (std::int64_t j = 0; j < valid; ++j) sum += std::exp((long double)copy[std::size_t(j)] - m);
            double total = 0;
            for (std::int64_t j = 0; j < S; ++j) {
                if (j >= valid) {
                    CHECK(row[std::size_t(j)] == 0.0f);
                    continue;
                }
                const long double ref = std::exp((long double)copy[std::size_t(j)] - m) / sum;
                worst = std::max(worst, double(std::abs((row[std::size_t(j)] - ref) / ref)));
                total += row[std::size_t(j)];
            }
            CHECK(std::abs(total - 1.0) <= 1e-6 * double(valid));
            // The same scores give the same bits (a copy at another address, another row).
            std::vector<float> again(copy.begin(), copy.end());
            softmax_row_simd(again.data(), valid, S);
            CHECK(std::memcmp(again.data(), row.data(), row.size() * sizeof(float)) == 0);
        }
    }
    // The score minus the row's maximum is rounded to float first, as the per-row form rounds it:
    // up to 24 · 2^-25 ≈ 7e-7 in the exponent here; the lanes' exp adds 2 units in the last place.
    INFO("worst relative error " << worst);
    CHECK(worst <= 2e-6);
}

// ---- LayerNormalization ---------------------------------------------------------------------

TEST_CASE_TEMPLATE("LayerNormalization matches a float64 reference over the last axis, any rank", P, STRATA_TEST_PLACES) {
    SUBCASE("[features]") {
        LayerRun<LayerNormalization<>, StaticShape<7>, double, P> run(4, reference_values(14, 1, 0.5, 1.5), reference_values(28, 2, -3, 3));
        const auto y = run.forward();
        CHECK(max_abs_diff(y, layer_norm_ref(run.x, 7, run.params.data(), run.params.data() + 7, 1e-3)) <= 1e-13);
    }
    SUBCASE("[tokens, features]: each token normalized on its own") {
        LayerRun<LayerNormalization<>, StaticShape<5, 6>, double, P> run(3, reference_values(12, 3, 0.5, 1.5), reference_values(90, 4, -3, 3));
        const auto y = run.forward();
        CHECK(max_abs_diff(y, layer_norm_ref(run.x, 6, run.params.data(), run.params.data() + 6, 1e-3)) <= 1e-13);
        // Against normalizing over the whole example (the wrong axis): far.
        CHECK(max_abs_diff(y, layer_norm_ref(run.x, 30, nullptr, nullptr, 1e-3)) > 0.1);
    }
    SUBCASE("[H, W, C], epsilon 1e-5, no center") {
        using Spec = LayerNormalization<LayerNormOptions{.epsilon = 1e-5, .center = false}>;
        LayerRun<Spec, StaticShape<2, 3, 4>, double, P> run(2, reference_values(4, 5, 0.5, 1.5), reference_values(48, 6, -3, 3));
        CHECK(max_abs_diff(run.forward(), layer_norm_ref(run.x, 4, run.params.data(), nullptr, 1e-5)) <= 1e-13);
    }
    SUBCASE("rows far from 0 (two-pass statistics): 1e6 + small values") {
        auto x = reference_values(2 * 4 * 8, 7, -1, 1);
        for (auto& v : x) v += 1e6;
        LayerRun<LayerNormalization<LayerNormOptions{.center = false, .scale = false}>, StaticShape<4, 8>, double, P> run(2, {}, x);
        CHECK(max_abs_diff(run.forward(), layer_norm_ref(x, 8, nullptr, nullptr, 1e-3)) <= 1e-9);
    }
    SUBCASE("float, 16 tokens of 32 features, against the float64 reference") {
        LayerRun<LayerNormalization<>, StaticShape<16, 32>, float, P> run(3, reference_values(64, 8, 0.5, 1.5), reference_values(3 * 512, 9, -3, 3));
        std::vector<double> pf(run.params.begin(), run.params.end()), xf(run.x.begin(), run.x.end());
        for (auto& v : pf) v = double(float(v));
        for (auto& v : xf) v = double(float(v));
        CHECK(max_abs_diff(run.forward(), layer_norm_ref(xf, 32, pf.data(), pf.data() + 32, 1e-3)) <= 2e-6);
    }
    SUBCASE("a constant row gives beta (variance 0, epsilon keeps it finite); one feature gives beta") {
        std::vector<double> x(2 * 5, 3.25);
        LayerRun<LayerNormalization<>, StaticShape<5>, double, P> run(2, reference_values(10, 10, 0.5, 1.5), x);
        const auto y = run.forward();
        for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == run.params[5 + i % 5]);
        LayerRun<LayerNormalization<>, StaticShape<3, 1>, double, P> one(2, {2.0, 0.25}, reference_values(6, 11));
        for (double v : one.forward()) CHECK(v == 0.25);
    }
}

TEST_CASE_TEMPLATE("LayerNormalization gradients (input, gamma, beta) on every place against the host's", P, STRATA_TEST_PLACES) {
    using In = StaticShape<5, 12>;
    const auto p = reference_values(24, 21, 0.5, 1.5);
    const auto x = reference_values(3 * 60, 22, -2, 2);
    const auto w = reference_values(3 * 60, 23);
    LayerRun<LayerNormalization<>, In, double, Host> host(3, p, x);
    LayerRun<LayerNormalization<>, In, double, P> here(3, p, x);
    LayerRun<LayerNormalization<>, In, float, P> here_f(3, p, x);
    const auto a = host.run(&w);
    const auto b = here.run(&w);
    const auto c = here_f.run(&w);
    CHECK(relative_error(b.y, a.y) <= 1e-14);
    CHECK(relative_error(b.dx, a.dx) <= 1e-13);
    CHECK(relative_error(b.dparams, a.dparams) <= 1e-13);
    CHECK(relative_error(c.y, a.y) <= 1e-6);
    CHECK(relative_error(c.dx, a.dx) <= 1e-5);
    CHECK(relative_error(c.dparams, a.dparams) <= 1e-5);
}

TEST_CASE("LayerNormalization gradients match finite differences: input, gamma and beta") {
    SUBCASE("[features]") {
        auto run = random_run<LayerNormalization<>, StaticShape<7>>(3, 31);
        check_gradients(run, 31, LayerNormalization<>::bind<StaticShape<7>, double, Host>::param_info());
    }
    SUBCASE("[tokens, features]") {
        auto run = random_run<LayerNormalization<>, StaticShape<4, 6>>(2, 32);
        check_gradients(run, 32, LayerNormalization<>::bind<StaticShape<4, 6>, double, Host>::param_info());
    }
    SUBCASE("[H, W, C], tiny epsilon") {
        using Spec = LayerNormalization<LayerNormOptions{.epsilon = 1e-9}>;
        auto run = random_run<Spec, StaticShape<2, 2, 3>>(2, 33);
        check_gradients(run, 33, Spec::bind<StaticShape<2, 2, 3>, double, Host>::param_info());
    }
    SUBCASE("scale only, center only, neither") {
        using S = LayerNormalization<LayerNormOptions{.center = false}>;
        using Cn = LayerNormalization<LayerNormOptions{.scale = false}>;
        using N = LayerNormalization<LayerNormOptions{.center = false, .scale = false}>;
        auto a = random_run<S, StaticShape<3, 5>>(2, 34);
        check_gradients(a, 34, S::bind<StaticShape<3, 5>, double, Host>::param_info());
        auto b = random_run<Cn, StaticShape<3, 5>>(2, 35);
        check_gradients(b, 35, Cn::bind<StaticShape<3, 5>, double, Host>::param_info());
        auto c = random_run<N, StaticShape<3, 5>>(2, 36);
        check_gradients(c, 36);
    }
}

TEST_CASE("LayerNormalization: Keras' variables, initial values and summary; errors") {
    using L = LayerNormalization<>::bind<StaticShape<16, 32>, float, Host>;
    const auto info = L::param_info();
    REQUIRE(info.size() == 2);
    CHECK(info[0].name == "gamma");
    CHECK(info[0].shape == Shape{32});
    CHECK(info[1].name == "beta");
    CHECK(info[1].offset == 32);
    CHECK(L::num_params == 64);
    std::vector<float> p(64, -7.0f);
    L().init(p.data(), 1, 0);
    for (int i = 0; i < 32; ++i) {
        CHECK(p[std::size_t(i)] == 1.0f);
        CHECK(p[std::size_t(32 + i)] == 0.0f);
    }
    CHECK(LayerNormalization<LayerNormOptions{.center = false}>::bind<StaticShape<8>, float, Host>::num_params == 8);
    CHECK(LayerNormalization<>::options.epsilon == 1e-3);
    using Seq = Sequential<Input<16, 32>, LayerNormalization<>, LayerNormalization<>>;
    const auto names = Seq::parameters();
    CHECK(names[0].name == "layer_normalization/gamma");
    CHECK(names[3].name == "layer_normalization_1/beta");
    CHECK(strata_test::has(Seq::summary(), "layer_normalization (LayerNormalization)"));
    // Backward without a forward on that batch: a typed error naming both batch sizes.
    LayerNormalization<>::bind<StaticShape<4>, double, Host> fresh;
    std::vector<double> params(8, 1.0), grads(8), x(12), dy(12), dx(12);
    const TensorView<double, Host> xv(x.data(), Shape{3, 4}), dyv(dy.data(), Shape{3, 4}), dxv(dx.data(), Shape{3, 4});
    const auto msg = strata_test::error_of<strata::ValueError>([&] { fresh.backward(params.data(), grads.data(), xv, xv, dyv, dxv, Mode{}); });
    CHECK(strata_test::has(msg, "LayerNormalization: backward on 3 examples"));
    CHECK(strata_test::has(msg, "the last forward had 0"));
}

// ---- gemm_strided_batched -------------------------------------------------------------------

TEST_CASE_TEMPLATE("gemm_strided_batched equals one gemm per matrix, every transpose, with leading dimensions and beta", P, STRATA_TEST_PLACES) {
    // 24 products of 32x32x32 (above the host's threshold for splitting the batch over threads)
    // and 5 of odd sizes inside wider rows (leading dimensions larger than the matrices).
    struct Case { std::int64_t m, n, k, pad, batch; };
    for (const Case cs : {Case{32, 32, 32, 0, 24}, Case{3, 5, 4, 2, 5}}) {
        for (const auto ta : {strata::Trans::No, strata::Trans::Yes})
            for (const auto tb : {strata::Trans::No, strata::Trans::Yes}) {
                const std::int64_t ar = ta == strata::Trans::No ? cs.m : cs.k, ac = ta == strata::Trans::No ? cs.k : cs.m;
                const std::int64_t br = tb == strata::Trans::No ? cs.k : cs.n, bc = tb == strata::Trans::No ? cs.n : cs.k;
                const std::int64_t lda = ac + cs.pad, ldb = bc + cs.pad, ldc = cs.n + cs.pad;
                const std::int64_t sa = ar * lda + 1, sb = br * ldb + 3, sc = cs.m * ldc + 2;
                const auto a = reference_values(sa * cs.batch, 1), b = reference_values(sb * cs.batch, 2), c0 = reference_values(sc * cs.batch, 3);
                auto at = on_place<double, P>(a, Shape{sa * cs.batch}), bt = on_place<double, P>(b, Shape{sb * cs.batch});
                auto ct = on_place<double, P>(c0, Shape{sc * cs.batch});
                strata::gemm_strided_batched<double, P>(ta, tb, cs.m, cs.n, cs.k, 0.75, at.data(), lda, sa, bt.data(), ldb, sb, -0.5,
                                                        ct.data(), ldc, sc, cs.batch);
                const auto c = as_double(ct.view());
                double worst = 0;
                for (std::int64_t i = 0; i < cs.batch; ++i)
                    for (std::int64_t r = 0; r < sc; ++r) {
                        const std::int64_t row = r / ldc, col = r % ldc;
                        double want = c0[std::size_t(i * sc + r)];  // outside the matrix: untouched
                        if (row < cs.m && col < cs.n) {
                            double s2 = 0;
                            for (std::int64_t q = 0; q < cs.k; ++q) {
                                const double av = ta == strata::Trans::No ? a[std::size_t(i * sa + row * lda + q)] : a[std::size_t(i * sa + q * lda + row)];
                                const double bv = tb == strata::Trans::No ? b[std::size_t(i * sb + q * ldb + col)] : b[std::size_t(i * sb + col * ldb + q)];
                                s2 += av * bv;
                            }
                            want = 0.75 * s2 - 0.5 * want;
                        }
                        worst = std::max(worst, std::abs(c[std::size_t(i * sc + r)] - want));
                    }
                CHECK(worst <= 1e-12);
            }
    }
}

// ---- MultiHeadAttention --------------------------------------------------------------------

namespace {

/// The float64 reference, written plainly from the formulas (Keras' MultiHeadAttention with
/// query = value = key = x): per example and head, Q, K, V, scores / sqrt(Dk), masked softmax,
/// the weighted sum, then the output projection summed over the heads.
struct MhaDims {
    std::int64_t S, F, H, Dk, Dv;
    bool bias, causal;
};
/// `keep(e, h, i, j)`, when given, multiplies attention weight (example e, head h, query i, key j)
/// after the softmax (attention dropout: 0 or 1 / (1 − rate)).
using KeepFn = std::function<double(std::int64_t, std::int64_t, std::int64_t, std::int64_t)>;
std::vector<double> mha_reference(const std::vector<double>& x, const std::vector<double>& p, std::int64_t n, const MhaDims& d,
                                  const KeepFn& keep = {}) {
    const auto [S, F, H, Dk, Dv, bias, causal] = d;
    // Keras' order: query kernel [F,H,Dk], bias [H,Dk], key ..., value kernel [F,H,Dv], bias
    // [H,Dv], output kernel [H,Dv,F], bias [F].
    std::int64_t at = 0;
    auto take = [&](std::int64_t count) { const std::int64_t o = at; at += count; return o; };
    const std::int64_t wq = take(F * H * Dk), bq = bias ? take(H * Dk) : -1, wk = take(F * H * Dk), bk = bias ? take(H * Dk) : -1;
    const std::int64_t wv = take(F * H * Dv), bv = bias ? take(H * Dv) : -1, wo = take(H * Dv * F), bo = bias ? take(F) : -1;
    REQUIRE(at == std::int64_t(p.size()));
    auto P = [&](std::int64_t i) { return p[std::size_t(i)]; };
    std::vector<double> y(std::size_t(n * S * F), 0.0);
    for (std::int64_t e = 0; e < n; ++e) {
        auto X = [&](std::int64_t s, std::int64_t f) { return x[std::size_t((e * S + s) * F + f)]; };
        for (std::int64_t h = 0; h < H; ++h) {
            using Matrix = std::vector<std::vector<double>>;
            Matrix Q = Matrix(std::size_t(S), std::vector<double>(std::size_t(Dk))), K = Q;
            Matrix V = Matrix(std::size_t(S), std::vector<double>(std::size_t(Dv)));
            for (std::int64_t s = 0; s < S; ++s) {
                for (std::int64_t j = 0; j < Dk; ++j) {
                    double q = bias ? P(bq + h * Dk + j) : 0, k = bias ? P(bk + h * Dk + j) : 0;
                    for (std::int64_t f = 0; f < F; ++f) {
                        q += X(s, f) * P(wq + (f * H + h) * Dk + j);
                        k += X(s, f) * P(wk + (f * H + h) * Dk + j);
                    }
                    Q[std::size_t(s)][std::size_t(j)] = q;
                    K[std::size_t(s)][std::size_t(j)] = k;
                }
                for (std::int64_t j = 0; j < Dv; ++j) {
                    double v = bias ? P(bv + h * Dv + j) : 0;
                    for (std::int64_t f = 0; f < F; ++f) v += X(s, f) * P(wv + (f * H + h) * Dv + j);
                    V[std::size_t(s)][std::size_t(j)] = v;
                }
            }
            for (std::int64_t i = 0; i < S; ++i) {
                std::vector<double> a(std::size_t(S), 0.0);
                double m = -1e300, z = 0;
                for (std::int64_t j = 0; j < S; ++j) {
                    if (causal && j > i) continue;
                    double sc = 0;
                    for (std::int64_t c = 0; c < Dk; ++c) sc += Q[std::size_t(i)][std::size_t(c)] * K[std::size_t(j)][std::size_t(c)];
                    a[std::size_t(j)] = sc / std::sqrt(double(Dk));
                    m = std::max(m, a[std::size_t(j)]);
                }
                for (std::int64_t j = 0; j < S; ++j) {
                    a[std::size_t(j)] = (causal && j > i) ? 0.0 : std::exp(a[std::size_t(j)] - m);
                    z += a[std::size_t(j)];
                }
                for (std::int64_t c = 0; c < Dv; ++c) {
                    double o = 0;
                    for (std::int64_t j = 0; j < S; ++j)
                        o += a[std::size_t(j)] / z * (keep ? keep(e, h, i, j) : 1.0) * V[std::size_t(j)][std::size_t(c)];
                    for (std::int64_t f = 0; f < F; ++f) y[std::size_t((e * S + i) * F + f)] += o * P(wo + (h * Dv + c) * F + f);
                }
            }
        }
        if (bias)
            for (std::int64_t i = 0; i < S; ++i)
                for (std::int64_t f = 0; f < F; ++f) y[std::size_t((e * S + i) * F + f)] += P(bo + f);
    }
    return y;
}

template <class Spec, std::int64_t S, std::int64_t F>
MhaDims dims_of() {
    using L = typename Spec::template bind<StaticShape<S, F>, double, Host>;
    return {S, F, L::H, L::Dk, L::Dv, Spec::options.use_bias, Spec::options.causal};
}

template <class Spec, std::int64_t S, std::int64_t F, class T = double, class P = Host>
LayerRun<Spec, StaticShape<S, F>, T, P> mha_run(std::int64_t n, std::uint64_t seed) {
    using L = typename Spec::template bind<StaticShape<S, F>, double, Host>;
    return LayerRun<Spec, StaticShape<S, F>, T, P>(n, reference_values(L::num_params, seed, -0.6, 0.6),
                                                    reference_values(n * S * F, seed + 1, -1.5, 1.5));
}

constexpr MultiHeadAttentionOptions causal_mask{.causal = true};
constexpr MultiHeadAttentionOptions no_bias{.use_bias = false};

}  // namespace

TEST_CASE_TEMPLATE("MultiHeadAttention matches a float64 reference: heads, key and value sizes, bias, causal mask", P, STRATA_TEST_PLACES) {
    SUBCASE("2 heads, key 3, value 4, bias") {
        using Spec = MultiHeadAttention<2, 3, 4>;
        auto run = mha_run<Spec, 5, 6, double, P>(3, 1);
        CHECK(max_abs_diff(run.forward(), mha_reference(run.x, run.params, 3, dims_of<Spec, 5, 6>())) <= 1e-13);
    }
    SUBCASE("causal") {
        using Spec = MultiHeadAttention<2, 3, 4, causal_mask>;
        auto run = mha_run<Spec, 5, 6, double, P>(2, 2);
        const auto y = run.forward();
        CHECK(max_abs_diff(y, mha_reference(run.x, run.params, 2, dims_of<Spec, 5, 6>())) <= 1e-13);
        // The same variables without the mask give another output.
        CHECK(max_abs_diff(y, mha_reference(run.x, run.params, 2, dims_of<MultiHeadAttention<2, 3, 4>, 5, 6>())) > 1e-3);
    }
    SUBCASE("3 heads of features / 3 (KeyDim 0), no bias") {
        using Spec = MultiHeadAttention<3, 0, 0, no_bias>;
        static_assert(Spec::bind<StaticShape<4, 6>, double, Host>::Dk == 2 && Spec::bind<StaticShape<4, 6>, double, Host>::Dv == 2);
        auto run = mha_run<Spec, 4, 6, double, P>(2, 3);
        CHECK(max_abs_diff(run.forward(), mha_reference(run.x, run.params, 2, dims_of<Spec, 4, 6>())) <= 1e-13);
    }
    SUBCASE("one token, one head") {
        using Spec = MultiHeadAttention<1, 2>;
        auto run = mha_run<Spec, 1, 3, double, P>(2, 4);
        CHECK(max_abs_diff(run.forward(), mha_reference(run.x, run.params, 2, dims_of<Spec, 1, 3>())) <= 1e-13);
    }
    SUBCASE("float: 16 tokens of 32 features, 4 heads of 8, causal") {
        using Spec = MultiHeadAttention<4, 8, 8, causal_mask>;
        auto run = mha_run<Spec, 16, 32, float, P>(3, 5);
        std::vector<double> pf(run.params.begin(), run.params.end()), xf(run.x.begin(), run.x.end());
        for (auto& v : pf) v = double(float(v));
        for (auto& v : xf) v = double(float(v));
        const auto want = mha_reference(xf, pf, 3, dims_of<Spec, 16, 32>());
        CHECK(relative_error(run.forward(), want) <= 1e-5);
    }
}

TEST_CASE("MultiHeadAttention: the attention weights are distributions, masked ones exactly 0") {
    using Spec = MultiHeadAttention<2, 3, 3, causal_mask>;
    auto run = mha_run<Spec, 5, 4>(2, 11);
    run.forward();
    const auto a = run.layer.attention_weights();
    REQUIRE(a.size() == 2 * 2 * 5 * 5);
    for (std::size_t r = 0; r < 2 * 2 * 5; ++r) {
        const std::size_t i = r % 5;
        double s = 0;
        for (std::size_t j = 0; j < 5; ++j) {
            s += a[r * 5 + j];
            if (j > i) CHECK(a[r * 5 + j] == 0.0);
            else CHECK(a[r * 5 + j] > 0.0);
        }
        CHECK(s == doctest::Approx(1.0).epsilon(1e-15));
    }
}

TEST_CASE("MultiHeadAttention gradients match finite differences: the input and every variable") {
    SUBCASE("2 heads, key 3, value 4, bias") {
        using Spec = MultiHeadAttention<2, 3, 4>;
        auto run = mha_run<Spec, 4, 5>(2, 21);
        check_gradients(run, 21, Spec::bind<StaticShape<4, 5>, double, Host>::param_info(), {"key/bias"});
    }
    SUBCASE("causal, 3 heads of 2") {
        using Spec = MultiHeadAttention<3, 2, 2, causal_mask>;
        auto run = mha_run<Spec, 5, 3>(2, 22);
        check_gradients(run, 22, Spec::bind<StaticShape<5, 3>, double, Host>::param_info(), {"key/bias"});
    }
    SUBCASE("no bias, one head, value 1") {
        using Spec = MultiHeadAttention<1, 3, 1, no_bias>;
        auto run = mha_run<Spec, 3, 4>(3, 23);
        check_gradients(run, 23, Spec::bind<StaticShape<3, 4>, double, Host>::param_info());
    }
}

TEST_CASE_TEMPLATE("MultiHeadAttention's gradients on every place match the host's", P, STRATA_TEST_PLACES) {
    using Spec = MultiHeadAttention<2, 4, 3, causal_mask>;
    auto host = mha_run<Spec, 6, 5>(3, 31);
    auto here = mha_run<Spec, 6, 5, double, P>(3, 31);
    auto here_f = mha_run<Spec, 6, 5, float, P>(3, 31);
    const auto w = reference_values(host.out_size(), 32);
    const auto a = host.run(&w);
    const auto b = here.run(&w);
    const auto c = here_f.run(&w);
    CHECK(relative_error(b.y, a.y) <= 1e-13);
    CHECK(relative_error(b.dx, a.dx) <= 1e-12);
    CHECK(relative_error(b.dparams, a.dparams) <= 1e-12);
    CHECK(relative_error(c.y, a.y) <= 1e-5);
    CHECK(relative_error(c.dx, a.dx) <= 1e-4);
    CHECK(relative_error(c.dparams, a.dparams) <= 1e-4);
}

namespace {
/// Perturbs token t of every example (t = 1..S-1) and measures how far the outputs of the
/// tokens before t and of the others move.
template <class Spec>
void check_dependence_on_later_tokens(bool causal) {
    constexpr std::int64_t S = 6, F = 4;
    auto run = mha_run<Spec, S, F>(2, 41);
    const auto y0 = run.forward();
    for (std::int64_t t = 1; t < S; ++t) {
        CAPTURE(t);
        auto x = run.x;
        for (std::int64_t e = 0; e < run.n; ++e)
            for (std::int64_t f = 0; f < F; ++f) x[std::size_t((e * S + t) * F + f)] += 0.5 + 0.1 * double(f);
        LayerRun<Spec, StaticShape<S, F>> perturbed(run.n, run.params, x);
        const auto y1 = perturbed.forward();
        double before = 0, rest = 0;
        for (std::int64_t e = 0; e < run.n; ++e)
            for (std::int64_t s = 0; s < S; ++s)
                for (std::int64_t f = 0; f < F; ++f) {
                    const auto i = std::size_t((e * S + s) * F + f);
                    double& m = s < t ? before : rest;
                    m = std::max(m, std::abs(y1[i] - y0[i]));
                }
        if (causal) CHECK(before == 0.0);  // bit for bit
        else CHECK(before > 1e-3);         // the negative control: earlier tokens see the change
        CHECK(rest > 1e-3);
    }
}
}  // namespace

namespace {
/// The attention dropout's mask as its contract states it (strata/nn/multi_head_attention.hpp):
/// weight g of the global batch's [examples, heads, queries, keys] is kept when 24 bits of
/// Philox(seed; counter (bit 63 | stream << 40 | g / 4, step)), lane g % 4, reach ceil(rate·2^24).
KeepFn dropout_mask(double rate, std::int64_t H, std::int64_t S, std::uint64_t seed, std::uint64_t step, std::uint64_t stream,
                    std::int64_t first_example) {
    return [=](std::int64_t e, std::int64_t h, std::int64_t i, std::int64_t j) {
        const auto g = std::uint64_t((((first_example + e) * H + h) * S + i) * S + j);
        const auto r = strata::random::Philox4x32::generate(seed, (std::uint64_t(1) << 63) | (stream << 40) | (g >> 2), step);
        const auto threshold = std::uint32_t(std::ceil(rate * 16777216.0));
        return (r.v[g & 3] >> 8) >= threshold ? 1.0 / (1.0 - rate) : 0.0;
    };
}
constexpr MultiHeadAttentionOptions with_dropout{.dropout = 0.25};
/// A layer that draws random numbers has set_stream (what a Network and a Model look for).
template <class L>
constexpr bool draws_random = requires(L& l) { l.set_stream(std::uint64_t(0)); };
constexpr MultiHeadAttentionOptions causal_dropout{.causal = true, .dropout = 0.5};
}  // namespace

TEST_CASE_TEMPLATE("MultiHeadAttention's dropout (Keras' dropout): the stated mask in training, nothing in inference", P, STRATA_TEST_PLACES) {
    using Spec = MultiHeadAttention<2, 3, 4, with_dropout>;
    using Plain = MultiHeadAttention<2, 3, 4>;
    auto run = mha_run<Spec, 5, 6, double, P>(3, 51);
    auto plain = mha_run<Plain, 5, 6, double, P>(3, 51);
    const auto dims = dims_of<Spec, 5, 6>();
    // Inference: the layer without dropout, bit for bit.
    const auto y_plain = plain.forward();
    CHECK(run.forward() == y_plain);
    // Training: the weights dropped as the contract's mask says, against the float64 reference.
    run.mode = Mode{.training = true, .step = 3, .seed = 7};
    run.layer.set_stream(32);
    const auto y = run.forward();
    CHECK(max_abs_diff(y, mha_reference(run.x, run.params, 3, dims, dropout_mask(0.25, 2, 5, 7, 3, 32, 0))) <= 1e-13);
    CHECK(max_abs_diff(y, y_plain) > 1e-3);  // the negative control: something was dropped
    // The mask of another step, seed or stream is another one.
    CHECK(max_abs_diff(y, mha_reference(run.x, run.params, 3, dims, dropout_mask(0.25, 2, 5, 7, 4, 32, 0))) > 1e-3);
    run.mode.step = 4;
    CHECK(max_abs_diff(run.forward(), mha_reference(run.x, run.params, 3, dims, dropout_mask(0.25, 2, 5, 7, 4, 32, 0))) <= 1e-13);
    run.layer.set_stream(48);
    CHECK(max_abs_diff(run.forward(), mha_reference(run.x, run.params, 3, dims, dropout_mask(0.25, 2, 5, 7, 4, 48, 0))) <= 1e-13);
    // A replica's share (examples 1 and 2 of the 3, first_example 1) draws what the whole batch
    // draws for those examples: its outputs are the whole batch's rows (to rounding: the GEMMs
    // have other sizes).
    run.mode = Mode{.training = true, .step = 3, .seed = 7};
    const auto whole = run.forward();
    LayerRun<Spec, StaticShape<5, 6>, double, P> share(2, run.params, std::vector<double>(run.x.begin() + 30, run.x.end()),
                                                       Mode{.training = true, .step = 3, .seed = 7, .first_example = 1});
    share.layer.set_stream(48);
    const auto mine = share.forward();
    CHECK(max_abs_diff(mine, std::vector<double>(whole.begin() + 30, whole.end())) <= 1e-13);
    // The negative control: the same share keyed as the batch's start draws another mask.
    share.mode.first_example = 0;
    CHECK(max_abs_diff(share.forward(), mine) > 1e-3);
}

#if !defined(__CUDACC__)  // host cases (nvcc 13's front end misreads one of them); the places' case is above
TEST_CASE("MultiHeadAttention's dropout: the rate dropped, the causal mask kept, gradients against finite differences") {
    SUBCASE("the share of weights dropped is the rate") {
        // 8 examples × 4 heads × 16² weights; the rate 0.25 ± 0.02 (four standard deviations).
        using Spec = MultiHeadAttention<4, 4, 4, with_dropout>;
        auto run = mha_run<Spec, 16, 8>(8, 52);
        const auto keep = dropout_mask(0.25, 4, 16, 11, 5, 0, 0);
        std::int64_t dropped = 0, all = 0;
        for (std::int64_t e = 0; e < 8; ++e)
            for (std::int64_t h = 0; h < 4; ++h)
                for (std::int64_t i = 0; i < 16; ++i)
                    for (std::int64_t j = 0; j < 16; ++j, ++all) dropped += keep(e, h, i, j) == 0.0;
        CHECK(std::abs(double(dropped) / double(all) - 0.25) <= 0.02);
        run.mode = Mode{.training = true, .step = 5, .seed = 11};
        CHECK(max_abs_diff(run.forward(), mha_reference(run.x, run.params, 8, dims_of<Spec, 16, 8>(), keep)) <= 1e-12);
    }
    SUBCASE("causal, rate 0.5: an output token still does not depend on later tokens") {
        using Spec = MultiHeadAttention<2, 3, 3, causal_dropout>;
        auto run = mha_run<Spec, 6, 4>(2, 53);
        run.mode = Mode{.training = true, .step = 1, .seed = 2};
        const auto y0 = run.forward();
        CHECK(max_abs_diff(y0, mha_reference(run.x, run.params, 2, dims_of<Spec, 6, 4>(), dropout_mask(0.5, 2, 6, 2, 1, 0, 0))) <= 1e-13);
        auto x = run.x;
        for (std::int64_t e = 0; e < 2; ++e) x[std::size_t((e * 6 + 5) * 4)] += 1.0;  // the last token
        LayerRun<Spec, StaticShape<6, 4>> later(2, run.params, x, run.mode);
        const auto y1 = later.forward();
        for (std::int64_t e = 0; e < 2; ++e)
            for (std::int64_t i = 0; i < 5 * 4; ++i) CHECK(y1[std::size_t(e * 24 + i)] == y0[std::size_t(e * 24 + i)]);
    }
    SUBCASE("gradients in training: the input and every variable") {
        using Spec = MultiHeadAttention<2, 3, 4, with_dropout>;
        auto run = mha_run<Spec, 4, 5>(2, 54);
        run.mode = Mode{.training = true, .step = 2, .seed = 9};
        check_gradients(run, 54, Spec::bind<StaticShape<4, 5>, double, Host>::param_info(), {"key/bias"});
    }
    SUBCASE("a backward in another mode than its forward is refused") {
        using Spec = MultiHeadAttention<2, 3, 4, with_dropout>;
        using L = Spec::bind<StaticShape<4, 5>, double, Host>;
        L layer;
        Tensor<double, Host> params(Shape{L::num_params}), grads(Shape{L::num_params}), x(Shape{2, 4, 5}), y(Shape{2, 4, 5}),
            dx(Shape{2, 4, 5});
        strata::fill(params.view(), 0.1);
        strata::fill(x.view(), 0.5);
        layer.forward(params.data(), x.view(), y.view(), Mode{.training = true, .step = 1, .seed = 1});
        const auto msg = strata_test::error_of<strata::ValueError>(
            [&] { layer.backward(params.data(), grads.data(), x.view(), y.view(), y.view(), dx.view(), Mode{}); });
        CHECK(msg.find("backward in inference mode after a forward in training mode") != std::string::npos);
    }
}
#endif

TEST_CASE("the causal mask: an output token does not depend on later tokens; without the mask it does") {
    check_dependence_on_later_tokens<MultiHeadAttention<2, 3, 3, causal_mask>>(true);
    check_dependence_on_later_tokens<MultiHeadAttention<2, 3, 3>>(false);
}

TEST_CASE("MultiHeadAttention: Keras' variable names, shapes and order, initial values, summary; errors") {
    using Spec = MultiHeadAttention<4, 8, 6>;
    using L = Spec::bind<StaticShape<16, 32>, float, Host>;
    const auto info = L::param_info();
    const std::vector<std::string> names{"query/kernel", "query/bias", "key/kernel", "key/bias", "value/kernel", "value/bias",
                                         "attention_output/kernel", "attention_output/bias"};
    const std::vector<Shape> shapes{Shape{32, 4, 8}, Shape{4, 8}, Shape{32, 4, 8}, Shape{4, 8}, Shape{32, 4, 6}, Shape{4, 6}, Shape{4, 6, 32}, Shape{32}};
    REQUIRE(info.size() == names.size());
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < info.size(); ++i) {
        CHECK(info[i].name == names[i]);
        CHECK(info[i].shape == shapes[i]);
        CHECK(info[i].offset == offset);
        offset += shapes[i].size();
    }
    CHECK(L::num_params == offset);
    CHECK(L::num_params == 2 * (32 * 32 + 32) + (32 * 24 + 24) + (24 * 32 + 32));
    CHECK(MultiHeadAttention<4, 8, 6, no_bias>::bind<StaticShape<16, 32>, float, Host>::param_info().size() == 4);
    // Initial values: zero biases, each kernel inside its Glorot limit with Keras' fans, and the
    // four kernels drawn from different streams.
    std::vector<float> p(std::size_t(L::num_params), 9.0f);
    L().init(p.data(), 7, 16);
    auto part = [&](std::size_t i) { return std::vector<float>(p.begin() + info[i].offset, p.begin() + info[i].offset + info[i].shape.size()); };
    for (std::size_t i : {1u, 3u, 5u, 7u}) for (float v : part(i)) CHECK(v == 0.0f);
    const double limits[4] = {std::sqrt(6.0 / (4 * 32 + 8 * 32)), std::sqrt(6.0 / (4 * 32 + 8 * 32)), std::sqrt(6.0 / (4 * 32 + 6 * 32)),
                              std::sqrt(6.0 / (6 * 4 + 32 * 4))};
    for (std::size_t k = 0; k < 4; ++k) {
        const auto v = part(2 * k);
        double largest = 0;
        for (float f : v) largest = std::max(largest, double(std::abs(f)));
        CHECK(largest <= limits[k]);
        CHECK(largest > 0.9 * limits[k]);
    }
    CHECK(part(0) != part(2));
    // In a Sequential: the layer's prefix, and its summary row.
    using Seq = Sequential<Input<16, 32>, Spec, MultiHeadAttention<2, 4>>;
    const auto all = Seq::parameters();
    CHECK(all[0].name == "multi_head_attention/query/kernel");
    CHECK(all[7].name == "multi_head_attention/attention_output/bias");
    CHECK(all[8].name == "multi_head_attention_1/query/kernel");
    CHECK(strata_test::has(Seq::summary(), "multi_head_attention (MultiHeadAttention)"));
    static_assert(std::is_same_v<Seq::output_shape, StaticShape<16, 32>>);
    // Backward without a forward on that batch: a typed error naming both batch sizes.
    Spec::bind<StaticShape<2, 3>, double, Host> fresh;
    std::vector<double> params(std::size_t(decltype(fresh)::num_params), 0.1), grads(params.size()), x(12), dx(12);
    const TensorView<double, Host> xv(x.data(), Shape{2, 2, 3}), dxv(dx.data(), Shape{2, 2, 3});
    const auto msg = strata_test::error_of<strata::ValueError>([&] { fresh.backward(params.data(), grads.data(), xv, xv, xv, dxv, Mode{}); });
    CHECK(strata_test::has(msg, "MultiHeadAttention: backward on 2 examples"));
}

// ---- TokenDense and the encoder block ---------------------------------------------------------

TEST_CASE_TEMPLATE("TokenDense is Dense on every token: the same figures as Dense on the rows, on every place", P, STRATA_TEST_PLACES) {
    using In = StaticShape<5, 7>;
    static_assert(std::is_same_v<TokenDense<3>::bind<In, double, Host>::output_shape, StaticShape<5, 3>>);
    static_assert(std::is_same_v<TokenDense<3>::bind<StaticShape<2, 4, 7>, double, Host>::output_shape, StaticShape<2, 4, 3>>);
    const auto p = reference_values(7 * 3 + 3, 51, -0.5, 0.5);
    const auto x = reference_values(2 * 35, 52, -2, 2);
    const auto w = reference_values(2 * 15, 53);
    LayerRun<TokenDense<3, GELU>, In, double, P> tok(2, p, x);
    LayerRun<Dense<3, GELU>, StaticShape<7>, double, Host> rows(10, p, x);  // the 10 tokens as 10 examples
    const auto a = tok.run(&w);
    const auto b = rows.run(&w);
    CHECK(max_abs_diff(a.y, b.y) <= 1e-14);
    CHECK(max_abs_diff(a.dx, b.dx) <= 1e-14);
    CHECK(max_abs_diff(a.dparams, b.dparams) <= 1e-13);
}

TEST_CASE("TokenDense gradients match finite differences; its variables are Dense's") {
    auto run = random_run<TokenDense<4, Tanh>, StaticShape<3, 5>>(2, 61);
    check_gradients(run, 61, TokenDense<4, Tanh>::bind<StaticShape<3, 5>, double, Host>::param_info());
    auto no_bias = random_run<TokenDense<2, GELUTanh, false>, StaticShape<2, 2, 3>>(2, 62);
    check_gradients(no_bias, 62);
    using Seq = Sequential<Input<4, 6>, TokenDense<8, GELU>, TokenDense<6>>;
    const auto names = Seq::parameters();
    CHECK(names[0].name == "dense/kernel");
    CHECK(names[0].shape == Shape{6, 8});
    CHECK(names[3].name == "dense_1/bias");
    CHECK(strata_test::has(Seq::summary(), "dense (TokenDense)"));
}

namespace {
// A pre-norm transformer encoder block (Vaswani et al. 2017 with the normalization first, as in
// GPT-2 and ViT): x + MHA(LN(x)), then x + MLP(LN(x)) with a GELU hidden layer.
template <std::int64_t Heads, std::int64_t KeyDim, MultiHeadAttentionOptions O = MultiHeadAttentionOptions{}>
using AttentionHalf = Residual<LayerNormalization<>, MultiHeadAttention<Heads, KeyDim, KeyDim, O>>;
template <std::int64_t Features, std::int64_t Hidden>
using MlpHalf = Residual<LayerNormalization<>, TokenDense<Hidden, GELU>, TokenDense<Features>>;
using EncoderNet = Sequential<Input<5, 6>, TokenDense<6>, AttentionHalf<2, 3>, MlpHalf<6, 12>,
                              AttentionHalf<3, 2, MultiHeadAttentionOptions{.causal = true}>, MlpHalf<6, 12>, LayerNormalization<>>;
}  // namespace

TEST_CASE("a pre-norm transformer encoder (two blocks) in a Network: finite-difference gradients of every variable") {
    using Seq = EncoderNet;
    Network<Seq, double, Host> net;
    std::vector<double> params(std::size_t(Seq::num_params)), grads(params.size());
    net.init(params.data(), 3);
    // Perturb the initial values (gammas near 1, betas and biases away from 0) so that no
    // variable's gradient is special.
    const auto noise = reference_values(Seq::num_params, 4, -0.2, 0.2);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] += noise[i];
    const std::int64_t n = 2;
    auto x = on_place<double, Host>(reference_values(n * 30, 5, -1.5, 1.5), Seq::input_shape::batched(n));
    const auto w = reference_values(n * 30, 6);
    auto objective = [&] { return dot(w, as_double(net.forward(params.data(), x.view(), Mode{}))); };
    objective();
    std::copy(w.begin(), w.end(), net.output_grad().data());
    net.backward(params.data(), grads.data(), Mode{});
    std::vector<double> fd(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
        const double old = params[i];
        params[i] = old + 1e-6;
        const double fp = objective();
        params[i] = old - 1e-6;
        const double fm = objective();
        params[i] = old;
        fd[i] = (fp - fm) / 2e-6;
    }
    int checked = 0;
    for (const auto& p : Seq::parameters()) {
        const auto first = std::ptrdiff_t(p.offset), count = std::ptrdiff_t(p.shape.size());
        std::vector<double> a(fd.begin() + first, fd.begin() + first + count), b(grads.begin() + first, grads.begin() + first + count);
        CAPTURE(p.name);
        if (strata_test::has(p.name, "key/bias")) {  // 0 in exact arithmetic (see check_gradients)
            CHECK(max_abs_diff(b, std::vector<double>(b.size(), 0.0)) <= 1e-12);
            continue;
        }
        INFO(p.name << ": relative error " << relative_error(a, b));
        CHECK(relative_error(a, b) <= 1e-6);
        CHECK(std::any_of(b.begin(), b.end(), [](double v) { return v != 0; }));
        ++checked;
    }
    CHECK(checked == 2 + 2 * (2 + 7) + 2 * (2 + 4) + 2);  // every variable but the two key biases
}

#if !defined(__CUDACC__)
namespace {
/// n sequences of 6 tokens × 4 features, class = which half of the tokens has the larger mean
/// of feature 0, each token shifted and scaled at random (what layer normalization removes).
strata::data::Dataset<> token_task(std::size_t n, std::uint64_t seed) {
    auto f = strata_test::lcg(n * 24, seed, -1, 1);
    auto s = strata_test::lcg(n * 12, seed + 1, 0, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        const int label = int(i % 2);
        for (int t = 0; t < 6; ++t) {
            double* tok = f.data() + i * 24 + std::size_t(t) * 4;
            if ((t < 3) == (label == 0)) tok[0] += 1.5;
            const double a = 0.5 + 3 * s[i * 12 + std::size_t(t)], b = 4 * s[i * 12 + 6 + std::size_t(t)] - 2;
            for (int c = 0; c < 4; ++c) tok[c] = a * tok[c] + b;
        }
        y[i] = label;
    }
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {6, 4}, std::move(y));
}
using LnNet = Sequential<Input<6, 4>, LayerNormalization<>, Flatten, Dense<16, GELU>, Dense<2, Softmax>>;
}  // namespace

TEST_CASE("a model with LayerNormalization and GELU trains (the loss falls) and saves and loads its variables by name") {
    strata::Model<LnNet> model(5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    const auto before = model.evaluate(token_task(256, 1).batch(64));
    const auto h = model.fit(token_task(256, 1).shuffle(256, 2).batch(32), {.epochs = 10, .verbose = 0});
    const auto after = model.evaluate(token_task(256, 1).batch(64));
    INFO("loss " << before.loss << " -> " << after.loss << ", accuracy " << after.accuracy);
    CHECK(h["loss"].back() < 0.5 * h["loss"].front());
    CHECK(after.loss < 0.5 * before.loss);
    CHECK(after.accuracy > 0.9);
    CHECK(model.evaluate(token_task(128, 77).batch(64)).accuracy > 0.85);  // held out

    const auto path = strata_test::temp_path("layer_norm.safetensors");
    model.save(path);
    auto f = strata::io::SafetensorsFile::load(path);
    CHECK(f.contains("layer_normalization/gamma"));
    CHECK(f.contains("layer_normalization/beta"));
    CHECK(f.contains("dense/kernel"));
    strata::Model<LnNet> other(6);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    CHECK(other.get_weights() != model.get_weights());
    other.load(path);
    CHECK(other.get_weights() == model.get_weights());
    CHECK(other.evaluate(token_task(128, 77).batch(64)).loss == model.evaluate(token_task(128, 77).batch(64)).loss);
    std::filesystem::remove(path);
}
#endif

#if !defined(__CUDACC__)
namespace {
// A pre-norm encoder block (LayerNormalization then MultiHeadAttention on a residual branch,
// then LayerNormalization and a GELU MLP on another), a causal attention block, the classifier.
using AttnNet = Sequential<Input<6, 4>, Residual<LayerNormalization<>, MultiHeadAttention<2, 4>>,
                           Residual<LayerNormalization<>, TokenDense<8, GELU>, TokenDense<4>>,
                           Residual<LayerNormalization<>, MultiHeadAttention<2, 0, 0, MultiHeadAttentionOptions{.causal = true}>>,
                           LayerNormalization<>, Flatten, Dense<2, Softmax>>;
}  // namespace

TEST_CASE("a pre-norm transformer encoder (attention and MLP blocks) trains (the loss falls) and saves and loads its variables by name") {
    strata::Model<AttnNet> model(9);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    const auto before = model.evaluate(token_task(256, 3).batch(64));
    const auto h = model.fit(token_task(256, 3).shuffle(256, 4).batch(32), {.epochs = 10, .verbose = 0});
    const auto after = model.evaluate(token_task(256, 3).batch(64));
    INFO("loss " << before.loss << " -> " << after.loss << ", accuracy " << after.accuracy);
    CHECK(h["loss"].back() < 0.5 * h["loss"].front());
    CHECK(after.loss < 0.5 * before.loss);
    CHECK(after.accuracy > 0.9);

    const auto path = strata_test::temp_path("attention.safetensors");
    model.save(path);
    auto f = strata::io::SafetensorsFile::load(path);
    for (const char* name : {"residual/layer_normalization/gamma", "residual/multi_head_attention/query/kernel",
                             "residual/multi_head_attention/key/bias", "residual/multi_head_attention/attention_output/kernel",
                             "residual_1/dense/kernel", "residual_1/dense_1/bias",
                             "residual_2/multi_head_attention/value/bias", "layer_normalization/beta"}) {
        CAPTURE(name);
        CHECK(f.contains(name));
    }
    strata::Model<AttnNet> other(10);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    CHECK(other.get_weights() != model.get_weights());
    other.load(path);
    CHECK(other.get_weights() == model.get_weights());
    CHECK(other.evaluate(token_task(128, 77).batch(64)).loss == model.evaluate(token_task(128, 77).batch(64)).loss);
    std::filesystem::remove(path);
}

TEST_CASE("attention dropout under Mirrored and CentralStorage (2 replicas) trains as one device does on the same batches (float64)") {
    // The masks are keyed on each weight's place in the global batch (Mode::first_example), so
    // the replicas' shares draw one device's mask; a model with dropout also never replays a
    // captured step (the layer has set_stream).
    using DropNet = Sequential<Input<6, 4>, Residual<LayerNormalization<>, MultiHeadAttention<2, 4, 0, MultiHeadAttentionOptions{.dropout = 0.3}>>,
                               LayerNormalization<>, Flatten, Dense<2, Softmax>>;
    // Only the layer with dropout draws random numbers (has set_stream), so only it turns graphs off.
    static_assert(draws_random<MultiHeadAttention<2, 4, 0, MultiHeadAttentionOptions{.dropout = 0.3}>::bind<StaticShape<6, 4>, double, Host>>);
    static_assert(!draws_random<MultiHeadAttention<2, 4>::bind<StaticShape<6, 4>, double, Host>>);
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.01};
    auto train = [&]<class S>(S& strategy) {
        strata::Model<DropNet, S, double> model(strategy, 12);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        model.fit(token_task(64, 5).batch(10), {.epochs = 2, .verbose = 0});
        return model.get_weights();
    };
    strata::distribute::OneDevice<> one;
    const auto reference = train(one);
    strata::distribute::Mirrored<> mirrored(2);
    strata::distribute::CentralStorage<> central(2);
    for (const auto& w : {train(mirrored), train(central)}) {
        REQUIRE(w.size() == reference.size());
        double diff = 0;
        for (std::size_t i = 0; i < w.size(); ++i) diff = std::max(diff, std::abs(w[i] - reference[i]) / std::max(1.0, std::abs(reference[i])));
        INFO("largest relative weight difference " << diff);
        CHECK(diff <= 1e-12);
    }
    // The negative control: the same model without dropout ends elsewhere.
    using PlainNet = Sequential<Input<6, 4>, Residual<LayerNormalization<>, MultiHeadAttention<2, 4>>, LayerNormalization<>, Flatten,
                                Dense<2, Softmax>>;
    strata::Model<PlainNet, strata::distribute::OneDevice<>, double> plain(one, 12);
    plain.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    plain.fit(token_task(64, 5).batch(10), {.epochs = 2, .verbose = 0});
    const auto p = plain.get_weights();
    double moved = 0;
    for (std::size_t i = 0; i < p.size(); ++i) moved = std::max(moved, std::abs(p[i] - reference[i]));
    CHECK(moved > 1e-4);
}
#endif
