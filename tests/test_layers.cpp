// Layers: every backward pass against central finite differences in float64, Conv2D and
// MaxPooling2D against naive direct references (nested loops, float64) on awkward sizes, the
// reference MNIST model's size and summary, and Dropout's statistics and reproducibility.
//
// The cases templated on the place also run on Cuda when this file is compiled by nvcc (a
// test_layers.cu that includes it, as test_tensor.cu does); the host is the oracle.
//
// Finite differences: the objective is f = sum(w ⊙ y) with random w, so every output matters;
// each input and parameter is moved by ±h (h = 1e-6) and (f(+h) − f(−h)) / 2h is compared with
// the analytic gradient. The error measure is max_i |fd_i − g_i| / max_i |g_i| (the gradient's
// own scale: single tiny entries carry ~1e-9 of rounding noise that says nothing about
// correctness), required ≤ 1e-6. Kinks would break the comparison, so the data avoid them:
// ReLU cases check (with the same layer under Linear) that no pre-activation lies within 1e-5
// of 0, and pooling inputs are distinct values at least 1e-3 apart (no ties within a window).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/nn/layers.hpp>

#include "../examples/prelu.hpp"  // a user-defined layer, checked like the built-in ones

#include "test_places.hpp"

using strata::Shape;
using strata::StaticShape;
using strata::Tensor;
using strata::TensorView;
using namespace strata::nn;

using strata_test::reference_values;

namespace {

using Host = strata::place::Host;

// n distinct values, a shuffled grid with spacing 1e-3 (no ties anywhere, gaps far above h).
std::vector<double> distinct_values(std::int64_t n, std::uint64_t seed) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = double(i - n / 2) * 1e-3;
    const auto r = reference_values(n, seed, 0, 1);
    for (std::int64_t i = n - 1; i > 0; --i)
        std::swap(v[std::size_t(i)], v[std::size_t(std::int64_t(r[std::size_t(i)] * double(i + 1)))]);
    return v;
}

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
        layer.backward(p.data(), g.data(), xt.view(), y.view(), dy.view(), dx.view(), mode);
        r.dx = as_double(dx.view());
        r.dparams = as_double(g.view());
        return r;
    }
    std::vector<double> forward() { return run().y; }
};

template <class Spec, class In>
LayerRun<Spec, In> random_run(std::int64_t n, std::uint64_t seed, Mode mode = {}) {
    using L = typename Spec::template bind<In, double, Host>;
    return LayerRun<Spec, In>(n, reference_values(L::num_params, seed, -0.5, 0.5), reference_values(n * In::size, seed + 1),
                              mode);
}

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

/// Checks the input and parameter gradients of `run` against finite differences.
template <class Run>
void check_gradients(Run& run, std::uint64_t seed) {
    const auto w = reference_values(run.out_size(), seed + 7, -1, 1);
    const auto g = run.run(&w);
    const auto fd_x = finite_differences(run, run.x, w);
    const auto fd_p = finite_differences(run, run.params, w);
    INFO("input gradient relative error " << relative_error(fd_x, g.dx));
    CHECK(relative_error(fd_x, g.dx) <= 1e-6);
    INFO("parameter gradient relative error " << relative_error(fd_p, g.dparams));
    CHECK(relative_error(fd_p, g.dparams) <= 1e-6);
    // A layer whose gradient is identically zero would pass the relative test trivially.
    CHECK(std::any_of(g.dx.begin(), g.dx.end(), [](double v) { return v != 0; }));
}

/// For ReLU cases: no pre-activation (the same layer under Linear) lies within 1e-5 of the kink,
/// so the ±1e-6 steps never cross it.
template <class LinearSpec, class In, class Run>
void require_away_from_kink(const Run& run) {
    LayerRun<LinearSpec, In> lin(run.n, run.params, run.x);
    double closest = 1e300;
    for (double z : lin.forward()) closest = std::min(closest, std::abs(z));
    INFO("closest pre-activation to 0: " << closest);
    REQUIRE(closest > 1e-5);
}

template <class Spec, class In>
void check_layer(std::int64_t n, std::uint64_t seed, Mode mode = {}) {
    auto run = random_run<Spec, In>(n, seed, mode);
    check_gradients(run, seed);
}

template <class Spec, class LinearSpec, class In>
void check_relu_layer(std::int64_t n, std::uint64_t seed) {
    auto run = random_run<Spec, In>(n, seed);
    require_away_from_kink<LinearSpec, In>(run);
    check_gradients(run, seed);
}

template <class Spec, class In>
void check_pooling(std::int64_t n, std::uint64_t seed) {
    LayerRun<Spec, In> run(n, {}, distinct_values(n * In::size, seed));
    check_gradients(run, seed);
}

// ---- naive references -------------------------------------------------------------------

/// Keras's window geometry, re-derived here independently of the library.
struct Geometry {
    std::int64_t h, w, c, kh, kw, sh, sw, oh, ow, pt, pl;
    Geometry(std::int64_t h_, std::int64_t w_, std::int64_t c_, std::int64_t kh_, std::int64_t kw_, std::int64_t sh_,
             std::int64_t sw_, bool same)
        : h(h_), w(w_), c(c_), kh(kh_), kw(kw_), sh(sh_), sw(sw_) {
        if (same) {
            oh = (h + sh - 1) / sh;
            ow = (w + sw - 1) / sw;
            pt = std::max<std::int64_t>((oh - 1) * sh + kh - h, 0) / 2;
            pl = std::max<std::int64_t>((ow - 1) * sw + kw - w, 0) / 2;
        } else {
            oh = (h - kh) / sh + 1;
            ow = (w - kw) / sw + 1;
            pt = pl = 0;
        }
    }
    template <class Spec, class In>
    static Geometry of_conv() {
        return Geometry(In::dims[0], In::dims[1], In::dims[2], Spec::kernel_h, Spec::kernel_w, Spec::stride_h,
                        Spec::stride_w, Spec::padding == Padding::Same);
    }
    template <class Spec, class In>
    static Geometry of_pool() {
        return Geometry(In::dims[0], In::dims[1], In::dims[2], Spec::pool_h, Spec::pool_w, Spec::stride_h,
                        Spec::stride_w, Spec::padding == Padding::Same);
    }
    std::int64_t xi(std::int64_t b, std::int64_t y, std::int64_t x, std::int64_t ch) const { return ((b * h + y) * w + x) * c + ch; }
};

// Direct convolution: y[b, oy, ox, f] = bias[f] + sum x[b, iy, ix, ci] * k[ky, kx, ci, f] over
// the window positions inside the image (zero padding contributes nothing).
std::vector<double> naive_conv(const Geometry& g, std::int64_t n, std::int64_t filters, const std::vector<double>& x,
                               const std::vector<double>& params, bool use_bias) {
    std::vector<double> y(std::size_t(n * g.oh * g.ow * filters));
    const std::size_t bias_at = std::size_t(g.kh * g.kw * g.c * filters);
    for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t oy = 0; oy < g.oh; ++oy)
            for (std::int64_t ox = 0; ox < g.ow; ++ox)
                for (std::int64_t f = 0; f < filters; ++f) {
                    double s = use_bias ? params[bias_at + std::size_t(f)] : 0.0;
                    for (std::int64_t ky = 0; ky < g.kh; ++ky)
                        for (std::int64_t kx = 0; kx < g.kw; ++kx) {
                            const std::int64_t iy = oy * g.sh + ky - g.pt, ix = ox * g.sw + kx - g.pl;
                            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                            for (std::int64_t ci = 0; ci < g.c; ++ci)
                                s += x[std::size_t(g.xi(b, iy, ix, ci))] *
                                     params[std::size_t(((ky * g.kw + kx) * g.c + ci) * filters + f)];
                        }
                    y[std::size_t(((b * g.oh + oy) * g.ow + ox) * filters + f)] = s;
                }
    return y;
}

// The gradients of naive_conv for output gradient dz: dx and [dkernel, dbias].
void naive_conv_backward(const Geometry& g, std::int64_t n, std::int64_t filters, const std::vector<double>& x,
                         const std::vector<double>& params, const std::vector<double>& dz, bool use_bias,
                         std::vector<double>& dx, std::vector<double>& dp) {
    dx.assign(x.size(), 0.0);
    dp.assign(params.size(), 0.0);
    const std::size_t bias_at = std::size_t(g.kh * g.kw * g.c * filters);
    for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t oy = 0; oy < g.oh; ++oy)
            for (std::int64_t ox = 0; ox < g.ow; ++ox)
                for (std::int64_t f = 0; f < filters; ++f) {
                    const double d = dz[std::size_t(((b * g.oh + oy) * g.ow + ox) * filters + f)];
                    if (use_bias) dp[bias_at + std::size_t(f)] += d;
                    for (std::int64_t ky = 0; ky < g.kh; ++ky)
                        for (std::int64_t kx = 0; kx < g.kw; ++kx) {
                            const std::int64_t iy = oy * g.sh + ky - g.pt, ix = ox * g.sw + kx - g.pl;
                            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                            for (std::int64_t ci = 0; ci < g.c; ++ci) {
                                const auto k = std::size_t(((ky * g.kw + kx) * g.c + ci) * filters + f);
                                const auto xi = std::size_t(g.xi(b, iy, ix, ci));
                                dx[xi] += d * params[k];
                                dp[k] += d * x[xi];
                            }
                        }
                }
}

// Direct max pooling: the maximum over window positions inside the image, and the gradient
// routed to the first maximum in row-major window order.
std::vector<double> naive_pool(const Geometry& g, std::int64_t n, const std::vector<double>& x,
                               const std::vector<double>* dy = nullptr, std::vector<double>* dx = nullptr) {
    std::vector<double> y(std::size_t(n * g.oh * g.ow * g.c));
    if (dx) dx->assign(x.size(), 0.0);
    for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t oy = 0; oy < g.oh; ++oy)
            for (std::int64_t ox = 0; ox < g.ow; ++ox)
                for (std::int64_t ci = 0; ci < g.c; ++ci) {
                    double best = -1e300;
                    std::int64_t at = -1;
                    for (std::int64_t ky = 0; ky < g.kh; ++ky)
                        for (std::int64_t kx = 0; kx < g.kw; ++kx) {
                            const std::int64_t iy = oy * g.sh + ky - g.pt, ix = ox * g.sw + kx - g.pl;
                            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                            const double v = x[std::size_t(g.xi(b, iy, ix, ci))];
                            if (at < 0 || v > best) {
                                best = v;
                                at = g.xi(b, iy, ix, ci);
                            }
                        }
                    const auto o = std::size_t(((b * g.oh + oy) * g.ow + ox) * g.c + ci);
                    y[o] = best;
                    if (dx) (*dx)[std::size_t(at)] += (*dy)[o];
                }
    return y;
}

