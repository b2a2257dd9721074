// The Vision Transformer's layers (issue 43): PatchEmbedding, PositionEmbedding and
// GlobalAveragePooling1D, each against a float64 reference written plainly here and its backward
// against central finite differences (f = sum(w ⊙ y), h = 1e-6, the error measured against the
// gradient's own scale, as tests/test_transformer.cpp does), their Keras names and summary rows,
// and a small ViT in a Network with the finite-difference gradients of every variable. Negative
// controls: the patches taken in column-major order, and an encoder without the position
// embedding (which cannot tell the tokens' order apart) against one with it.
//
// The cases templated on the place also run on Cuda when this file is compiled by nvcc
// (test_vit.cu); the host is the oracle. Training through Model is host-only.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/nn/layers.hpp>

#include "test_places.hpp"

#if !defined(__CUDACC__)
#include <strata/strata.hpp>
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

double max_abs(const std::vector<double>& a) {
    double m = 0;
    for (double v : a) m = std::max(m, std::abs(v));
    return m;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

// max_i |a_i − b_i| / max_i |b_i| (0 when both are all zeros).
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
    const double scale = max_abs(b);
    return scale == 0 ? max_abs_diff(a, b) : max_abs_diff(a, b) / scale;
}

/// One bound layer with its parameters and input as host float64 vectors, run on place P in
/// precision T.
template <class Spec, class In, class T = double, class P = Host>
struct LayerRun {
    using Layer = typename Spec::template bind<In, T, P>;
    using Out = typename Layer::output_shape;
    Layer layer{};
    std::int64_t n;
    std::vector<double> params, x;

    LayerRun(std::int64_t batch, std::vector<double> p, std::vector<double> in) : n(batch), params(std::move(p)), x(std::move(in)) {
        REQUIRE(std::int64_t(params.size()) == Layer::num_params);
        REQUIRE(std::int64_t(x.size()) == n * In::size);
    }
    std::int64_t out_size() const { return n * Out::size; }

