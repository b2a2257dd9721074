#pragma once
/// \file strata/tensor/ops.hpp
/// Element-wise ops, written once over the place's algorithms (place/algorithm.hpp: OpenMP loops
/// on the host, Thrust on the GPU):
/// fill, maps, arithmetic, bias broadcasting and random initialisation. Every op checks its
/// operands' sizes and throws ShapeError naming the op and both shapes.

#include <cstdint>
#include <type_traits>

#include "strata/core/random.hpp"
#include "strata/tensor/tensor.hpp"

namespace strata {

namespace detail {
template <class A, class B>
void check_same_size(const char* op, const A& a, const B& b) {
    STRATA_CHECK(a.size() == b.size(), ShapeError, op, ": operand shapes ", a.shape(), " and ", b.shape(),
                 " have different sizes");
}
template <class P1, class P2>
constexpr void check_same_place() {
    static_assert(std::is_same_v<P1, P2>,
                  "strata: all operands of an op must live on the same place; move one with "
                  "strata::copy_to<Place>(tensor) first");
}
}  // namespace detail

/// Sets every element of `x` to `value`.
template <class T, class P>
void fill(const TensorView<T, P>& x, T value) {
    place::fill_n<P>(x.data(), x.size(), value);
}

/// `out[i] = f(x[i])`; `out` may be `x`. `f` must be callable on the place (STRATA_HD in CUDA code).
template <class T, class U, class P, class P2, class F>
void map(const TensorView<T, P>& x, const TensorView<U, P2>& out, F f) {
    detail::check_same_place<P, P2>();
    detail::check_same_size("map", x, out);
    place::transform<P>(x.data(), x.size(), out.data(), f);
}

/// `out[i] = f(a[i], b[i])`; `out` may alias `a` or `b`.
template <class T, class P, class P2, class P3, class F>
void zip_map(const TensorView<T, P>& a, const TensorView<T, P2>& b, const TensorView<T, P3>& out, F f) {
    detail::check_same_place<P, P2>();
    detail::check_same_place<P, P3>();
    detail::check_same_size("zip_map", a, b);
    detail::check_same_size("zip_map", a, out);
    place::transform<P>(a.data(), b.data(), a.size(), out.data(), f);
}

namespace detail {
struct Plus { template <class T> STRATA_HD T operator()(T a, T b) const { return a + b; } };
struct Minus { template <class T> STRATA_HD T operator()(T a, T b) const { return a - b; } };
struct Times { template <class T> STRATA_HD T operator()(T a, T b) const { return a * b; } };
struct Divide { template <class T> STRATA_HD T operator()(T a, T b) const { return a / b; } };
template <class T>
struct Scale { T alpha; STRATA_HD T operator()(T x) const { return alpha * x; } };
template <class T>
struct AddScalar { T c; STRATA_HD T operator()(T x) const { return x + c; } };
template <class T>
struct Axpy { T alpha; STRATA_HD T operator()(T x, T y) const { return alpha * x + y; } };
template <class T>
struct Axpby { T alpha, beta; STRATA_HD T operator()(T x, T y) const { return alpha * x + beta * y; } };
}  // namespace detail

/// `out = a + b`, element-wise.
template <class T, class P>
void add(const TensorView<T, P>& a, const TensorView<T, P>& b, const TensorView<T, P>& out) { zip_map(a, b, out, detail::Plus{}); }
/// `out = a - b`, element-wise.
template <class T, class P>
void sub(const TensorView<T, P>& a, const TensorView<T, P>& b, const TensorView<T, P>& out) { zip_map(a, b, out, detail::Minus{}); }
/// `out = a * b`, element-wise.
template <class T, class P>
void mul(const TensorView<T, P>& a, const TensorView<T, P>& b, const TensorView<T, P>& out) { zip_map(a, b, out, detail::Times{}); }
/// `out = a / b`, element-wise.
template <class T, class P>
void div(const TensorView<T, P>& a, const TensorView<T, P>& b, const TensorView<T, P>& out) { zip_map(a, b, out, detail::Divide{}); }
/// `out = alpha * x`.
template <class T, class P>
void scale(const TensorView<T, P>& x, T alpha, const TensorView<T, P>& out) { map(x, out, detail::Scale<T>{alpha}); }
/// `out = x + c`.
template <class T, class P>
void add_scalar(const TensorView<T, P>& x, T c, const TensorView<T, P>& out) { map(x, out, detail::AddScalar<T>{c}); }
/// `y = alpha * x + y` (BLAS axpy).
template <class T, class P>
void axpy(T alpha, const TensorView<T, P>& x, const TensorView<T, P>& y) { zip_map(x, y, y, detail::Axpy<T>{alpha}); }
/// `y = alpha * x + beta * y`.
template <class T, class P>
void axpby(T alpha, const TensorView<T, P>& x, T beta, const TensorView<T, P>& y) { zip_map(x, y, y, detail::Axpby<T>{alpha, beta}); }

namespace detail {
template <class T>
struct AddBias {
    T* x;
    const T* bias;
    std::int64_t channels;
    STRATA_HD void operator()(std::int64_t i) const { x[i] += bias[i % channels]; }
};
template <class T>
struct UniformAt {
    std::uint64_t seed, stream;
    T lo, hi;
    STRATA_HD T operator()(std::int64_t i) const { return random::uniform_at<T>(seed, stream, std::uint64_t(i), lo, hi); }
};
template <class T>
struct NormalAt {
    std::uint64_t seed, stream;
    T mean, stddev;
    STRATA_HD T operator()(std::int64_t i) const { return random::normal_at<T>(seed, stream, std::uint64_t(i), mean, stddev); }
};
}  // namespace detail

/// Broadcasts `bias` (C elements) over the last axis of `x` and adds it in place:
/// `x[..., c] += bias[c]`. This is the per-channel bias of NHWC activations and the per-unit
/// bias of a Dense layer's [batch, units] output.
template <class T, class P>
void add_bias(const TensorView<T, P>& x, const TensorView<T, P>& bias) {
    STRATA_CHECK(x.rank() >= 1 && bias.size() == x.dim(-1), ShapeError, "add_bias: a bias of shape ", bias.shape(),
                 " cannot broadcast over the last axis of ", x.shape());
    if (x.size())
        place::for_each_n<P>(x.size(),
                           detail::AddBias<T>{x.data(), bias.data(), bias.size()});
}

/// Fills `x` with uniform numbers in [lo, hi): element i is Philox(seed, stream, i), the same
/// on every place and for any number of threads.
template <class T, class P>
void random_uniform(const TensorView<T, P>& x, T lo, T hi, std::uint64_t seed, std::uint64_t stream = 0) {
    static_assert(std::is_floating_point_v<T>, "strata::random_uniform: T must be float or double");
    place::tabulate<P>(x.data(), x.size(), detail::UniformAt<T>{seed, stream, lo, hi});
}

/// Fills `x` with normal numbers (Box-Muller over Philox), reproducible like random_uniform.
template <class T, class P>
void random_normal(const TensorView<T, P>& x, T mean, T stddev, std::uint64_t seed, std::uint64_t stream = 0) {
    static_assert(std::is_floating_point_v<T>, "strata::random_normal: T must be float or double");
    place::tabulate<P>(x.data(), x.size(), detail::NormalAt<T>{seed, stream, mean, stddev});
}

#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp): the optimizers' and paths' scalings.
STRATA_CUDA_TEMPLATE void scale<float, place::Cuda>(const TensorView<float, place::Cuda>&, float, const TensorView<float, place::Cuda>&);
STRATA_CUDA_TEMPLATE void scale<double, place::Cuda>(const TensorView<double, place::Cuda>&, double, const TensorView<double, place::Cuda>&);
STRATA_CUDA_TEMPLATE void axpy<float, place::Cuda>(float, const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&);
STRATA_CUDA_TEMPLATE void axpy<double, place::Cuda>(double, const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&);
#endif

}  // namespace strata