// Direct average pooling: the mean over window positions inside the image (a "same" window at
// the border averages fewer values), and each window's gradient shared equally among them.
std::vector<double> naive_avg_pool(const Geometry& g, std::int64_t n, const std::vector<double>& x,
                                   const std::vector<double>* dy = nullptr, std::vector<double>* dx = nullptr) {
    std::vector<double> y(std::size_t(n * g.oh * g.ow * g.c));
    if (dx) dx->assign(x.size(), 0.0);
    for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t oy = 0; oy < g.oh; ++oy)
            for (std::int64_t ox = 0; ox < g.ow; ++ox)
                for (std::int64_t ci = 0; ci < g.c; ++ci) {
                    std::vector<std::int64_t> inside;
                    for (std::int64_t ky = 0; ky < g.kh; ++ky)
                        for (std::int64_t kx = 0; kx < g.kw; ++kx) {
                            const std::int64_t iy = oy * g.sh + ky - g.pt, ix = ox * g.sw + kx - g.pl;
                            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) inside.push_back(g.xi(b, iy, ix, ci));
                        }
                    double s = 0;
                    for (auto i : inside) s += x[std::size_t(i)];
                    const auto o = std::size_t(((b * g.oh + oy) * g.ow + ox) * g.c + ci);
                    y[o] = s / double(inside.size());
                    if (dx)
                        for (auto i : inside) (*dx)[std::size_t(i)] += (*dy)[o] / double(inside.size());
                }
    return y;
}

// Direct global average pooling over [n, h, w, c]: [n, c].
std::vector<double> naive_global_avg_pool(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c,
                                          const std::vector<double>& x, const std::vector<double>* dy = nullptr,
                                          std::vector<double>* dx = nullptr) {
    std::vector<double> y(std::size_t(n * c), 0.0);
    if (dx) dx->assign(x.size(), 0.0);
    for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t p = 0; p < h * w; ++p)
            for (std::int64_t ci = 0; ci < c; ++ci) {
                const auto i = std::size_t((b * h * w + p) * c + ci), o = std::size_t(b * c + ci);
                y[o] += x[i] / double(h * w);
                if (dx) (*dx)[i] = (*dy)[o] / double(h * w);
            }
    return y;
}

double relu(double v) { return v > 0 ? v : 0; }

/// Conv2D forward and backward on place P in precision T against naive_conv in float64.
template <class Spec, class In, class T, class P>
void check_conv_against_reference(std::int64_t n, std::uint64_t seed) {
    using L = typename Spec::template bind<In, T, P>;
    const auto g = Geometry::of_conv<Spec, In>();
    static_assert(L::output_shape::rank == 3);
    REQUIRE(L::output_shape::dims[0] == g.oh);
    REQUIRE(L::output_shape::dims[1] == g.ow);
    REQUIRE(L::output_shape::dims[2] == Spec::filters);
    constexpr bool is_relu = std::is_same_v<typename Spec::activation, ReLU>;
    static_assert(is_relu || std::is_same_v<typename Spec::activation, Linear>, "the reference knows Linear and ReLU");
    LayerRun<Spec, In, T, P> run(n, reference_values(L::num_params, seed, -0.5, 0.5), reference_values(n * In::size, seed + 1));
    const auto w = reference_values(run.out_size(), seed + 2);
    const auto r = run.run(&w);
    auto z = naive_conv(g, n, Spec::filters, run.x, run.params, Spec::use_bias);
    auto dz = w;
    for (std::size_t i = 0; i < z.size(); ++i) {
        if (is_relu && z[i] <= 0) dz[i] = 0;
        if (is_relu) z[i] = relu(z[i]);
    }
    std::vector<double> dx, dp;
    naive_conv_backward(g, n, Spec::filters, run.x, run.params, dz, Spec::use_bias, dx, dp);
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
    CHECK(relative_error(r.y, z) <= tol);
    CHECK(relative_error(r.dx, dx) <= tol);
    CHECK(relative_error(r.dparams, dp) <= tol);
}

/// MaxPooling2D forward and backward on place P in precision T against naive_pool.
template <class Spec, class In, class T, class P>
void check_pool_against_reference(std::int64_t n, std::uint64_t seed) {
    using L = typename Spec::template bind<In, T, P>;
    const auto g = Geometry::of_pool<Spec, In>();
    REQUIRE(L::output_shape::dims[0] == g.oh);
    REQUIRE(L::output_shape::dims[1] == g.ow);
    REQUIRE(L::output_shape::dims[2] == g.c);
    LayerRun<Spec, In, T, P> run(n, {}, distinct_values(n * In::size, seed));
    const auto w = reference_values(run.out_size(), seed + 2);
    const auto r = run.run(&w);
    std::vector<double> dx;
    const auto y = naive_pool(g, n, run.x, &w, &dx);
    // Values are exact copies; gradients are sums of a few values, equal up to summation order
    // (which differs between the host's per-row and CUDA's per-element passes).
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-15;
    CHECK(relative_error(r.y, y) <= tol);
    CHECK(relative_error(r.dx, dx) <= tol);
}

/// AveragePooling2D forward and backward on place P in precision T against naive_avg_pool.
template <class Spec, class In, class T, class P>
void check_avg_pool_against_reference(std::int64_t n, std::uint64_t seed) {
    using L = typename Spec::template bind<In, T, P>;
    const auto g = Geometry::of_pool<Spec, In>();
    REQUIRE(L::output_shape::dims[0] == g.oh);
    REQUIRE(L::output_shape::dims[1] == g.ow);
    REQUIRE(L::output_shape::dims[2] == g.c);
    LayerRun<Spec, In, T, P> run(n, {}, reference_values(n * In::size, seed));
    const auto w = reference_values(run.out_size(), seed + 2);
    const auto r = run.run(&w);
    std::vector<double> dx;
    const auto y = naive_avg_pool(g, n, as_double(on_place<T, Host>(run.x, Shape{n * In::size}).view()), &w, &dx);
    // Sums in float64 rounded once: within an ulp of T (the inputs are rounded to T first).
    const double tol = std::is_same_v<T, float> ? 2e-7 : 1e-15;
    CHECK(relative_error(r.y, y) <= tol);
    CHECK(relative_error(r.dx, dx) <= tol);
}

/// GlobalAveragePooling2D forward and backward on place P in precision T against the direct form.
template <class In, class T, class P>
void check_global_avg_pool_against_reference(std::int64_t n, std::uint64_t seed) {
    using L = GlobalAveragePooling2D::bind<In, T, P>;
    static_assert(std::is_same_v<typename L::output_shape, StaticShape<In::dims[2]>>);
    LayerRun<GlobalAveragePooling2D, In, T, P> run(n, {}, reference_values(n * In::size, seed));
    const auto w = reference_values(run.out_size(), seed + 2);
    const auto r = run.run(&w);
    std::vector<double> dx;
    const auto y = naive_global_avg_pool(n, In::dims[0], In::dims[1], In::dims[2],
                                         as_double(on_place<T, Host>(run.x, Shape{n * In::size}).view()), &w, &dx);
    const double tol = std::is_same_v<T, float> ? 2e-7 : 1e-14;
    CHECK(relative_error(r.y, y) <= tol);
    CHECK(relative_error(r.dx, dx) <= tol);
}

using Mnist = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>, MaxPooling2D<2>, Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
                         Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
static_assert(Mnist::num_params == 121930, "the reference MNIST model has Keras's 121,930 parameters");
static_assert(std::is_same_v<Mnist::output_shape, StaticShape<10>>);

// Shapes worked out at compile time (Keras's formulas).
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, Conv2D<4, 3, Linear, 2, Padding::Same>>::output_shape, StaticShape<4, 3, 4>>);
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, Conv2D<4, 3>>::output_shape, StaticShape<5, 3, 4>>);
static_assert(std::is_same_v<Sequential<Input<8, 7, 2>, Conv2D<3, 3, ReLU, 2>>::output_shape, StaticShape<3, 3, 3>>);
static_assert(std::is_same_v<Sequential<Input<32, 48, 3>, Conv2DRect<16, 3, 5, ReLU, 1, 2, Padding::Same>>::output_shape,
                             StaticShape<32, 24, 16>>);
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, MaxPooling2D<2>>::output_shape, StaticShape<3, 2, 3>>);
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, MaxPooling2D<2, 2, Padding::Same>>::output_shape, StaticShape<4, 3, 3>>);
static_assert(std::is_same_v<Sequential<Input<13, 13, 8>, MaxPooling2D<3, 2>>::output_shape, StaticShape<6, 6, 8>>);
static_assert(std::is_same_v<Sequential<Input<7, 9, 3>, MaxPooling2DRect<3, 2, 2, 2, Padding::Same>>::output_shape,
                             StaticShape<4, 5, 3>>);
static_assert(std::is_same_v<Sequential<Input<4, 5, 6>, Dropout<25>>::output_shape, StaticShape<4, 5, 6>>);
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, AveragePooling2D<2>>::output_shape, StaticShape<3, 2, 3>>);
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, AveragePooling2D<2, 2, Padding::Same>>::output_shape, StaticShape<4, 3, 3>>);
static_assert(std::is_same_v<Sequential<Input<13, 13, 8>, AveragePooling2D<3, 2>>::output_shape, StaticShape<6, 6, 8>>);
static_assert(std::is_same_v<Sequential<Input<8, 8, 2>, AveragePooling2D<2, 3>>::output_shape, StaticShape<3, 3, 2>>);
static_assert(std::is_same_v<Sequential<Input<7, 9, 3>, AveragePooling2DRect<3, 2, 2, 2, Padding::Same>>::output_shape,
                             StaticShape<4, 5, 3>>);
static_assert(std::is_same_v<Sequential<Input<7, 5, 3>, GlobalAveragePooling2D>::output_shape, StaticShape<3>>);
static_assert(Sequential<Input<8, 8, 16>, GlobalAveragePooling2D, Dense<10, Softmax>>::num_params == 16 * 10 + 10);

}  // namespace

// ---- finite differences -----------------------------------------------------------------

TEST_CASE("Dense gradients match finite differences for every activation") {
    using In = StaticShape<7>;
    check_layer<Dense<5>, In>(3, 1);
    check_relu_layer<Dense<5, ReLU>, Dense<5>, In>(3, 2);
    check_layer<Dense<5, Sigmoid>, In>(3, 3);
    check_layer<Dense<5, Tanh>, In>(3, 4);
    check_layer<Dense<5, Softmax>, In>(3, 5);
    check_layer<Dense<4, Tanh, false>, In>(2, 6);
}

