#pragma once
/// \file strata/nn/activation.hpp
/// Activations: `Linear`, `ReLU`, `Sigmoid`, `Tanh`, `Softmax`, `GELU`, `GELUTanh`, as tags
/// layers take (`Dense<64, ReLU>`). Each gives its value and, for the backward pass, its
/// derivative expressed through its output y (so no pre-activation buffer is kept), except the
/// GELUs: GELU is not monotonic (its minimum, about -0.17 at x ≈ -0.75, is reached from two
/// sides), so its derivative is not a function of its output. They say so with
/// `grad_needs_input = true` and give `grad_from_input(x, dy)` instead of `grad(y, dy)`; a layer
/// that keeps no pre-activation refuses them at compile time (grad_needs_input_v).
///
/// Every activation propagates NaN, forward and backward: a NaN input gives a NaN output, and a
/// NaN output or incoming gradient gives a NaN gradient (as IEEE arithmetic, and TensorFlow's
/// `dy * (y > 0)`, do), so a corrupted weight or a diverging step is never turned into a finite
/// value that trains on. The forms stay branch-free selects, so the host loops vectorise.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "strata/fwd.hpp"
#include "strata/nn/gelu_simd.hpp"
#include "strata/tensor/tensor_all.hpp"

namespace strata::nn {

/// No activation: y = x.
struct Linear {
    static constexpr const char* name = "linear";
    static constexpr bool rowwise = false;
    template <class T> STRATA_HD static T apply(T x) { return x; }
    template <class T> STRATA_HD static T grad(T, T dy) { return dy; }
};
/// y = max(x, 0); NaN stays NaN.
struct ReLU {
    static constexpr const char* name = "relu";
    static constexpr bool rowwise = false;
    // `x < 0 ? 0 : x` passes NaN (an unordered compare is false; x86's maxps(0, x) is this form);
    // `+ 0` turns -0 into +0, so every other input gives the same bits as `x > 0 ? x : 0`.
    template <class T> STRATA_HD static T apply(T x) { return x < T(0) ? T(0) : x + T(0); }
    // Where the unit is off, 0 for finite y and dy (x - x is +0) and NaN where either is NaN
    // (TensorFlow's dy * (y > 0) gives the same); where it is on, dy.
    template <class T> STRATA_HD static T grad(T y, T dy) { return y > T(0) ? dy : (y - y) + (dy - dy); }
};
/// y = 1 / (1 + e^-x).
struct Sigmoid {
    static constexpr const char* name = "sigmoid";
    static constexpr bool rowwise = false;
    template <class T> STRATA_HD static T apply(T x) { using std::exp; return T(1) / (T(1) + exp(-x)); }
    template <class T> STRATA_HD static T grad(T y, T dy) { return dy * y * (T(1) - y); }
};
/// y = tanh(x).
struct Tanh {
    static constexpr const char* name = "tanh";
    static constexpr bool rowwise = false;
    template <class T> STRATA_HD static T apply(T x) { using std::tanh; return tanh(x); }
    template <class T> STRATA_HD static T grad(T y, T dy) { return dy * (T(1) - y * y); }
};
/// y = softmax over the last axis. With a cross-entropy loss the two are fused (the loss
/// works from the logits), which is both faster and stable for large logits.
struct Softmax {
    static constexpr const char* name = "softmax";
    static constexpr bool rowwise = true;
};

namespace detail {
// The Gaussian CDF Φ(x) and x · φ(x) (φ the density), in T: Φ through erfc so that the far
// negative tail keeps its digits (1 + erf(x/√2) is 0 in double below x ≈ -8.3, erfc is not).
template <class T>
STRATA_HD inline T gaussian_cdf(T x) {
    using std::erfc;
    return T(0.5) * erfc(-x * T(0.70710678118654752440));
}
template <class T>
STRATA_HD inline T x_gaussian_pdf(T x) {
    using std::exp;
    // |x| >= 40: the density is 0 in double (e^-800), and x·0 would be NaN at ±inf.
    return x * x < T(1600) ? x * (T(0.39894228040143267794) * exp(T(-0.5) * x * x)) : T(0);
}
}  // namespace detail

/// The Gaussian error linear unit (Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)",
/// 2016), exact form: y = x · Φ(x) = x/2 · (1 + erf(x/√2)), Keras' `gelu` (`approximate=False`,
/// its default) and PyTorch's `GELU()`. Derivative Φ(x) + x · φ(x), from the input x
/// (`grad_needs_input`). GELU(-inf) = 0, GELU(+inf) = +inf, NaN stays NaN.
///
/// \code
/// using Mlp = Sequential<Input<64>, Dense<256, GELU>, Dense<64>>;
/// \endcode
struct GELU {
    static constexpr const char* name = "gelu";
    static constexpr bool rowwise = false;
    static constexpr bool grad_needs_input = true;
    // Below -40, Φ(x) is 0 in double; the select keeps GELU(-inf) at 0 (-inf · 0 is NaN).
    template <class T> STRATA_HD static T apply(T x) { return x < T(-40) ? T(0) : x * detail::gaussian_cdf(x); }
    template <class T> STRATA_HD static T grad_from_input(T x, T dy) {
        return dy * (detail::gaussian_cdf(x) + detail::x_gaussian_pdf(x));
    }
};
/// GELU's tanh approximation (Hendrycks & Gimpel 2016, eq. in section 2; used by BERT and
/// GPT-2): y = x/2 · (1 + tanh(u)), u = √(2/π) · (x + 0.044715 x³); Keras'
/// `gelu(x, approximate=True)`, PyTorch's `GELU(approximate="tanh")`. Derivative
/// (1 + t)/2 + x/2 · (1 − t²) · √(2/π) · (1 + 3 · 0.044715 x²) with t = tanh(u), from the input.
struct GELUTanh {
    static constexpr const char* name = "gelu_tanh";
    static constexpr bool rowwise = false;
    static constexpr bool grad_needs_input = true;
    // Beyond |x| = 10, tanh(u) is ±1 in double: y is x or 0 (the selects also keep ±inf finite
    // where x³ and x · 0 would give NaN); NaN fails both compares and stays NaN.
    template <class T> STRATA_HD static T apply(T x) {
        using std::tanh;
        const T t = tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
        return x > T(10) ? x : x < T(-10) ? T(0) : T(0.5) * x * (T(1) + t);
    }
    template <class T> STRATA_HD static T grad_from_input(T x, T dy) {
        using std::tanh;
        const T t = tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
        const T d = T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(0.79788456080286535588) * (T(1) + T(3 * 0.044715) * x * x);
        return dy * (x > T(10) ? T(1) : x < T(-10) ? T(0) : d);
    }
};

/// Whether the activation's derivative needs its input (GELU, GELUTanh): then it has
/// `grad_from_input(x, dy)` and no `grad(y, dy)`, and only a layer that keeps the
/// pre-activation can use it (ActivationLayer, Dense).
template <class A>
inline constexpr bool grad_needs_input_v = [] {
    if constexpr (requires { A::grad_needs_input; }) return bool(A::grad_needs_input);
    else return false;
}();

/// Satisfied by the activation tags.
template <class A>
concept Activation = requires {
    { A::name } -> std::convertible_to<const char*>;
    { A::rowwise } -> std::convertible_to<bool>;
};

namespace detail {
template <class T, class Act>
struct BiasActivate {
    T* y;
    const T* bias;
    std::int64_t channels;
    STRATA_HD void operator()(std::int64_t i) const {
        const T v = bias ? y[i] + bias[i % channels] : y[i];
        y[i] = Act::apply(v);
    }
};
/// y[r·C + c] = act(y[r·C + c] + bias[c]), one row r per index, keeping y + bias in `keep`
/// when it is not null (an activation whose derivative needs its input): the host's shape (the
/// per-value form's `i % channels` is a 64-bit division per value, which cost more than the add:
/// with GELU's input it was 12% of the ViT's step on the host); a loop over the row that the
/// compiler can vectorise. On a GPU one thread per value stays (coalesced).
template <class T, class Act>
struct BiasActivateByRow {
    T* y;
    T* keep;
    const T* bias;
    std::int64_t channels;
    STRATA_HD void operator()(std::int64_t r) const {
        T* row = y + r * channels;
        if (keep) {
            T* kept = keep + r * channels;
            for (std::int64_t c = 0; c < channels; ++c) {
                kept[c] = row[c] + bias[c];
                row[c] = Act::apply(kept[c]);
            }
        } else {
            for (std::int64_t c = 0; c < channels; ++c) row[c] = Act::apply(row[c] + bias[c]);
        }
    }
};
/// The exact GELU in float on the host, a row per index through the eight-lane form
/// (strata/nn/gelu_simd.hpp); bias and keep may be null.
struct GeluRowsSimd {
    float* y;
    float* keep;
    const float* bias;
    std::int64_t channels;
    void operator()(std::int64_t r) const {
        gelu_row_simd(y + r * channels, keep ? keep + r * channels : nullptr, bias, channels);
    }
};
/// The eight-lane GELU over `count` values in blocks of `block` per index (the result of a value
/// does not depend on the block it falls in): y = GELU(x) (ActivationLayer's forward; x may be y).
struct GeluBlocksSimd {
    static constexpr std::int64_t block = 1024;
    const float* x;
    float* y;
    std::int64_t count;
    static std::int64_t blocks(std::int64_t count) { return (count + block - 1) / block; }
    void operator()(std::int64_t b) const {
        const std::int64_t first = b * block;
        gelu_apply_simd(x + first, y + first, nullptr, nullptr, std::min(block, count - first));
    }
};
/// dx = dy · GELU'(pre), the same way (dx may be dy: Dense's backward, in place).
struct GeluGradSimd {
    const float* pre;
    const float* dy;
    float* dx;
    std::int64_t count;
    void operator()(std::int64_t b) const {
        const std::int64_t first = b * GeluBlocksSimd::block;
        gelu_grad_apply_simd(pre + first, dy + first, dx + first, std::min(GeluBlocksSimd::block, count - first));
    }
};
/// Whether Act in T on P goes through the eight-lane GELU. (A unit compiled without AVX2 and
/// FMA, as nvcc's host code is, takes the per-value std::erfc form: within float's tolerance of
/// the eight-lane one, not the same bits; a program should not mix the two for one model.)
template <class Act, class P, class T>
inline constexpr bool gelu_lanes_v = gelu_simd && std::is_same_v<Act, GELU> && std::is_same_v<T, float> && std::is_same_v<P, place::Host>;

/// On the host with a bias (and for the exact GELU in float, with or without one), `count`
/// values y (rows of `channels`) become act(y + bias) one row per index (y + bias kept in
/// `keep` when not null), and true is returned; elsewhere nothing is done and false is
/// returned, for the caller's one-value-per-index form.
template <class Act, class P, class T>
bool bias_activate_rows(std::int64_t count, T* y, T* keep, const T* bias, std::int64_t channels) {
    if constexpr (gelu_lanes_v<Act, P, T>) {
        place::for_each_n<P>(count / channels, GeluRowsSimd{y, keep, bias, channels});
        return true;
    } else if constexpr (std::is_same_v<P, place::Host>) {
        if (bias) {
            place::for_each_n<P>(count / channels, BiasActivateByRow<T, Act>{y, keep, bias, channels});
            return true;
        }
    }
    return false;
}
/// `count` values y (rows of `channels`) become act(y + bias) (bias may be null), in the shape
/// that suits the place.
template <class Act, class P, class T>
void bias_activate_values(std::int64_t count, T* y, const T* bias, std::int64_t channels) {
    if (!bias_activate_rows<Act, P>(count, y, static_cast<T*>(nullptr), bias, channels))
        place::for_each_n<P>(count, BiasActivate<T, Act>{y, bias, channels});
}
template <class T, class Act>
struct ActivationGrad {
    const T* y;
    T* dy;
    STRATA_HD void operator()(std::int64_t i) const { dy[i] = Act::grad(y[i], dy[i]); }
};
template <class T>
struct SoftmaxGrad {
    const T* y;
    T* dy;
    std::int64_t cols;
    STRATA_HD void operator()(std::int64_t r) const {
        const T* yr = y + r * cols;
        T* d = dy + r * cols;
        T s = 0;
        for (std::int64_t c = 0; c < cols; ++c) s += d[c] * yr[c];
        for (std::int64_t c = 0; c < cols; ++c) d[c] = yr[c] * (d[c] - s);
    }
};
}  // namespace detail

/// `y = act(y + bias)` in one pass over `y` ([..., C]; `bias` has C elements or is empty).
/// With `skip_activation`, only the bias is added (the fused softmax tail).
template <class Act, class T, class P>
void bias_activation(const TensorView<T, P>& y, const T* bias, std::int64_t channels, bool skip_activation) {
    if (y.size() == 0) return;
    if constexpr (Act::rowwise) {
        if (bias) detail::bias_activate_values<Linear, P>(y.size(), y.data(), bias, channels);
        if (!skip_activation) softmax(y, y);
    } else {
        if (skip_activation || std::is_same_v<Act, Linear>) {
            if (bias) detail::bias_activate_values<Linear, P>(y.size(), y.data(), bias, channels);
        } else {
            detail::bias_activate_values<Act, P>(y.size(), y.data(), bias, channels);
        }
    }
}

/// `dy = dy * act'(x)` in place, computed from the activation's output `y`.
template <class Act, class T, class P>
void activation_backward(const TensorView<T, P>& y, const TensorView<T, P>& dy, bool skip_activation) {
    static_assert(!grad_needs_input_v<Act>,
                  "strata::nn::activation_backward: this activation's derivative needs its input (GELU, GELUTanh), not "
                  "its output; the layer using it keeps no pre-activation: follow a Linear layer with "
                  "ActivationLayer<GELU> instead");
    if (skip_activation || std::is_same_v<Act, Linear> || y.size() == 0) return;
    if constexpr (Act::rowwise) {
        const std::int64_t cols = y.dim(-1);
        place::for_each_n<P>(y.size() / cols,
                           detail::SoftmaxGrad<T>{y.data(), dy.data(), cols});
    } else {
        place::for_each_n<P>(y.size(),
                           detail::ActivationGrad<T, Act>{y.data(), dy.data()});
    }
}

#if STRATA_HAS_CUDA
namespace detail {
/// How the bias gradient's reduction reads dy on a GPU: through Act's derivative, written back
/// in place (the pass reads each element once), so that the activation's backward and the bias
/// gradient are one kernel and one read of dy.
template <class T, class Act>
struct ActivationGradLoad {
    const T* __restrict__ y;
    T* __restrict__ dy;
    __device__ accumulate_t<T> operator()(std::int64_t i) const {
        const T g = Act::grad(y[i], dy[i]);
        dy[i] = g;
        return accumulate_t<T>(g);
    }
};
}  // namespace detail
#endif

/// The activation's backward on `dy` ([rows, cols], in place, from the output `y`) and, when
/// `bias_grad` is not null, the column sums of the result into bias_grad[cols] (a layer's bias
/// gradient). On a GPU one pass: the reduction reads dy through the derivative; elsewhere
/// activation_backward, then sum over axis 0. The same figures either way: the reduction's
/// grouping depends on the shape only.
template <class Act, class T, class P>
void activation_backward_and_bias_grad(const TensorView<T, P>& y, const TensorView<T, P>& dy, bool skip_activation,
                                       T* bias_grad) {
    const std::int64_t cols = dy.rank() > 0 ? dy.dim(-1) : 1;
    if constexpr (std::is_same_v<P, place::Cuda> && !Act::rowwise && !std::is_same_v<Act, Linear>) {
#if STRATA_HAS_CUDA
        if (bias_grad && !skip_activation && dy.size() > 0) {
            strata::detail::cuda_reduce::axis_with(detail::ActivationGradLoad<T, Act>{y.data(), dy.data()}, bias_grad, 1,
                                                   dy.size() / cols, cols, strata::detail::Reduction::Sum);
            return;
        }
#endif
    }
    activation_backward<Act>(y, dy, skip_activation);
    if (bias_grad) sum(dy, 0, TensorView<T, P>(bias_grad, Shape{cols}));
}

#if STRATA_INSTANCES
// The host's activations, compiled once in the compiled part.
STRATA_TEMPLATE void bias_activation<Linear, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<ReLU, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Sigmoid, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Tanh, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Softmax, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Linear, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<ReLU, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Sigmoid, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Tanh, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
STRATA_TEMPLATE void bias_activation<Softmax, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
STRATA_TEMPLATE void activation_backward<Linear, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<ReLU, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Sigmoid, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Tanh, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Softmax, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Linear, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<ReLU, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Sigmoid, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Tanh, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
STRATA_TEMPLATE void activation_backward<Softmax, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE void bias_activation<Linear, float, place::Cuda>(const TensorView<float, place::Cuda>&, const float*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<ReLU, float, place::Cuda>(const TensorView<float, place::Cuda>&, const float*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Sigmoid, float, place::Cuda>(const TensorView<float, place::Cuda>&, const float*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Tanh, float, place::Cuda>(const TensorView<float, place::Cuda>&, const float*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Softmax, float, place::Cuda>(const TensorView<float, place::Cuda>&, const float*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Linear, double, place::Cuda>(const TensorView<double, place::Cuda>&, const double*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<ReLU, double, place::Cuda>(const TensorView<double, place::Cuda>&, const double*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Sigmoid, double, place::Cuda>(const TensorView<double, place::Cuda>&, const double*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Tanh, double, place::Cuda>(const TensorView<double, place::Cuda>&, const double*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void bias_activation<Softmax, double, place::Cuda>(const TensorView<double, place::Cuda>&, const double*, std::int64_t, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Linear, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<ReLU, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Sigmoid, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Tanh, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Softmax, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Linear, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<ReLU, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Sigmoid, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Tanh, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward<Softmax, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Linear, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool, float*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<ReLU, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool, float*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Sigmoid, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool, float*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Tanh, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool, float*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Softmax, float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, bool, float*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Linear, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool, double*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<ReLU, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool, double*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Sigmoid, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool, double*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Tanh, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool, double*);
STRATA_CUDA_TEMPLATE void activation_backward_and_bias_grad<Softmax, double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, bool, double*);
#endif

}  // namespace strata::nn