    struct Result {
        std::vector<double> y, dx, dparams;
    };
    /// Forward, then (when w is given) backward with dy = w.
    Result run(const std::vector<double>* w = nullptr) {
        Tensor<T, P> p(Shape{std::max<std::int64_t>(Layer::num_params, 1)});
        if (Layer::num_params > 0) p = on_place<T, P>(params, Shape{Layer::num_params});
        auto xt = on_place<T, P>(x, In::batched(n));
        Tensor<T, P> y(Out::batched(n));
        layer.forward(p.data(), xt.view(), y.view(), Mode{.training = true});
        Result r;
        r.y = as_double(y.view());
        if (!w) return r;
        auto dy = on_place<T, P>(*w, Out::batched(n));
        Tensor<T, P> dx(In::batched(n)), g(Shape{std::max<std::int64_t>(Layer::num_params, 1)});
        strata::fill(g.view(), T(12345));  // backward must overwrite every slot
        strata::fill(dx.view(), T(12345));
        layer.backward(p.data(), g.data(), xt.view(), y.view(), dy.view(), dx.view(), Mode{.training = true});
        r.dx = as_double(dx.view());
        r.dparams = as_double(g.view());
        r.dparams.resize(std::size_t(Layer::num_params));
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

/// The input gradient and each variable's gradient against finite differences (each variable
/// on its own scale); none may be identically zero (that would pass a relative test trivially).
template <class Run>
void check_gradients(Run& run, std::uint64_t seed) {
    const auto w = reference_values(run.out_size(), seed + 7, -1, 1);
    const auto g = run.run(&w);
    const auto fd_x = finite_differences(run, run.x, w);
    INFO("input gradient relative error " << relative_error(g.dx, fd_x));
    CHECK(relative_error(g.dx, fd_x) <= 1e-6);
    CHECK(max_abs(g.dx) > 0);
    if (run.params.empty()) return;
    const auto fd_p = finite_differences(run, run.params, w);
    for (const auto& p : Run::Layer::param_info()) {
        const auto first = std::ptrdiff_t(p.offset), count = std::ptrdiff_t(p.shape.size());
        std::vector<double> a(g.dparams.begin() + first, g.dparams.begin() + first + count), b(fd_p.begin() + first, fd_p.begin() + first + count);
        INFO(p.name << ": relative error " << relative_error(a, b));
        CHECK(relative_error(a, b) <= 1e-6);
        CHECK(max_abs(a) > 0);
    }
}

// ---- references -------------------------------------------------------------------------------

/// Patch embedding of NHWC images [n, H, W, C] with kernel [P, P, C, D] and bias [D]: token
/// t = i·(W/P) + j is patch (i, j). `column_major` numbers the tokens j·(H/P) + i instead (the
/// negative control).
std::vector<double> patch_embedding_ref(const std::vector<double>& x, const std::vector<double>& p, std::int64_t n, std::int64_t H,
                                        std::int64_t W, std::int64_t C, std::int64_t P, std::int64_t D, bool column_major = false) {
    const std::int64_t gh = H / P, gw = W / P, tokens = gh * gw;
    const double* kernel = p.data();
    const double* bias = p.size() > std::size_t(P * P * C * D) ? p.data() + P * P * C * D : nullptr;
    std::vector<double> y(std::size_t(n * tokens * D));
    for (std::int64_t e = 0; e < n; ++e)
        for (std::int64_t i = 0; i < gh; ++i)
            for (std::int64_t j = 0; j < gw; ++j) {
                const std::int64_t t = column_major ? j * gh + i : i * gw + j;
                for (std::int64_t d = 0; d < D; ++d) {
                    long double s = bias ? bias[d] : 0.0;
                    for (std::int64_t ky = 0; ky < P; ++ky)
                        for (std::int64_t kx = 0; kx < P; ++kx)
                            for (std::int64_t c = 0; c < C; ++c)
                                s += (long double)x[std::size_t(((e * H + i * P + ky) * W + j * P + kx) * C + c)] *
                                     kernel[((ky * P + kx) * C + c) * D + d];
                    y[std::size_t((e * tokens + t) * D + d)] = double(s);
                }
            }
    return y;
}

/// The mean over the tokens of [n, S, D].
std::vector<double> mean_over_tokens_ref(const std::vector<double>& x, std::int64_t n, std::int64_t S, std::int64_t D) {
    std::vector<double> y(std::size_t(n * D));
    for (std::int64_t e = 0; e < n; ++e)
        for (std::int64_t d = 0; d < D; ++d) {
            long double s = 0;
            for (std::int64_t t = 0; t < S; ++t) s += x[std::size_t((e * S + t) * D + d)];
            y[std::size_t(e * D + d)] = double(s / S);
        }
    return y;
}

}  // namespace

// ---- PatchEmbedding ---------------------------------------------------------------------------

TEST_CASE_TEMPLATE("PatchEmbedding matches a float64 reference: row-major tokens of non-overlapping patches", P, STRATA_TEST_PLACES) {
    SUBCASE("8x12 image of 2 channels, patch 4: 2x3 = 6 tokens of 5") {
        using Spec = PatchEmbedding<4, 5>;
        using L = Spec::bind<StaticShape<8, 12, 2>, double, P>;
        static_assert(std::is_same_v<typename L::output_shape, StaticShape<6, 5>>);
        LayerRun<Spec, StaticShape<8, 12, 2>, double, P> run(3, reference_values(L::num_params, 1, -0.5, 0.5), reference_values(3 * 192, 2, -2, 2));
        const auto y = run.forward();
        CHECK(max_abs_diff(y, patch_embedding_ref(run.x, run.params, 3, 8, 12, 2, 4, 5)) <= 1e-13);
        // Negative control: the same patches numbered column-major are another output.
        CHECK(max_abs_diff(y, patch_embedding_ref(run.x, run.params, 3, 8, 12, 2, 4, 5, true)) > 0.1);
    }
    SUBCASE("28x28x1, patch 7, no bias: 16 tokens of 3") {
        using Spec = PatchEmbedding<7, 3, false>;
        using L = Spec::bind<StaticShape<28, 28, 1>, double, P>;
        static_assert(L::num_params == 7 * 7 * 3 && L::tokens == 16);
        LayerRun<Spec, StaticShape<28, 28, 1>, double, P> run(2, reference_values(L::num_params, 3, -0.5, 0.5), reference_values(2 * 784, 4, 0, 1));
        CHECK(max_abs_diff(run.forward(), patch_embedding_ref(run.x, run.params, 2, 28, 28, 1, 7, 3)) <= 1e-13);
    }
    SUBCASE("patch 1 (every pixel a token), float") {
        using Spec = PatchEmbedding<1, 4>;
        using L = Spec::bind<StaticShape<3, 2, 3>, float, P>;
        static_assert(std::is_same_v<typename L::output_shape, StaticShape<6, 4>>);
        LayerRun<Spec, StaticShape<3, 2, 3>, float, P> run(2, reference_values(L::num_params, 5, -0.5, 0.5), reference_values(2 * 18, 6, -2, 2));
        std::vector<double> pf(run.params.begin(), run.params.end()), xf(run.x.begin(), run.x.end());
        for (auto& v : pf) v = double(float(v));
        for (auto& v : xf) v = double(float(v));
        CHECK(max_abs_diff(run.forward(), patch_embedding_ref(xf, pf, 2, 3, 2, 3, 1, 4)) <= 1e-6);
    }
}

TEST_CASE_TEMPLATE("PatchEmbedding gradients on every place match the host's, and the host's Conv2D<D, P, Linear, P>", P, STRATA_TEST_PLACES) {
    using In = StaticShape<8, 8, 3>;
    using Spec = PatchEmbedding<2, 6>;
    using L = Spec::bind<In, double, Host>;
    const auto p = reference_values(L::num_params, 11, -0.5, 0.5);
    const auto x = reference_values(4 * 192, 12, -2, 2);
    const auto w = reference_values(4 * 16 * 6, 13);
    LayerRun<Spec, In, double, Host> host(4, p, x);
    LayerRun<Conv2D<6, 2, Linear, 2>, In, double, Host> conv(4, p, x);
    LayerRun<Spec, In, double, P> here(4, p, x);
    LayerRun<Spec, In, float, P> here_f(4, p, x);
    const auto a = host.run(&w);
    const auto c = conv.run(&w);
    const auto b = here.run(&w);
    const auto f = here_f.run(&w);
    CHECK(a.y == c.y);  // the same convolution, bit for bit
    CHECK(a.dx == c.dx);
    CHECK(a.dparams == c.dparams);
    CHECK(relative_error(b.y, a.y) <= 1e-14);
    CHECK(relative_error(b.dx, a.dx) <= 1e-13);
    CHECK(relative_error(b.dparams, a.dparams) <= 1e-13);
    CHECK(relative_error(f.y, a.y) <= 1e-6);
    CHECK(relative_error(f.dx, a.dx) <= 1e-5);
    CHECK(relative_error(f.dparams, a.dparams) <= 1e-5);
}

TEST_CASE("PatchEmbedding gradients match finite differences: input, kernel and bias") {
    {
        using Spec = PatchEmbedding<3, 4>;
        using L = Spec::bind<StaticShape<6, 9, 2>, double, Host>;
        LayerRun<Spec, StaticShape<6, 9, 2>> run(2, reference_values(L::num_params, 21, -0.5, 0.5), reference_values(2 * 108, 22, -2, 2));
        check_gradients(run, 21);
    }
    {
        using Spec = PatchEmbedding<2, 3, false>;
        using L = Spec::bind<StaticShape<4, 4, 1>, double, Host>;
        LayerRun<Spec, StaticShape<4, 4, 1>> run(3, reference_values(L::num_params, 23, -0.5, 0.5), reference_values(3 * 16, 24, -2, 2));
        check_gradients(run, 23);
    }
}

TEST_CASE("PatchEmbedding: Keras' variables (the convolution's, under patch_embedding), initial values, summary") {
    using L = PatchEmbedding<4, 64>::bind<StaticShape<28, 28, 1>, float, Host>;
    const auto info = L::param_info();
    REQUIRE(info.size() == 2);
    CHECK(info[0].name == "kernel");
    CHECK(info[0].shape == Shape{4, 4, 1, 64});
    CHECK(info[1].name == "bias");
    CHECK(info[1].shape == Shape{64});
    CHECK(info[1].offset == 16 * 64);
    CHECK(L::num_params == 16 * 64 + 64);
    std::vector<float> p(std::size_t(L::num_params), 9.0f);
    L().init(p.data(), 3, 0);
    const double limit = std::sqrt(6.0 / (16 * 1 + 16 * 64));  // Conv2D's fans: kh·kw·cin, kh·kw·filters
    double largest = 0;
    for (std::size_t i = 0; i < 16 * 64; ++i) largest = std::max(largest, double(std::abs(p[i])));
    CHECK(largest <= limit);
    CHECK(largest > 0.9 * limit);
    for (std::size_t i = 16 * 64; i < p.size(); ++i) CHECK(p[i] == 0.0f);
    using Seq = Sequential<Input<28, 28, 1>, PatchEmbedding<4, 64>, PositionEmbedding<>, GlobalAveragePooling1D, Dense<10, Softmax>>;
    static_assert(Seq::num_params == (16 * 64 + 64) + 49 * 64 + (64 * 10 + 10));
    const auto names = Seq::parameters();
    CHECK(names[0].name == "patch_embedding/kernel");
    CHECK(names[1].name == "patch_embedding/bias");
    CHECK(names[2].name == "position_embedding/embeddings");
    CHECK(names[2].shape == Shape{49, 64});
    const auto summary = Seq::summary();
    INFO(summary);
    CHECK(strata_test::has(summary, "patch_embedding (PatchEmbedding)"));
    CHECK(strata_test::has(summary, "position_embedding (PositionEmbedding)"));
    CHECK(strata_test::has(summary, "global_average_pooling1d (GlobalAveragePooling1D)"));
    CHECK(strata_test::has(summary, "(None, 49, 64)"));
}

// ---- PositionEmbedding ------------------------------------------------------------------------

TEST_CASE_TEMPLATE("PositionEmbedding adds its [tokens, features] variable to every example; a longer variable uses its first rows", P,
                   STRATA_TEST_PLACES) {
    SUBCASE("exactly the tokens") {
        LayerRun<PositionEmbedding<>, StaticShape<5, 3>, double, P> run(3, reference_values(15, 31), reference_values(45, 32, -2, 2));
        const auto w = reference_values(45, 33);
        const auto r = run.run(&w);
        for (std::size_t i = 0; i < r.y.size(); ++i) CHECK(r.y[i] == run.x[i] + run.params[i % 15]);
        CHECK(r.dx == w);
        for (std::size_t i = 0; i < 15; ++i) CHECK(std::abs(r.dparams[i] - (w[i] + w[15 + i] + w[30 + i])) <= 1e-15);
    }
    SUBCASE("SequenceLength 7 over 4 tokens, float: rows 4..6 unused, their gradient 0") {
        LayerRun<PositionEmbedding<7>, StaticShape<4, 2>, float, P> run(2, reference_values(14, 34), reference_values(16, 35, -2, 2));
        const auto w = reference_values(16, 36);
        const auto r = run.run(&w);
        for (std::size_t i = 0; i < r.y.size(); ++i) CHECK(r.y[i] == double(float(run.x[i]) + float(run.params[i % 8])));
        for (std::size_t i = 8; i < 14; ++i) CHECK(r.dparams[i] == 0.0);
        for (std::size_t i = 0; i < 8; ++i) CHECK(std::abs(r.dparams[i] - (w[i] + w[8 + i])) <= 1e-6);
    }
}

TEST_CASE("PositionEmbedding gradients match finite differences; its variable, initial values and errors") {
    {
        LayerRun<PositionEmbedding<>, StaticShape<4, 3>> run(3, reference_values(12, 41), reference_values(36, 42, -2, 2));
        check_gradients(run, 41);
    }
    {
        // The unused rows: their gradient and its finite differences are both 0.
        LayerRun<PositionEmbedding<6>, StaticShape<4, 3>> run(2, reference_values(18, 43), reference_values(24, 44, -2, 2));
        const auto w = reference_values(24, 45);
        const auto g = run.run(&w);
        const auto fd = finite_differences(run, run.params, w);
        CHECK(relative_error(g.dparams, fd) <= 1e-6);
        for (std::size_t i = 12; i < 18; ++i) {
            CHECK(g.dparams[i] == 0.0);
            CHECK(fd[i] == 0.0);
        }
    }
    using L = PositionEmbedding<>::bind<StaticShape<49, 64>, float, Host>;
    const auto info = L::param_info();
    REQUIRE(info.size() == 1);
    CHECK(info[0].name == "embeddings");
    CHECK(info[0].shape == Shape{49, 64});
    CHECK(PositionEmbedding<64>::bind<StaticShape<49, 64>, float, Host>::param_info()[0].shape == Shape{64, 64});
    std::vector<float> p(std::size_t(L::num_params), 9.0f);
    L().init(p.data(), 5, 32);
    const double limit = std::sqrt(6.0 / (49 + 64));  // Keras-NLP's glorot_uniform on [49, 64]
    double largest = 0;
    for (float v : p) largest = std::max(largest, double(std::abs(v)));
    CHECK(largest <= limit);
    CHECK(largest > 0.9 * limit);
}

// ---- GlobalAveragePooling1D -------------------------------------------------------------------

TEST_CASE_TEMPLATE("GlobalAveragePooling1D is the mean over the tokens, on every place", P, STRATA_TEST_PLACES) {
    using In = StaticShape<7, 5>;
    static_assert(std::is_same_v<typename GlobalAveragePooling1D::bind<In, double, P>::output_shape, StaticShape<5>>);
    const auto x = reference_values(3 * 35, 51, -2, 2);
    const auto w = reference_values(3 * 5, 52);
    LayerRun<GlobalAveragePooling1D, In, double, P> d(3, {}, x);
    LayerRun<GlobalAveragePooling1D, In, float, P> f(3, {}, x);
    const auto rd = d.run(&w);
    const auto rf = f.run(&w);
    const auto want = mean_over_tokens_ref(x, 3, 7, 5);
    CHECK(max_abs_diff(rd.y, want) <= 1e-15);
    // Negative control: the mean over the features (the other axis) is another thing.
    std::vector<double> wrong(15);
    for (std::int64_t e = 0; e < 3; ++e)
        for (std::int64_t t = 0; t < 5; ++t) {
            double s = 0;
            for (std::int64_t c = 0; c < 5; ++c) s += x[std::size_t(e * 35 + t * 5 + c)];
            wrong[std::size_t(e * 5 + t)] = s / 5;
        }
    CHECK(max_abs_diff(rd.y, wrong) > 0.1);
    for (std::int64_t i = 0; i < 3 * 35; ++i) CHECK(rd.dx[std::size_t(i)] == w[std::size_t(i / 35 * 5 + i % 5)] / 7);
    CHECK(max_abs_diff(rf.y, want) <= 1e-6);
    CHECK(max_abs_diff(rf.dx, rd.dx) <= 1e-7);
}

TEST_CASE("GlobalAveragePooling1D gradients match finite differences") {
    LayerRun<GlobalAveragePooling1D, StaticShape<6, 4>> run(3, {}, reference_values(72, 61, -2, 2));
    check_gradients(run, 61);
}

// ---- ClassToken and FirstToken -----------------------------------------------------------------

TEST_CASE_TEMPLATE("ClassToken prepends its variable to every example, FirstToken takes token 0; on every place", P, STRATA_TEST_PLACES) {
    using In = StaticShape<4, 3>;
    static_assert(std::is_same_v<typename ClassToken::bind<In, double, P>::output_shape, StaticShape<5, 3>>);
    static_assert(std::is_same_v<typename FirstToken::bind<StaticShape<5, 3>, double, P>::output_shape, StaticShape<3>>);
    const auto token = reference_values(3, 81);
    const auto x = reference_values(2 * 12, 82, -2, 2);
    const auto w = reference_values(2 * 15, 83);
    LayerRun<ClassToken, In, double, P> run(2, token, x);
    const auto r = run.run(&w);
    for (std::size_t e = 0; e < 2; ++e)
        for (std::size_t t = 0; t < 5; ++t)
            for (std::size_t d = 0; d < 3; ++d) {
                CHECK(r.y[(e * 5 + t) * 3 + d] == (t == 0 ? token[d] : x[(e * 4 + t - 1) * 3 + d]));
                if (t > 0) CHECK(r.dx[(e * 4 + t - 1) * 3 + d] == w[(e * 5 + t) * 3 + d]);
            }
    for (std::size_t d = 0; d < 3; ++d) CHECK(std::abs(r.dparams[d] - (w[d] + w[15 + d])) <= 1e-15);
    LayerRun<FirstToken, StaticShape<5, 3>, double, P> first(2, {}, r.y);
    const auto w2 = reference_values(6, 84);
    const auto f = first.run(&w2);
    for (std::size_t e = 0; e < 2; ++e)
        for (std::size_t d = 0; d < 3; ++d) {
            CHECK(f.y[e * 3 + d] == token[d]);
            for (std::size_t t = 0; t < 5; ++t) CHECK(f.dx[(e * 5 + t) * 3 + d] == (t == 0 ? w2[e * 3 + d] : 0.0));
        }
}

TEST_CASE("ClassToken and FirstToken gradients match finite differences; the class token's variable, zeros at first") {
    {
        LayerRun<ClassToken, StaticShape<3, 4>> run(3, reference_values(4, 91), reference_values(36, 92, -2, 2));
        check_gradients(run, 91);
    }
    {
        LayerRun<FirstToken, StaticShape<3, 4>> run(3, {}, reference_values(36, 93, -2, 2));
        check_gradients(run, 93);
    }
    using L = ClassToken::bind<StaticShape<49, 64>, float, Host>;
    const auto info = L::param_info();
    REQUIRE(info.size() == 1);
    CHECK(info[0].name == "class_token");
    CHECK(info[0].shape == Shape{1, 64});
    std::vector<float> p(64, 9.0f);
    L().init(p.data(), 1, 0);
    for (float v : p) CHECK(v == 0.0f);
    using Seq = Sequential<Input<28, 28, 1>, PatchEmbedding<4, 64>, ClassToken, PositionEmbedding<>, FirstToken, Dense<10, Softmax>>;
    const auto names = Seq::parameters();
    CHECK(names[2].name == "class_token/class_token");
    CHECK(names[3].shape == Shape{50, 64});  // the positions cover the class token too
    CHECK(strata_test::has(Seq::summary(), "class_token (ClassToken)"));
    CHECK(strata_test::has(Seq::summary(), "(None, 50, 64)"));
}

// ---- a small ViT in a Network -----------------------------------------------------------------

namespace {
template <std::int64_t Heads, std::int64_t KeyDim>
using AttentionHalf = Residual<LayerNormalization<>, MultiHeadAttention<Heads, KeyDim>>;
template <std::int64_t Features, std::int64_t Hidden>
using MlpHalf = Residual<LayerNormalization<>, TokenDense<Hidden, GELU>, TokenDense<Features>>;
// 8x8 images of 2 channels, patch 4 (4 tokens of 6), one encoder block, mean pooling, 3 classes.
using TinyVit = Sequential<Input<8, 8, 2>, PatchEmbedding<4, 6>, PositionEmbedding<>, AttentionHalf<2, 3>, MlpHalf<6, 8>,
                           LayerNormalization<>, GlobalAveragePooling1D, Dense<3>>;
// The same with a class token (5 tokens) and its output as the representation.
using TinyVitClassToken = Sequential<Input<8, 8, 2>, PatchEmbedding<4, 6>, ClassToken, PositionEmbedding<>, AttentionHalf<2, 3>,
                                     MlpHalf<6, 8>, LayerNormalization<>, FirstToken, Dense<3>>;
// The same without the position embedding (and without patches: 4 tokens given directly).
using Encoder = Sequential<Input<4, 6>, AttentionHalf<2, 3>, MlpHalf<6, 8>, LayerNormalization<>>;
using EncoderWithPositions = Sequential<Input<4, 6>, PositionEmbedding<>, AttentionHalf<2, 3>, MlpHalf<6, 8>, LayerNormalization<>>;

/// Forward of a Network on a batch of host values, as float64.
template <class Seq>
struct NetRun {
    Network<Seq, double, Host> net;
    std::vector<double> params;
    explicit NetRun(std::uint64_t seed) : params(std::size_t(Seq::num_params)) {
        net.init(params.data(), seed);
        const auto noise = reference_values(Seq::num_params, seed + 1, -0.2, 0.2);  // no variable at a special value
        for (std::size_t i = 0; i < params.size(); ++i) params[i] += noise[i];
    }
    Tensor<double, Host> xt;  // the network reads its input again in backward: kept alive here
    std::vector<double> forward(const std::vector<double>& x, std::int64_t n) {
        xt = on_place<double, Host>(x, Seq::input_shape::batched(n));
        return as_double(net.forward(params.data(), xt.view(), Mode{}));
    }
};
}  // namespace

TEST_CASE_TEMPLATE("a small ViT (patches, positions, a pre-norm block, mean pooling or a class token) in a Network: finite-difference gradients of every variable",
                   Seq, TinyVit, TinyVitClassToken) {
    constexpr bool cls = std::is_same_v<Seq, TinyVitClassToken>;
    static_assert(std::is_same_v<typename Seq::output_shape, StaticShape<3>>);
    NetRun<Seq> run(3);
    const std::int64_t n = 2;
    const auto x = reference_values(n * 128, 5, -1.5, 1.5);
    const auto w = reference_values(n * 3, 6);
    auto objective = [&] { return dot(w, run.forward(x, n)); };
    objective();
    std::copy(w.begin(), w.end(), run.net.output_grad().data());
    std::vector<double> grads(run.params.size());
    run.net.backward(run.params.data(), grads.data(), Mode{});
    std::vector<double> fd(run.params.size());
    for (std::size_t i = 0; i < run.params.size(); ++i) {
        const double old = run.params[i];
        run.params[i] = old + 1e-6;
        const double fp = objective();
        run.params[i] = old - 1e-6;
        const double fm = objective();
        run.params[i] = old;
        fd[i] = (fp - fm) / 2e-6;
    }
    int checked = 0;
    for (const auto& p : Seq::parameters()) {
        const auto first = std::ptrdiff_t(p.offset), count = std::ptrdiff_t(p.shape.size());
        std::vector<double> a(grads.begin() + first, grads.begin() + first + count), b(fd.begin() + first, fd.begin() + first + count);
        CAPTURE(p.name);
        if (strata_test::has(p.name, "key/bias")) {  // 0 in exact arithmetic: the softmax ignores q·b
            CHECK(max_abs(a) <= 1e-12);
            continue;
        }
        INFO(p.name << ": relative error " << relative_error(a, b));
        CHECK(relative_error(a, b) <= 1e-6);
        CHECK(max_abs(a) > 0);
        ++checked;
    }
    CHECK(checked == 2 + (cls ? 1 : 0) + 1 + (2 + 7) + (2 + 4) + 2 + 2);  // every variable but the key bias
}

TEST_CASE("the position embedding tells the tokens' order apart: an encoder without it is permutation-equivariant, with it not") {
    // Swapping tokens 0 and 2 of the input swaps rows 0 and 2 of an encoder's output when nothing
    // in it depends on position (the negative control), and changes more than that with
    // PositionEmbedding.
    const std::int64_t n = 2;
    const auto x = reference_values(n * 24, 71, -1.5, 1.5);
    auto swapped = x;
    for (std::int64_t e = 0; e < n; ++e)
        for (std::int64_t c = 0; c < 6; ++c) std::swap(swapped[std::size_t(e * 24 + c)], swapped[std::size_t(e * 24 + 12 + c)]);
    auto unswap = [&](std::vector<double> y) {
        for (std::int64_t e = 0; e < n; ++e)
            for (std::int64_t c = 0; c < 6; ++c) std::swap(y[std::size_t(e * 24 + c)], y[std::size_t(e * 24 + 12 + c)]);
        return y;
    };
    NetRun<Encoder> plain(7);
    CHECK(max_abs_diff(unswap(plain.forward(swapped, n)), plain.forward(x, n)) <= 1e-12);
    NetRun<EncoderWithPositions> with(7);
    CHECK(max_abs_diff(unswap(with.forward(swapped, n)), with.forward(x, n)) > 1e-2);
}

#if !defined(__CUDACC__)
namespace {
/// 8x8 one-channel images whose class (0..3) is the quadrant holding a bright 4x4 square, on
/// noise: a patch-4 ViT sees it as which of its 4 tokens is bright.
strata::data::Dataset<> quadrant_task(std::size_t n, std::uint64_t seed) {
    auto f = strata_test::lcg(n * 64, seed, 0, 0.5);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        const int q = int(i % 4);
        for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) f[i * 64 + std::size_t((q / 2 * 4 + r) * 8 + q % 2 * 4 + c)] += 1.0;
        y[i] = q;
    }
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, std::move(y));
}
using QuadrantVit = Sequential<Input<8, 8, 1>, PatchEmbedding<4, 8>, PositionEmbedding<>, AttentionHalf<2, 4>, MlpHalf<8, 16>,
                               LayerNormalization<>, GlobalAveragePooling1D, Dense<4, Softmax>>;
}  // namespace