TEST_CASE("Conv2D gradients match finite differences") {
    SUBCASE("3x3, valid, stride 1") { check_layer<Conv2D<4, 3, Tanh>, StaticShape<7, 5, 3>>(2, 11); }
    SUBCASE("3x3, same, stride 1") { check_layer<Conv2D<4, 3, Linear, 1, Padding::Same>, StaticShape<7, 5, 3>>(2, 12); }
    SUBCASE("3x3, same, stride 2") { check_layer<Conv2D<4, 3, Sigmoid, 2, Padding::Same>, StaticShape<7, 5, 3>>(3, 13); }
    SUBCASE("3x3, valid, stride 2, ReLU") {
        check_relu_layer<Conv2D<3, 3, ReLU, 2>, Conv2D<3, 3, Linear, 2>, StaticShape<8, 7, 2>>(2, 14);
    }
    SUBCASE("1x1, stride 1 (no im2col)") { check_layer<Conv2D<5, 1, Tanh>, StaticShape<4, 6, 3>>(2, 15); }
    SUBCASE("1x1, stride 2") { check_layer<Conv2D<2, 1, Linear, 2>, StaticShape<5, 5, 3>>(2, 16); }
    SUBCASE("1x1, stride 2, same") { check_layer<Conv2D<2, 1, Linear, 2, Padding::Same>, StaticShape<5, 4, 2>>(2, 17); }
    SUBCASE("3x2 kernel, strides 2x1, same") { check_layer<Conv2DRect<3, 3, 2, Tanh, 2, 1, Padding::Same>, StaticShape<6, 7, 2>>(2, 18); }
    SUBCASE("2x3 kernel, strides 1x2, valid, no bias") {
        check_layer<Conv2DRect<2, 2, 3, Linear, 1, 2, Padding::Valid, false>, StaticShape<5, 8, 3>>(2, 19);
    }
    SUBCASE("even kernel larger than the stride, same") { check_layer<Conv2D<3, 4, Tanh, 3, Padding::Same>, StaticShape<5, 7, 2>>(2, 20); }
    SUBCASE("kernel larger than the image, same") { check_layer<Conv2D<2, 5, Linear, 1, Padding::Same>, StaticShape<3, 2, 1>>(2, 21); }
    SUBCASE("1x1 image, same") { check_layer<Conv2D<2, 3, Tanh, 1, Padding::Same>, StaticShape<1, 1, 2>>(3, 22); }
    SUBCASE("softmax over channels") { check_layer<Conv2D<4, 3, Softmax>, StaticShape<5, 5, 2>>(2, 23); }
    SUBCASE("kernel as large as the image") { check_layer<Conv2D<3, 3, Tanh>, StaticShape<3, 3, 2>>(2, 24); }
    // With stride 1 and no more filters than channels the host takes the data gradient as a
    // convolution with the turned kernel (nn/conv2d.hpp, transposed_data): an even kernel pads
    // unevenly (one more after), which the turned kernel's padding must mirror; valid padding
    // becomes full padding.
    SUBCASE("even 2x4 kernel, stride 1, same, fewer filters than channels") {
        check_layer<Conv2DRect<2, 2, 4, Tanh, 1, 1, Padding::Same>, StaticShape<5, 7, 3>>(2, 25);
    }
    SUBCASE("3x3, valid, stride 1, fewer filters than channels") { check_layer<Conv2D<2, 3, Linear>, StaticShape<6, 5, 6>>(3, 26); }
}

TEST_CASE("MaxPooling2D gradients match finite differences") {
    SUBCASE("2x2, valid, odd sizes") { check_pooling<MaxPooling2D<2>, StaticShape<7, 5, 3>>(2, 31); }
    SUBCASE("2x2, same, odd sizes") { check_pooling<MaxPooling2D<2, 2, Padding::Same>, StaticShape<7, 5, 3>>(2, 32); }
    SUBCASE("3x3 stride 2 (overlapping), valid") { check_pooling<MaxPooling2D<3, 2>, StaticShape<7, 7, 2>>(2, 33); }
    SUBCASE("3x3 stride 1 (overlapping), same") { check_pooling<MaxPooling2D<3, 1, Padding::Same>, StaticShape<5, 6, 2>>(2, 34); }
    SUBCASE("3x2 window, strides 2x1, same") { check_pooling<MaxPooling2DRect<3, 2, 2, 1, Padding::Same>, StaticShape<7, 5, 3>>(2, 35); }
    SUBCASE("stride larger than the window") { check_pooling<MaxPooling2D<2, 3>, StaticShape<8, 8, 2>>(2, 36); }
    SUBCASE("window larger than the image, same") { check_pooling<MaxPooling2D<4, 1, Padding::Same>, StaticShape<3, 2, 2>>(2, 37); }
}

TEST_CASE("AveragePooling2D and GlobalAveragePooling2D gradients match finite differences") {
    SUBCASE("2x2, valid, odd sizes") { check_layer<AveragePooling2D<2>, StaticShape<7, 5, 3>>(2, 131); }
    SUBCASE("2x2, same, odd sizes") { check_layer<AveragePooling2D<2, 2, Padding::Same>, StaticShape<7, 5, 3>>(2, 132); }
    SUBCASE("3x3 stride 2 (overlapping), valid") { check_layer<AveragePooling2D<3, 2>, StaticShape<7, 7, 2>>(2, 133); }
    SUBCASE("3x3 stride 1 (overlapping), same") { check_layer<AveragePooling2D<3, 1, Padding::Same>, StaticShape<5, 6, 2>>(2, 134); }
    SUBCASE("3x2 window, strides 2x1, same") {
        check_layer<AveragePooling2DRect<3, 2, 2, 1, Padding::Same>, StaticShape<7, 5, 3>>(2, 135);
    }
    SUBCASE("stride larger than the window") { check_layer<AveragePooling2D<2, 3>, StaticShape<8, 8, 2>>(2, 136); }
    SUBCASE("window larger than the image, same") { check_layer<AveragePooling2D<4, 1, Padding::Same>, StaticShape<3, 2, 2>>(2, 137); }
    SUBCASE("global") { check_layer<GlobalAveragePooling2D, StaticShape<5, 3, 4>>(3, 138); }
    SUBCASE("global, 1x1 image") { check_layer<GlobalAveragePooling2D, StaticShape<1, 1, 3>>(2, 139); }
}

TEST_CASE("Dropout gradients match finite differences in training") {
    const Mode train{.training = true, .step = 5, .seed = 99};
    check_layer<Dropout<30>, StaticShape<4, 5, 3>>(3, 41, train);
    check_layer<Dropout<1, 2>, StaticShape<17>>(5, 42, train);
    check_layer<Dropout<30>, StaticShape<4, 5, 3>>(2, 43);  // inference: the identity
}

namespace {
/// Parameter gradients of a whole Network (through the flat buffers) against finite differences.
template <class Seq>
void check_network(std::int64_t n, std::uint64_t seed, const Mode& mode) {
    Network<Seq, double, Host> net;
    std::vector<double> params(std::size_t(Seq::num_params)), grads(params.size());
    net.init(params.data(), seed);
    params = reference_values(Seq::num_params, seed + 1, -0.5, 0.5);
    auto x = on_place<double, Host>(reference_values(n * Seq::input_shape::size, seed + 2), Seq::input_shape::batched(n));
    const auto w = reference_values(n * Seq::output_shape::size, seed + 3);
    auto objective = [&] { return dot(w, as_double(net.forward(params.data(), x.view(), mode))); };
    objective();
    std::copy(w.begin(), w.end(), net.output_grad().data());
    net.backward(params.data(), grads.data(), mode);
    std::vector<double> fd(params.size());
    const double h = 1e-6;
    for (std::size_t i = 0; i < params.size(); ++i) {
        const double old = params[i];
        params[i] = old + h;
        const double fp = objective();
        params[i] = old - h;
        const double fm = objective();
        params[i] = old;
        fd[i] = (fp - fm) / (2 * h);
    }
    // Per layer, so that a small layer's error is not hidden by a large one's scale.
    for (const auto& p : Seq::parameters()) {
        const auto first = std::size_t(p.offset), count = std::size_t(p.shape.size());
        std::vector<double> a(fd.begin() + std::ptrdiff_t(first), fd.begin() + std::ptrdiff_t(first + count));
        std::vector<double> b(grads.begin() + std::ptrdiff_t(first), grads.begin() + std::ptrdiff_t(first + count));
        INFO(p.name << ": relative error " << relative_error(a, b));
        CHECK(relative_error(a, b) <= 1e-6);
    }
}
}  // namespace

TEST_CASE("Flatten passes gradients through unchanged (in a Network)") {
    using Seq = Sequential<Input<3, 4, 2>, Flatten, Dense<5, Tanh>>;
    check_network<Seq>(3, 51, Mode{});
    // Flatten is a view: the model is Dense on the NHWC-flattened input.
    Network<Seq, double, Host> net;
    std::vector<double> params = reference_values(Seq::num_params, 52);
    auto x = on_place<double, Host>(reference_values(2 * 24, 53), Shape{2, 3, 4, 2});
    const auto y = as_double(net.forward(params.data(), x.view(), Mode{}));
    LayerRun<Dense<5, Tanh>, StaticShape<24>> dense(2, params, as_double(x.view()));
    CHECK(relative_error(y, dense.forward()) == 0.0);
}

TEST_CASE("a Network of every layer has the finite-difference parameter gradients") {
    using Seq = Sequential<Input<9, 8, 2>, Conv2D<3, 3, Tanh, 1, Padding::Same>, MaxPooling2D<2>, Conv2D<4, 2, Sigmoid>,
                           Dropout<25>, Flatten, Dense<6, Tanh>, Dense<3, Softmax>>;
    check_network<Seq>(2, 61, Mode{.training = true, .step = 3, .seed = 7});
    check_network<Seq>(2, 62, Mode{});
}

TEST_CASE("Conv2D then MaxPooling2D in a Network: the fused forward gives the layers' own bits, stored or not") {
    // On the host a Network runs the pooling on each chunk of the convolution's output
    // (nn/conv2d.hpp, forward_then); with Mode::no_backward the convolution's output is not
    // even stored. Either way the output must be that of the two layers run one by one.
    using Seq = Sequential<Input<12, 11, 3>, Conv2D<8, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<4>>;
    const int before = strata::num_threads();
    for (int threads : {1, 2, 3}) {
        strata::set_num_threads(threads);
        const std::int64_t n = 7;
        const auto params = reference_values(Seq::num_params, 91, -0.5, 0.5);
        const auto xs = reference_values(n * Seq::input_shape::size, 92);
        Network<Seq, double, Host> net;
        auto x = on_place<double, Host>(xs, Seq::input_shape::batched(n));
        const auto stored = as_double(net.forward(params.data(), x.view(), Mode{}));
        Mode inference{};
        inference.no_backward = true;
        const auto unstored = as_double(net.forward(params.data(), x.view(), inference));
        // The layers one by one.
        using ConvL = Conv2D<8, 3, ReLU>::bind<StaticShape<12, 11, 3>, double, Host>;
        std::vector<double> conv_params(params.begin(), params.begin() + ConvL::num_params);
        LayerRun<Conv2D<8, 3, ReLU>, StaticShape<12, 11, 3>> conv(n, conv_params, xs);
        LayerRun<MaxPooling2D<2>, ConvL::output_shape> pool(n, {}, conv.forward());
        std::vector<double> dense_params(params.begin() + ConvL::num_params, params.end());
        LayerRun<Dense<4>, StaticShape<5 * 4 * 8>> dense(n, dense_params, pool.forward());
        const auto separate = dense.forward();
        INFO("threads ", threads);
        CHECK(stored == separate);
        CHECK(unstored == separate);
    }
    strata::set_num_threads(before);
}

TEST_CASE("Conv2D then MaxPooling2D in a Network: the fused backward gives the layers' own bits") {
    // After a fused forward that did not store the convolutions' outputs, each convolution's
    // backward takes its chunks' output gradients (ReLU's derivative included) from the pooling
    // (Conv2D::backward_then): neither the convolution's output nor its gradient is stored. The
    // gradients must be those of the layers run one by one, bit for bit, at any thread count
    // and with one or many chunks; the second convolution also passes its input gradient on.
    // 12x11 -> 10x9 leaves the last column out of every window (its gradient is zero).
    using C1 = Conv2D<8, 3, ReLU>;
    using C2 = Conv2D<6, 2, ReLU>;
    using Seq = Sequential<Input<12, 11, 3>, C1, MaxPooling2D<2>, C2, MaxPooling2D<2>, Flatten, Dense<4>>;
    using C1L = C1::bind<StaticShape<12, 11, 3>, double, Host>;
    using P1L = MaxPooling2D<2>::bind<C1L::output_shape, double, Host>;
    using C2L = C2::bind<P1L::output_shape, double, Host>;
    using P2L = MaxPooling2D<2>::bind<C2L::output_shape, double, Host>;
    static_assert(C1L::fuses_backward<P1L> && C2L::fuses_backward<P2L>);
    const int before = strata::num_threads();
    for (std::int64_t n : {7, 90}) {
        const auto params = reference_values(Seq::num_params, 93, -0.5, 0.5);
        const auto xs = reference_values(n * Seq::input_shape::size, 94);
        const auto w = reference_values(n * 4, 95);
        // The layers one by one.
        const auto at = [&](std::int64_t first, std::int64_t count) {
            return std::vector<double>(params.begin() + first, params.begin() + first + count);
        };
        LayerRun<C1, StaticShape<12, 11, 3>> c1(n, at(0, C1L::num_params), xs);
        LayerRun<MaxPooling2D<2>, C1L::output_shape> p1(n, {}, c1.forward());
        LayerRun<C2, P1L::output_shape> c2(n, at(C1L::num_params, C2L::num_params), p1.forward());
        LayerRun<MaxPooling2D<2>, C2L::output_shape> p2(n, {}, c2.forward());
        const std::int64_t dense_first = C1L::num_params + C2L::num_params;
        LayerRun<Dense<4>, StaticShape<P2L::output_shape::size>> d(n, at(dense_first, Seq::num_params - dense_first), p2.forward());
        const auto rd = d.run(&w);
        const auto r4 = p2.run(&rd.dx);
        const auto r3 = c2.run(&r4.dx);
        const auto r2 = p1.run(&r3.dx);
        const auto r1 = c1.run(&r2.dx);
        std::vector<double> separate = r1.dparams;
        separate.insert(separate.end(), r3.dparams.begin(), r3.dparams.end());
        separate.insert(separate.end(), rd.dparams.begin(), rd.dparams.end());
        REQUIRE(std::any_of(r1.dparams.begin(), r1.dparams.end(), [](double v) { return v != 0; }));
        REQUIRE(std::count(r2.dx.begin(), r2.dx.end(), 0.0) > std::int64_t(r2.dx.size()) / 2);  // pooling and ReLU zeros
        for (int threads : {1, 2, 3}) {
            strata::set_num_threads(threads);
            Network<Seq, double, Host> net;
            auto x = on_place<double, Host>(xs, Seq::input_shape::batched(n));
            const Mode training{.training = true};
            net.forward(params.data(), x.view(), training);
            auto dy = on_place<double, Host>(w, Shape{n, 4});
            copy(dy.view(), net.output_grad());
            std::vector<double> grads(std::size_t(Seq::num_params), -1.0);
            net.backward(params.data(), grads.data(), training);
            INFO("batch ", n, ", threads ", threads);
            CHECK(grads == separate);
        }
    }
    strata::set_num_threads(before);
}

TEST_CASE("a user-defined layer (examples/prelu.hpp) has the finite-difference gradients, alone and in a Network") {
    static_assert(Layer<example::PReLUImpl<StaticShape<4, 3>, double, Host>, double, Host>);
    static_assert(LayerSpec<example::PReLU>);
    auto run = random_run<example::PReLU, StaticShape<4, 3>>(5, 71);
    double closest = 1e300;
    for (double v : run.x) closest = std::min(closest, std::abs(v));
    REQUIRE(closest > 1e-5);  // the ±1e-6 steps never cross the kink at 0
    CHECK(std::any_of(run.x.begin(), run.x.end(), [](double v) { return v < 0; }));  // both sides are exercised
    CHECK(std::any_of(run.x.begin(), run.x.end(), [](double v) { return v > 0; }));
    check_gradients(run, 71);

    using Seq = Sequential<Input<6>, Dense<5>, example::PReLU, Dense<3, Tanh>>;
    check_network<Seq>(4, 72, Mode{});
    const auto params = Seq::parameters();
    REQUIRE(params.size() == 5);
    CHECK(params[2].name == "p_re_lu/alpha");
    CHECK(params[2].shape == Shape{5});
    CHECK(strata_test::has(Seq::summary(), "p_re_lu (PReLU)"));
}

// ---- against naive references -----------------------------------------------------------

TEST_CASE_TEMPLATE("Conv2D matches a direct convolution", P, STRATA_TEST_PLACES) {
    // The awkward case of the brief: 7x5 input, 3 channels in, 4 out, same padding, stride 2.
    check_conv_against_reference<Conv2D<4, 3, Linear, 2, Padding::Same>, StaticShape<7, 5, 3>, double, P>(3, 71);
    check_conv_against_reference<Conv2D<4, 3, Linear, 2, Padding::Same>, StaticShape<7, 5, 3>, float, P>(3, 71);
    check_conv_against_reference<Conv2D<4, 3>, StaticShape<7, 5, 3>, double, P>(2, 72);
    check_conv_against_reference<Conv2D<6, 3, ReLU, 1, Padding::Same>, StaticShape<6, 9, 5>, float, P>(4, 73);
    check_conv_against_reference<Conv2DRect<3, 2, 5, Linear, 3, 2, Padding::Same>, StaticShape<10, 11, 2>, double, P>(2, 74);
    check_conv_against_reference<Conv2DRect<3, 4, 1, Linear, 1, 1, Padding::Valid, false>, StaticShape<6, 3, 4>, double, P>(2, 75);
    check_conv_against_reference<Conv2D<5, 1>, StaticShape<3, 4, 7>, double, P>(3, 76);
    check_conv_against_reference<Conv2D<32, 3, ReLU>, StaticShape<28, 28, 1>, float, P>(3, 77);
    check_conv_against_reference<Conv2D<16, 3, ReLU>, StaticShape<13, 13, 32>, float, P>(2, 78);
}

TEST_CASE("Conv2D on the host: many chunks per group match the reference, and no figure depends on the thread count") {
    // The host convolution cuts a batch into chunks of whole images and sums the weight
    // gradient over at most 16 groups of consecutive chunks (nn/conv2d.hpp). 40 images of the
    // seed CNN's first layer make 40 one-image chunks in 16 groups of 2 or 3; 7 images of its
    // second layer make 7 groups of one. Both are checked against the float64 reference, then
    // run with 1, 2 and 3 threads: outputs and gradients must be bitwise equal.
    check_conv_against_reference<Conv2D<32, 3, ReLU>, StaticShape<28, 28, 1>, float, Host>(40, 79);
    check_conv_against_reference<Conv2D<64, 3, ReLU>, StaticShape<13, 13, 32>, float, Host>(7, 80);
    // The resnet's first stage (16 channels in and out, same padding): its data gradient is the
    // turned kernel's convolution (transposed_data), one image a chunk.
    check_conv_against_reference<Conv2D<16, 3, Linear, 1, Padding::Same, false>, StaticShape<28, 28, 16>, float, Host>(9, 85);
    const int before = strata::num_threads();
    auto same_bits_on_1_2_3_threads = [](auto& f, const std::vector<double>& w) {
        strata::set_num_threads(1);
        const auto one = f.run(&w);
        for (int t : {2, 3}) {
            strata::set_num_threads(t);
            const auto r = f.run(&w);
            INFO("threads ", t);
            CHECK(r.y == one.y);
            CHECK(r.dx == one.dx);
            CHECK(r.dparams == one.dparams);
        }
    };
    {
        auto run = random_run<Conv2D<32, 3, ReLU>, StaticShape<28, 28, 1>>(40, 81);
        LayerRun<Conv2D<32, 3, ReLU>, StaticShape<28, 28, 1>, float, Host> f(40, run.params, run.x);
        same_bits_on_1_2_3_threads(f, reference_values(f.out_size(), 82));
    }
    {
        auto run = random_run<Conv2D<64, 3, ReLU>, StaticShape<13, 13, 32>>(7, 83);
        LayerRun<Conv2D<64, 3, ReLU>, StaticShape<13, 13, 32>, float, Host> f(7, run.params, run.x);
        same_bits_on_1_2_3_threads(f, reference_values(f.out_size(), 84));
    }
    {
        using Stage1 = Conv2D<16, 3, Linear, 1, Padding::Same, false>;
        auto run = random_run<Stage1, StaticShape<28, 28, 16>>(9, 86);
        LayerRun<Stage1, StaticShape<28, 28, 16>, float, Host> f(9, run.params, run.x);
        same_bits_on_1_2_3_threads(f, reference_values(f.out_size(), 87));
    }
    strata::set_num_threads(before);
}