TEST_CASE("a small ViT trains (the loss falls) on which quadrant is bright, which needs the position embedding") {
    strata::Model<QuadrantVit> model(5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    const auto before = model.evaluate(quadrant_task(256, 1).batch(64));
    const auto h = model.fit(quadrant_task(256, 1).shuffle(256, 2).batch(32), {.epochs = 10, .verbose = 0});
    const auto after = model.evaluate(quadrant_task(128, 9).batch(64));  // held out
    INFO("loss " << before.loss << " -> " << after.loss << ", accuracy " << after.accuracy);
    CHECK(h["loss"].back() < 0.5 * h["loss"].front());
    CHECK(after.loss < 0.5 * before.loss);
    CHECK(after.accuracy > 0.9);
    // Negative control: without the position embedding the model cannot tell the quadrants
    // apart (the encoder is permutation-equivariant and the mean pooling symmetric).
    using Blind = Sequential<Input<8, 8, 1>, PatchEmbedding<4, 8>, AttentionHalf<2, 4>, MlpHalf<8, 16>, LayerNormalization<>,
                             GlobalAveragePooling1D, Dense<4, Softmax>>;
    strata::Model<Blind> blind(5);
    blind.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    blind.fit(quadrant_task(256, 1).shuffle(256, 2).batch(32), {.epochs = 10, .verbose = 0});
    const auto guess = blind.evaluate(quadrant_task(128, 9).batch(64));
    INFO("without positions: accuracy " << guess.accuracy);
    CHECK(guess.accuracy < 0.5);
}
#endif