namespace element_forms {
// The GPU's element kernels (one thread per output element: Im2ColElements, Col2ImElements,
// MaxPoolElements, MaxPoolBackwardElements) are plain functors: run here over every index, with
// 32-bit and with 64-bit indices (nn::detail::for_each_index picks one on a GPU), against the
// host's row forms. Outputs are poisoned with NaN first, so an element never written fails.
template <class I, class F>
void each(std::int64_t count, const F& f) {
    for (std::int64_t i = 0; i < count; ++i) f(I(i));
}
std::vector<double> values(std::size_t n, std::uint64_t seed) {
    std::vector<double> v(n);
    for (auto& x : v) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x = double(seed >> 11) / double(1ull << 53) * 2 - 1;
    }
    return v;
}
template <class G>
void check() {
    using namespace strata::nn::detail;
    constexpr std::int64_t n = 2;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::int64_t in_size = n * G::h * G::w * G::c, col_size = n * G::oh * G::ow * G::patch,
                       out_size = n * G::oh * G::ow * G::c;
    const auto x = values(std::size_t(in_size), 3);
    // im2col: exact (copies).
    std::vector<double> rows(std::size_t(col_size), nan);
    for (std::int64_t r = 0; r < n * G::oh; ++r) Im2ColRows<double, G>{x.data(), rows.data()}(r);
    for (bool wide : {false, true}) {
        std::vector<double> el(std::size_t(col_size), nan);
        const Im2ColElements<double, G> f{x.data(), el.data()};
        wide ? each<std::int64_t>(col_size, f) : each<std::int32_t>(col_size, f);
        CHECK(el == rows);
    }
    // col2im: each input element gathers its patches' entries in the same (ky, kx) order.
    const auto dcol = values(std::size_t(col_size), 5);
    std::vector<double> dx_rows(std::size_t(in_size), nan);
    for (std::int64_t r = 0; r < n * G::h; ++r) Col2ImRows<double, G>{dcol.data(), dx_rows.data()}(r);
    for (bool wide : {false, true}) {
        std::vector<double> el(std::size_t(in_size), nan);
        const Col2ImElements<double, G> f{dcol.data(), el.data()};
        wide ? each<std::int64_t>(in_size, f) : each<std::int32_t>(in_size, f);
        CHECK(el == dx_rows);
    }
    // Max pooling, forward (values and positions) and backward.
    std::vector<double> y_rows(std::size_t(out_size), nan);
    std::vector<std::int32_t> arg_rows(std::size_t(out_size), -1);
    for (std::int64_t r = 0; r < n * G::oh; ++r) MaxPoolRows<double, G>{x.data(), y_rows.data(), arg_rows.data()}(r);
    const auto dy = values(std::size_t(out_size), 7);
    std::vector<double> back_rows(std::size_t(in_size), nan);
    for (std::int64_t r = 0; r < n * G::h; ++r) MaxPoolBackwardRows<double, G>{dy.data(), arg_rows.data(), back_rows.data()}(r);
    for (bool wide : {false, true}) {
        std::vector<double> y(std::size_t(out_size), nan), back(std::size_t(in_size), nan);
        std::vector<std::int32_t> arg(std::size_t(out_size), -1);
        const MaxPoolElements<double, G> f{x.data(), y.data(), arg.data()};
        wide ? each<std::int64_t>(out_size, f) : each<std::int32_t>(out_size, f);
        CHECK(y == y_rows);
        CHECK(arg == arg_rows);
        const MaxPoolBackwardElements<double, G> b{dy.data(), arg.data(), back.data()};
        wide ? each<std::int64_t>(in_size, b) : each<std::int32_t>(in_size, b);
        for (std::size_t i = 0; i < back.size(); ++i) CHECK(back[i] == doctest::Approx(back_rows[i]).epsilon(1e-15));
    }
    // Average pooling: the same terms in the same order, so the same bits.
    std::vector<double> avg_rows(std::size_t(out_size), nan), avg_back_rows(std::size_t(in_size), nan);
    for (std::int64_t r = 0; r < n * G::oh; ++r) AvgPoolRows<double, G>{x.data(), avg_rows.data()}(r);
    for (std::int64_t r = 0; r < n * G::h; ++r) AvgPoolBackwardRows<double, G>{dy.data(), avg_back_rows.data()}(r);
    for (bool wide : {false, true}) {
        std::vector<double> y(std::size_t(out_size), nan), back(std::size_t(in_size), nan);
        const AvgPoolElements<double, G> f{x.data(), y.data()};
        wide ? each<std::int64_t>(out_size, f) : each<std::int32_t>(out_size, f);
        CHECK(y == avg_rows);
        const AvgPoolBackwardElements<double, G> b{dy.data(), back.data()};
        wide ? each<std::int64_t>(in_size, b) : each<std::int32_t>(in_size, b);
        CHECK(back == avg_back_rows);
    }
    // Global average pooling over the input image.
    using GP = GlobalPool<StaticShape<G::h, G::w, G::c>>;
    const std::int64_t pooled = n * G::c;
    std::vector<double> gap_rows(std::size_t(pooled), nan), gap_back_rows(std::size_t(in_size), nan);
    for (std::int64_t b = 0; b < n; ++b) GlobalAvgPoolRows<double, GP>{x.data(), gap_rows.data()}(b);
    const auto gdy = values(std::size_t(pooled), 9);
    for (std::int64_t r = 0; r < n * G::h; ++r) GlobalAvgPoolBackwardRows<double, GP>{gdy.data(), gap_back_rows.data()}(r);
    for (bool wide : {false, true}) {
        std::vector<double> y(std::size_t(pooled), nan), back(std::size_t(in_size), nan);
        const GlobalAvgPoolElements<double, GP> f{x.data(), y.data()};
        wide ? each<std::int64_t>(pooled, f) : each<std::int32_t>(pooled, f);
        CHECK(y == gap_rows);
        const GlobalAvgPoolBackwardElements<double, GP> b{gdy.data(), back.data()};
        wide ? each<std::int64_t>(in_size, b) : each<std::int32_t>(in_size, b);
        CHECK(back == gap_back_rows);
    }
}
}  // namespace element_forms

TEST_CASE("the GPU's element kernels give the host forms' figures, with 32- and 64-bit indices (run on the host)") {
    using strata::nn::detail::Window2D;
    element_forms::check<Window2D<StaticShape<7, 6, 3>, 3, 3, 1, 1, Padding::Valid>>();  // the convolutions' shape
    element_forms::check<Window2D<StaticShape<7, 9, 4>, 3, 2, 2, 2, Padding::Same>>();   // overlapping rows, padding
    element_forms::check<Window2D<StaticShape<8, 8, 2>, 2, 2, 2, 2, Padding::Valid>>();  // MaxPooling2D<2>
    element_forms::check<Window2D<StaticShape<5, 5, 1>, 3, 3, 2, 2, Padding::Same>>();   // one channel, stride 2
}

TEST_CASE_TEMPLATE("MaxPooling2D matches a direct max pooling", P, STRATA_TEST_PLACES) {
    check_pool_against_reference<MaxPooling2D<2>, StaticShape<7, 5, 3>, double, P>(3, 81);
    check_pool_against_reference<MaxPooling2D<2, 2, Padding::Same>, StaticShape<7, 5, 3>, float, P>(3, 82);
    check_pool_against_reference<MaxPooling2D<3, 2, Padding::Same>, StaticShape<7, 5, 3>, double, P>(2, 83);
    check_pool_against_reference<MaxPooling2D<3, 1>, StaticShape<6, 5, 4>, double, P>(2, 84);
    check_pool_against_reference<MaxPooling2DRect<2, 3, 3, 2, Padding::Same>, StaticShape<7, 5, 3>, double, P>(2, 85);
    check_pool_against_reference<MaxPooling2D<2>, StaticShape<26, 26, 32>, float, P>(2, 86);
}

TEST_CASE_TEMPLATE("AveragePooling2D matches a direct average pooling", P, STRATA_TEST_PLACES) {
    check_avg_pool_against_reference<AveragePooling2D<2>, StaticShape<7, 5, 3>, double, P>(3, 181);
    check_avg_pool_against_reference<AveragePooling2D<2, 2, Padding::Same>, StaticShape<7, 5, 3>, float, P>(3, 182);
    check_avg_pool_against_reference<AveragePooling2D<3, 2, Padding::Same>, StaticShape<7, 5, 3>, double, P>(2, 183);
    check_avg_pool_against_reference<AveragePooling2D<3, 1>, StaticShape<6, 5, 4>, double, P>(2, 184);
    check_avg_pool_against_reference<AveragePooling2D<2, 3>, StaticShape<8, 8, 2>, float, P>(2, 185);
    check_avg_pool_against_reference<AveragePooling2DRect<2, 3, 3, 2, Padding::Same>, StaticShape<7, 5, 3>, double, P>(2, 186);
    check_avg_pool_against_reference<AveragePooling2D<2>, StaticShape<26, 26, 32>, float, P>(2, 187);
}

TEST_CASE_TEMPLATE("GlobalAveragePooling2D matches a direct mean over each image", P, STRATA_TEST_PLACES) {
    check_global_avg_pool_against_reference<StaticShape<7, 5, 3>, double, P>(3, 191);
    check_global_avg_pool_against_reference<StaticShape<7, 5, 3>, float, P>(3, 192);
    check_global_avg_pool_against_reference<StaticShape<1, 1, 6>, float, P>(2, 193);
    check_global_avg_pool_against_reference<StaticShape<16, 16, 64>, float, P>(5, 194);
}

TEST_CASE_TEMPLATE("MaxPooling2D gives a tied window's gradient to its first maximum", P, STRATA_TEST_PLACES) {
    using In = StaticShape<3, 3, 1>;
    // One 3x3 window whose maximum 5 appears at (0, 2), (1, 1) and (2, 0).
    LayerRun<MaxPooling2D<3>, In, float, P> run(1, {}, {1, 2, 5, 0, 5, 3, 5, 4, -1});
    const std::vector<double> w{2.5};
    const auto r = run.run(&w);
    CHECK(r.y == std::vector<double>{5});
    CHECK(r.dx == std::vector<double>{0, 0, 2.5, 0, 0, 0, 0, 0, 0});
}

// ---- NaN propagates ----------------------------------------------------------------------
// A NaN (a corrupted weight, a diverging step) must never come out as a finite value: ReLU once
// returned 0 for NaN and max pooling skipped a NaN that was not first in its window, so one NaN
// weight trained on with a finite loss.

namespace {
template <class T, class P, class Act>
void check_activation_propagates_nan() {
    const T nan = std::numeric_limits<T>::quiet_NaN();
    INFO(Act::name);
    // Forward: bias_activation on [2, 3], a NaN in each row's first column; the bias leaves the
    // rest finite.
    auto y = strata::copy_to<P>(strata::from_vector(std::vector<T>{nan, T(-1), T(2), nan, T(0.5), T(-0.0)}, Shape{2, 3}).view());
    bias_activation<Act>(y.view(), static_cast<const T*>(nullptr), 3, false);
    const auto out = strata::to_vector(y.view());
    CHECK(std::isnan(out[0]));
    CHECK(std::isnan(out[3]));
    if constexpr (Act::rowwise) {
        // A NaN anywhere in a softmax row makes the whole row NaN.
        CHECK(std::all_of(out.begin(), out.end(), [](T v) { return std::isnan(v); }));
    } else {
        CHECK(std::none_of(out.begin() + 1, out.begin() + 3, [](T v) { return std::isnan(v); }));
    }
    // Backward: a NaN output (the forward's NaN) and a NaN incoming gradient both give NaN, at a
    // unit that is on and at one that is off.
    const std::vector<T> ys = Act::rowwise ? std::vector<T>{nan, T(0.2), T(0.8), T(0.3), T(0.3), T(0.4)}
                                           : std::vector<T>{nan, T(0), T(0.25), T(0.5), T(0), T(0.25)};
    auto yt = strata::copy_to<P>(strata::from_vector(ys, Shape{2, 3}).view());
    auto dy = strata::copy_to<P>(strata::from_vector(std::vector<T>{T(1), T(1), T(1), T(1), nan, nan}, Shape{2, 3}).view());
    activation_backward<Act>(yt.view(), dy.view(), false);
    const auto g = strata::to_vector(dy.view());
    if constexpr (!std::is_same_v<Act, Linear>) CHECK(std::isnan(g[0]));  // NaN output (Linear's derivative is 1 anyway)
    CHECK(std::isnan(g[4]));  // NaN gradient (ReLU: where the unit is off)
    CHECK(std::isnan(g[5]));  // NaN gradient (ReLU: where the unit is on)
    if constexpr (!Act::rowwise) {
        CHECK(std::none_of(g.begin() + 1, g.begin() + 4, [](T v) { return std::isnan(v); }));
    }
}
}  // namespace

TEST_CASE_TEMPLATE("every activation propagates NaN, forward and backward", P, STRATA_TEST_PLACES) {
    check_activation_propagates_nan<float, P, Linear>();
    check_activation_propagates_nan<float, P, ReLU>();
    check_activation_propagates_nan<double, P, ReLU>();
    check_activation_propagates_nan<float, P, Sigmoid>();
    check_activation_propagates_nan<float, P, Tanh>();
    check_activation_propagates_nan<float, P, Softmax>();
    check_activation_propagates_nan<double, P, Softmax>();
}

TEST_CASE("ReLU gives the bits it always gave for every value that is not NaN") {
    // The NaN-propagating form must not change a trained figure: +0 for -0 and every negative
    // value, x itself otherwise; its derivative +0 where the unit is off.
    for (float x : {-0.0f, 0.0f, -1.5f, 1.5f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min()}) {
        const float old = x > 0.0f ? x : 0.0f;
        const float now = ReLU::apply(x);
        INFO("x = ", x);
        CHECK(std::memcmp(&old, &now, sizeof old) == 0);
        const float old_grad = old > 0.0f ? 3.0f : 0.0f;
        const float now_grad = ReLU::grad(old, 3.0f);
        CHECK(std::memcmp(&old_grad, &now_grad, sizeof old_grad) == 0);
    }
}

TEST_CASE_TEMPLATE("MaxPooling2D gives NaN for a window holding a NaN, forward and backward", P, STRATA_TEST_PLACES) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    using In = StaticShape<4, 4, 2>;
    // Two 2x2 windows per row, two channels. Channel 0: a NaN in the last position of window
    // (0, 0) and in the first of window (1, 1); channel 1: no NaN.
    std::vector<double> x(In::size);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = double(i % 7) - 3.0;
    auto at = [](int yy, int xx, int c) { return std::size_t((yy * 4 + xx) * 2 + c); };
    x[at(1, 1, 0)] = nan;  // window (0, 0), last position
    x[at(2, 2, 0)] = nan;  // window (1, 1), first position
    for (int threads : {1, 2}) {
        strata::set_num_threads(threads);
        LayerRun<MaxPooling2D<2>, In, float, P> run(1, {}, x, Mode{.training = true});
        std::vector<double> w(std::size_t(run.out_size()), 1.0);
        w[1] = nan;  // a NaN gradient for window (0, 0), channel 1
        const auto r = run.run(&w);
        INFO("threads ", threads);
        CHECK(std::isnan(r.y[0]));                // window (0, 0), channel 0
        CHECK(std::isnan(r.y[(1 * 2 + 1) * 2]));  // window (1, 1), channel 0
        CHECK(std::count_if(r.y.begin(), r.y.end(), [](double v) { return std::isnan(v); }) == 2);
        // The window's gradient goes to the NaN's position; a NaN gradient reaches the input.
        CHECK(r.dx[at(1, 1, 0)] == 1.0);
        CHECK(r.dx[at(0, 0, 0)] == 0.0);
        CHECK(std::count_if(r.dx.begin(), r.dx.end(), [](double v) { return std::isnan(v); }) == 1);
    }
    strata::set_num_threads(1);
}

TEST_CASE("Conv2D(ReLU) then MaxPooling2D fused in a Network: a NaN input comes out as NaN, forward and backward") {
    // The host Network pools each chunk of the convolution's output in cache and takes ReLU's
    // derivative at the pooled maximum (nn/conv2d.hpp): both must carry a NaN through.
    using Seq = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3>>;
    const std::int64_t n = 3;
    const auto params = reference_values(Seq::num_params, 71, -0.5, 0.5);
    auto xs = reference_values(n * Seq::input_shape::size, 72);
    xs[std::size_t(Seq::input_shape::size + 20)] = std::numeric_limits<double>::quiet_NaN();  // example 1 only
    Network<Seq, double, Host> net;
    auto x = on_place<double, Host>(xs, Seq::input_shape::batched(n));
    Mode inference{};
    inference.no_backward = true;
    for (const Mode& mode : {inference, Mode{.training = true}}) {
        const auto y = as_double(net.forward(params.data(), x.view(), mode));
        CHECK(std::none_of(y.begin(), y.begin() + 3, [](double v) { return std::isnan(v); }));
        CHECK(std::all_of(y.begin() + 3, y.begin() + 6, [](double v) { return std::isnan(v); }));
        CHECK(std::none_of(y.begin() + 6, y.end(), [](double v) { return std::isnan(v); }));
    }
    auto dy = on_place<double, Host>(std::vector<double>(std::size_t(n * 3), 1.0), Shape{n, 3});
    copy(dy.view(), net.output_grad());
    std::vector<double> grads(std::size_t(Seq::num_params), 0.0);
    net.backward(params.data(), grads.data(), Mode{.training = true});
    // The convolution's kernel gradient sums over every example: the NaN reaches it.
    CHECK(std::isnan(grads[0]));
    // Its bias gradient does only through the fused backward's ReLU derivative, taken at the
    // pooled maxima (NaN in example 1); Dense's input gradient is finite.
    constexpr std::int64_t bias = 3 * 3 * 1 * 4;
    CHECK(std::all_of(grads.begin() + bias, grads.begin() + bias + 4, [](double v) { return std::isnan(v); }));
}

// ---- the reference model ----------------------------------------------------------------

TEST_CASE("the reference MNIST model has Keras's size and summary") {
    CHECK(Mnist::num_params == 121930);
    const std::string s = Mnist::summary();
    INFO(s);
    for (const char* shape : {"(None, 26, 26, 32)", "(None, 13, 13, 32)", "(None, 11, 11, 64)", "(None, 5, 5, 64)",
                              "(None, 1600)", "(None, 64)", "(None, 10)"})
        CHECK(s.find(shape) != std::string::npos);
    CHECK(s.find("conv2d (Conv2D)") != std::string::npos);
    CHECK(s.find("conv2d_1 (Conv2D)") != std::string::npos);
    CHECK(s.find("max_pooling2d_1 (MaxPooling2D)") != std::string::npos);
    CHECK(s.find("121,930") != std::string::npos);
    const auto params = Mnist::parameters();
    REQUIRE(params.size() == 8);
    CHECK(params[0].name == "conv2d/kernel");
    CHECK(params[0].shape == Shape{3, 3, 1, 32});
    CHECK(params[2].name == "conv2d_1/kernel");
    CHECK(params[2].shape == Shape{3, 3, 32, 64});
    CHECK(params[3].offset == 320 + 18432);
}

TEST_CASE_TEMPLATE("the reference MNIST model trains a step on every place", P, STRATA_TEST_PLACES) {
    Network<Mnist, float, P> net;
    Tensor<float, P> params(Shape{Mnist::num_params}), grads(Shape{Mnist::num_params});
    net.init(params.data(), 3);
    // Glorot limits: conv2d sqrt(6 / (9 + 288)), zero biases.
    const auto p = strata::to_vector(params.view());
    const double limit = std::sqrt(6.0 / (9.0 + 288.0));
    CHECK(std::all_of(p.begin(), p.begin() + 288, [&](float v) { return std::abs(v) <= limit; }));
    CHECK(*std::max_element(p.begin(), p.begin() + 288) > 0.9 * limit);
    CHECK(std::all_of(p.begin() + 288, p.begin() + 320, [](float v) { return v == 0; }));
    for (std::int64_t n : {5, 3, 5}) {  // the buffers shrink and grow back without trouble
        auto x = on_place<float, P>(reference_values(n * 784, 91, 0, 1), Shape{n, 28, 28, 1});
        const auto y = as_double(net.forward(params.data(), x.view(), Mode{.training = true}));
        for (std::int64_t r = 0; r < n; ++r) {
            double s = 0;
            for (std::int64_t c = 0; c < 10; ++c) s += y[std::size_t(r * 10 + c)];
            CHECK(s == doctest::Approx(1.0).epsilon(1e-5));
        }
        auto g = on_place<float, P>(reference_values(n * 10, 92), Shape{n, 10});
        strata::copy(g.view(), net.output_grad());
        net.backward(params.data(), grads.data(), Mode{.training = true});
        const auto gv = strata::to_vector(grads.view());
        CHECK(std::all_of(gv.begin(), gv.end(), [](float v) { return std::isfinite(v); }));
        CHECK(std::any_of(gv.begin(), gv.begin() + 288, [](float v) { return v != 0; }));
    }
}

// ---- Dropout ----------------------------------------------------------------------------

TEST_CASE_TEMPLATE("Dropout is the identity in inference and drops `rate` in training", P, STRATA_TEST_PLACES) {
    using In = StaticShape<1000>;
    const std::int64_t n = 64;
    const std::vector<double> ones(std::size_t(n * 1000), 1.0);
    auto x = reference_values(n * 1000, 101);
    LayerRun<Dropout<25>, In, float, P> infer(n, {}, x);
    const auto r = infer.run(&ones);
    CHECK(relative_error(r.y, as_double(on_place<float, Host>(x, Shape{n * 1000}).view())) == 0.0);
    CHECK(r.dx == ones);

    LayerRun<Dropout<25>, In, float, P> train(n, {}, ones, Mode{.training = true, .step = 1, .seed = 5});
    const auto t = train.run(&ones);
    std::int64_t dropped = 0;
    for (std::size_t i = 0; i < t.y.size(); ++i) {
        if (t.y[i] == 0) ++dropped;
        else REQUIRE(t.y[i] == double(4.0f / 3.0f));
        REQUIRE(t.dx[i] == t.y[i]);  // the gradient uses the same mask and scale
    }
    // 64,000 draws: the standard deviation of the dropped fraction is 0.0017.
    CHECK(double(dropped) / double(t.y.size()) == doctest::Approx(0.25).epsilon(0.03));
}

TEST_CASE_TEMPLATE("Dropout's mask is a function of (seed, step, layer)", P, STRATA_TEST_PLACES) {
    using In = StaticShape<10, 10>;
    const auto ones = std::vector<double>(std::size_t(4 * 100), 1.0);
    auto mask = [&](std::uint64_t seed, std::uint64_t step, std::uint64_t stream = 0) {
        LayerRun<Dropout<1, 2>, In, float, P> run(4, {}, ones, Mode{.training = true, .step = step, .seed = seed});
        run.layer.set_stream(stream);
        return run.forward();
    };
    CHECK(mask(1, 1) == mask(1, 1));
    CHECK(mask(1, 1) != mask(1, 2));
    CHECK(mask(1, 1) != mask(2, 1));
    CHECK(mask(1, 1) != mask(1, 1, 16));
    // The mask does not depend on the place or on the thread count.
    if constexpr (!std::is_same_v<P, Host>) {
        LayerRun<Dropout<1, 2>, In, float, Host> host(4, {}, ones, Mode{.training = true, .step = 2, .seed = 3});
        CHECK(host.forward() == mask(3, 2));
    }
    const int threads = strata::num_threads();
    const auto before = mask(4, 9);
    strata::set_num_threads(1);
    const auto serial = mask(4, 9);
    strata::set_num_threads(threads);
    CHECK(before == serial);
    // In a Network, init hands each Dropout layer its own stream.
    using Seq = Sequential<Input<50>, Dropout<1, 2>, Dropout<1, 2>>;
    Network<Seq, float, P> net;
    net.init(nullptr, 0);
    CHECK(std::get<0>(net.layers()).stream() != std::get<1>(net.layers()).stream());
}

// ---- Residual blocks --------------------------------------------------------------------

namespace {

template <class Spec, class In>
constexpr std::int64_t params_of() {
    if constexpr (std::is_void_v<Spec>) return 0;
    else return Spec::template bind<In, double, Host>::num_params;
}
template <class Shortcut>
struct shortcut_conv {
    using type = typename Shortcut::conv;
};
template <>
struct shortcut_conv<IdentityShortcut> {
    using type = void;
};

std::vector<double> part(const std::vector<double>& v, std::int64_t first, std::int64_t count) {
    return std::vector<double>(v.begin() + first, v.begin() + first + count);
}

/// A residual block whose branch is S1 then S2, on place P in precision T, against its parts run
/// one by one in float64 on the host (LayerRun each): y = act(S2(S1(x)) + shortcut(x)), and the
/// backward pass through both paths (dx = dx_branch + dx_shortcut).
template <class Block, class In, class S1, class S2, class T, class P>
void check_residual_against_parts(std::int64_t n, std::uint64_t seed) {
    using Proj = typename shortcut_conv<typename Block::shortcut>::type;
    using BL = typename Block::template bind<In, T, P>;
    using L1 = typename S1::template bind<In, double, Host>;
    using Mid = typename L1::output_shape;
    using Out = typename BL::output_shape;
    constexpr bool post_relu = std::is_same_v<typename Block::activation_after_add, ReLU>;
    static_assert(post_relu || std::is_same_v<typename Block::activation_after_add, Linear>);
    constexpr std::int64_t np = params_of<Proj, In>(), n1 = params_of<S1, In>(), n2 = params_of<S2, Mid>();
    static_assert(BL::num_params == np + n1 + n2);
    const auto params = reference_values(BL::num_params, seed, -0.5, 0.5);
    const auto x = reference_values(n * In::size, seed + 1);
    const auto w = reference_values(n * Out::size, seed + 2);
    LayerRun<S1, In> r1(n, part(params, np, n1), x);
    LayerRun<S2, Mid> r2(n, part(params, np + n1, n2), r1.forward());
    std::vector<double> z = r2.forward(), shortcut = x;
    if constexpr (!std::is_void_v<Proj>) {
        LayerRun<Proj, In> rp(n, part(params, 0, np), x);
        shortcut = rp.forward();
    }
    REQUIRE(z.size() == shortcut.size());
    double closest = 1e300;
    for (std::size_t i = 0; i < z.size(); ++i) {
        z[i] += shortcut[i];
        closest = std::min(closest, std::abs(z[i]));
    }
    if (post_relu) REQUIRE(closest > 1e-4);  // float and float64 agree on which side of the kink every sum is
    std::vector<double> y = z, g = w;
    for (std::size_t i = 0; i < z.size(); ++i) {
        if (post_relu) y[i] = relu(z[i]);
        if (post_relu && z[i] <= 0) g[i] = 0;
    }
    const auto b2 = r2.run(&g);
    const auto b1 = r1.run(&b2.dx);
    std::vector<double> dx = b1.dx, dparams;
    if constexpr (!std::is_void_v<Proj>) {
        LayerRun<Proj, In> rp(n, part(params, 0, np), x);
        const auto bp = rp.run(&g);
        for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += bp.dx[i];
        dparams = bp.dparams;
    } else {
        for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += g[i];
    }
    dparams.insert(dparams.end(), b1.dparams.begin(), b1.dparams.end());
    dparams.insert(dparams.end(), b2.dparams.begin(), b2.dparams.end());

    LayerRun<Block, In, T, P> block(n, params, x);
    const auto r = block.run(&w);
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    CHECK(relative_error(r.y, y) <= tol);
    CHECK(relative_error(r.dx, dx) <= tol);
    CHECK(relative_error(r.dparams, dparams) <= tol);
    // Again on the same layer object (its buffers reused), with a smaller batch then the same one.
    if (n > 1) {
        block.n = n - 1;
        block.x = part(x, 0, (n - 1) * In::size);
        const auto w1 = part(w, 0, (n - 1) * Out::size);
        const auto rf = block.run(&w1);
        CHECK(relative_error(rf.y, part(y, 0, (n - 1) * Out::size)) <= tol);
        block.n = n;
        block.x = x;
        const auto again = block.run(&w);
        CHECK(again.y == r.y);
        CHECK(again.dx == r.dx);
        CHECK(again.dparams == r.dparams);
    }
}

using IdentityBlock = Residual<Conv2D<4, 3, Tanh, 1, Padding::Same>, Conv2D<4, 3, Linear, 1, Padding::Same>, ReLU>;
using ProjectionBlock = Residual<Projection<6, 2>, Conv2D<6, 3, Tanh, 2, Padding::Same>, Conv2D<6, 3, Linear, 1, Padding::Same>, ReLU>;

// Residual blocks' shapes and sizes.
static_assert(std::is_same_v<IdentityBlock::bind<StaticShape<6, 5, 4>, float, Host>::output_shape, StaticShape<6, 5, 4>>);
static_assert(std::is_same_v<ProjectionBlock::bind<StaticShape<7, 5, 3>, float, Host>::output_shape, StaticShape<4, 3, 6>>);
static_assert(ProjectionBlock::bind<StaticShape<7, 5, 3>, float, Host>::num_params == 3 * 6 + (9 * 3 * 6 + 6) + (9 * 6 * 6 + 6));
static_assert(Residual<Projection<6, 2, true>, Conv2D<6, 3, Tanh, 2, Padding::Same>>::bind<StaticShape<7, 5, 3>, float, Host>::num_params ==
              (3 * 6 + 6) + (9 * 3 * 6 + 6));
static_assert(std::is_same_v<IdentityBlock::shortcut, IdentityShortcut>);
static_assert(std::is_same_v<IdentityBlock::branch, ResidualBranch<Conv2D<4, 3, Tanh, 1, Padding::Same>, Conv2D<4, 3, Linear, 1, Padding::Same>>>);
static_assert(std::is_same_v<Residual<Dense<4>>::activation_after_add, Linear>);
static_assert(Layer<IdentityBlock::bind<StaticShape<6, 5, 4>, float, Host>, float, Host>);
// Only a block with a random layer inside has set_stream (what a Model takes for "draws random
// numbers": no CUDA graph for its steps).
template <class L>
constexpr bool has_set_stream = requires(L& l) { l.set_stream(std::uint64_t(0)); };
static_assert(!has_set_stream<IdentityBlock::bind<StaticShape<6, 5, 4>, float, Host>>);
static_assert(has_set_stream<Residual<Dense<5, Tanh>, Dropout<30>>::bind<StaticShape<5>, float, Host>>);
static_assert(has_set_stream<Residual<Residual<Dropout<30>>, Dense<5>>::bind<StaticShape<5>, float, Host>>);
static_assert(!has_set_stream<Residual<Residual<Dense<5>>, Dense<5>>::bind<StaticShape<5>, float, Host>>);
static_assert(LayerSpec<ProjectionBlock>);

}  // namespace

TEST_CASE("Residual gradients match finite differences") {
    SUBCASE("identity shortcut, Conv2D branch, ReLU after the add") {
        using B = Residual<Conv2D<3, 3, Tanh, 1, Padding::Same>, Conv2D<3, 3, Linear, 1, Padding::Same>, ReLU>;
        using BLinear = Residual<Conv2D<3, 3, Tanh, 1, Padding::Same>, Conv2D<3, 3, Linear, 1, Padding::Same>>;
        check_relu_layer<B, BLinear, StaticShape<5, 4, 3>>(2, 201);
    }
    SUBCASE("identity shortcut, Dense branch, ReLU after the add") {
        check_relu_layer<Residual<Dense<6, Tanh>, Dense<5>, ReLU>, Residual<Dense<6, Tanh>, Dense<5>>, StaticShape<5>>(3, 202);
    }
    SUBCASE("projection shortcut, stride 2, ReLU after the add") {
        using B = Residual<Projection<4, 2>, Conv2D<4, 3, Tanh, 2, Padding::Same>, Conv2D<4, 3, Linear, 1, Padding::Same>, ReLU>;
        using BLinear = Residual<Projection<4, 2>, Conv2D<4, 3, Tanh, 2, Padding::Same>, Conv2D<4, 3, Linear, 1, Padding::Same>>;
        check_relu_layer<B, BLinear, StaticShape<5, 6, 3>>(2, 203);
    }
    SUBCASE("projection shortcut with a bias, stride 1") {
        check_layer<Residual<Projection<5, 1, true>, Conv2D<5, 3, Tanh, 1, Padding::Same>>, StaticShape<4, 4, 2>>(2, 204);
    }
    SUBCASE("projection shortcut, average pooling in the branch, Tanh after the add") {
        check_layer<Residual<Projection<3, 2>, AveragePooling2D<2, 2, Padding::Same>, Conv2D<3, 1, Tanh>, Tanh>,
                    StaticShape<5, 5, 2>>(2, 205);
    }
    SUBCASE("Dropout in the branch, in training") {
        check_layer<Residual<Dense<5, Tanh>, Dropout<30>>, StaticShape<5>>(4, 206, Mode{.training = true, .step = 2, .seed = 9});
    }
    SUBCASE("a residual block inside a residual block") {
        check_layer<Residual<Residual<Dense<5, Tanh>>, Dense<5, Sigmoid>, Tanh>, StaticShape<5>>(3, 207);
    }
    SUBCASE("a layer that aliases its input (Flatten) in the branch") {
        check_layer<Residual<Flatten, Dense<4, Tanh>>, StaticShape<4>>(3, 208);
    }
}

TEST_CASE("residual blocks in a Network have the finite-difference parameter gradients (a block first: no input gradient)") {
    using Seq = Sequential<Input<6, 6, 2>, Residual<Projection<4, 1>, Conv2D<4, 3, Tanh, 1, Padding::Same>>,
                           Residual<Conv2D<4, 3, Tanh, 1, Padding::Same>, Dropout<25>, Conv2D<4, 3, Linear, 1, Padding::Same>, Tanh>,
                           AveragePooling2D<2>, GlobalAveragePooling2D, Dense<3, Softmax>>;
    check_network<Seq>(2, 211, Mode{.training = true, .step = 3, .seed = 7});
    check_network<Seq>(3, 212, Mode{});
}

TEST_CASE_TEMPLATE("Residual matches its layers run one by one", P, STRATA_TEST_PLACES) {
    using C4a = Conv2D<4, 3, Tanh, 1, Padding::Same>;
    using C4b = Conv2D<4, 3, Linear, 1, Padding::Same>;
    check_residual_against_parts<IdentityBlock, StaticShape<6, 5, 4>, C4a, C4b, double, P>(3, 221);
    check_residual_against_parts<IdentityBlock, StaticShape<6, 5, 4>, C4a, C4b, float, P>(3, 221);
    check_residual_against_parts<Residual<C4a, C4b>, StaticShape<6, 5, 4>, C4a, C4b, double, P>(2, 222);
    using C6a = Conv2D<6, 3, Tanh, 2, Padding::Same>;
    using C6b = Conv2D<6, 3, Linear, 1, Padding::Same>;
    check_residual_against_parts<ProjectionBlock, StaticShape<7, 5, 3>, C6a, C6b, double, P>(3, 223);
    check_residual_against_parts<ProjectionBlock, StaticShape<7, 5, 3>, C6a, C6b, float, P>(3, 223);
    check_residual_against_parts<Residual<Projection<6, 2, true>, C6a, C6b>, StaticShape<7, 5, 3>, C6a, C6b, float, P>(2, 224);
    using D1 = Dense<7, Tanh>;
    using D2 = Dense<5>;
    check_residual_against_parts<Residual<D1, D2, ReLU>, StaticShape<5>, D1, D2, float, P>(4, 225);
}

TEST_CASE("Residual: names, summary, and the inner layers' parameters in the flat buffer") {
    using Seq = Sequential<Input<8, 8, 2>, Conv2D<4, 3, ReLU, 1, Padding::Same>, IdentityBlock,
                           Residual<Projection<8, 2>, Conv2D<8, 3, ReLU, 2, Padding::Same>, Conv2D<8, 3, Linear, 1, Padding::Same>, ReLU>,
                           GlobalAveragePooling2D, Dense<10, Softmax>>;
    constexpr std::int64_t identity = 2 * (9 * 4 * 4 + 4), projection = 4 * 8 + (9 * 4 * 8 + 8) + (9 * 8 * 8 + 8);
    static_assert(Seq::num_params == (9 * 2 * 4 + 4) + identity + projection + (8 * 10 + 10));
    const auto params = Seq::parameters();
    std::vector<std::string> names;
    for (const auto& p : params) names.push_back(p.name);
    const std::vector<std::string> expected{"conv2d/kernel",
                                            "conv2d/bias",
                                            "residual/conv2d/kernel",
                                            "residual/conv2d/bias",
                                            "residual/conv2d_1/kernel",
                                            "residual/conv2d_1/bias",
                                            "residual_1/projection/kernel",
                                            "residual_1/conv2d/kernel",
                                            "residual_1/conv2d/bias",
                                            "residual_1/conv2d_1/kernel",
                                            "residual_1/conv2d_1/bias",
                                            "dense/kernel",
                                            "dense/bias"};
    CHECK(names == expected);
    // Each parameter at its offset, one after the other, with the inner layer's shape.
    std::int64_t at = 0;
    for (const auto& p : params) {
        INFO(p.name);
        CHECK(p.offset == at);
        at += p.shape.size();
    }
    CHECK(at == Seq::num_params);
    CHECK(params[6].shape == Shape{1, 1, 4, 8});
    CHECK(params[9].shape == Shape{3, 3, 8, 8});
    const std::string s = Seq::summary();
    INFO(s);
    CHECK(strata_test::has(s, "residual (Residual)"));
    CHECK(strata_test::has(s, "residual_1 (Residual)"));
    CHECK(strata_test::has(s, "(None, 4, 4, 8)"));
    CHECK(strata_test::has(s, std::to_string(identity)));
    CHECK(strata_test::has(s, std::to_string(projection)));
    CHECK(strata_test::has(s, "global_average_pooling2d (GlobalAveragePooling2D)"));
}

TEST_CASE("Residual: every inner layer gets its own random stream") {
    // The hash: odd (never a Network layer's stream, layer index x 16, also in the 23 low bits
    // Dropout keeps), and distinct over many blocks and inner layers; in Dropout's 23 bits too
    // for a model of 32 blocks of 4 layers (a hash: any two collide there with probability 2^-22).
    std::vector<std::uint64_t> seen, low;
    for (std::uint64_t layer = 0; layer < 256; ++layer)
        for (std::size_t k = 0; k < 8; ++k) {
            const std::uint64_t s = inner_stream(layer * 16, k);
            CHECK(s % 16 != 0);
            seen.push_back(s);
            if (layer < 32 && k < 4) low.push_back(s & ((std::uint64_t(1) << 23) - 1));
        }
    for (auto* v : {&seen, &low}) {
        std::sort(v->begin(), v->end());
        CHECK(std::adjacent_find(v->begin(), v->end()) == v->end());
    }
    // Two identical blocks in a row, after a layer identical to their inner ones: three
    // different kernels.
    using C = Conv2D<3, 3, Linear, 1, Padding::Same>;
    using Seq = Sequential<Input<4, 4, 3>, C, Residual<C>, Residual<C>>;
    Network<Seq, double, Host> net;
    std::vector<double> params(std::size_t(Seq::num_params));
    net.init(params.data(), 5);
    constexpr std::int64_t kernel = 3 * 3 * 3 * 3;
    const auto k0 = part(params, Seq::offsets[0], kernel), k1 = part(params, Seq::offsets[1], kernel),
               k2 = part(params, Seq::offsets[2], kernel);
    CHECK(k0 != k1);
    CHECK(k1 != k2);
    CHECK(k0 != k2);
    const double limit = std::sqrt(6.0 / (27.0 + 27.0));  // Glorot, as the layer alone
    CHECK(std::all_of(k1.begin(), k1.end(), [&](double v) { return std::abs(v) <= limit && v != 0; }));
    // The same seed gives the same parameters.
    std::vector<double> again(params.size());
    Network<Seq, double, Host>().init(again.data(), 5);
    CHECK(again == params);
    // Dropout inside blocks: its stream comes from the block's, and differs from every other.
    using D = Dropout<1, 2>;
    using DSeq = Sequential<Input<50>, Residual<D>, Residual<D>, D>;
    Network<DSeq, float, Host> dnet;
    const auto& inner0 = std::get<0>(std::get<0>(dnet.layers()).layers());
    const auto& inner1 = std::get<0>(std::get<1>(dnet.layers()).layers());
    CHECK(inner0.stream() == inner_stream(0, 0));
    CHECK(inner1.stream() == inner_stream(16, 0));
    CHECK(std::get<2>(dnet.layers()).stream() == 32);
    CHECK(inner0.stream() != inner1.stream());
    dnet.init(nullptr, 3);
    CHECK(inner0.stream() == inner_stream(0, 0));
    // Their masks differ: the same input through both blocks, in training.
    LayerRun<Residual<D>, StaticShape<50>, float, Host> a(4, {}, std::vector<double>(200, 1.0), Mode{.training = true, .step = 1, .seed = 3});
    LayerRun<Residual<D>, StaticShape<50>, float, Host> b(4, {}, std::vector<double>(200, 1.0), Mode{.training = true, .step = 1, .seed = 3});
    a.layer.set_stream(0);
    b.layer.set_stream(16);
    CHECK(a.forward() != b.forward());
}
