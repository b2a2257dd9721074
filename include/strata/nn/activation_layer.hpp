#pragma once
/// \file strata/nn/activation_layer.hpp
/// `ActivationLayer<Act>`: an activation as a layer of its own (Keras' `layers.Activation`), for
/// where it does not follow a Dense or Conv2D directly: after a BatchNormalization
/// (Conv2D → BatchNormalization → ReLU, the residual networks' unit).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <class Act, class In, class T, class P>
class ActivationLayerImpl;
}

/// y = act(x), element by element (Softmax: over the last axis of a flat input). GELU's
/// derivative is taken from the layer's input x (backward receives it), the others' from y.
///
/// \code
/// using Unit = Sequential<Input<28, 28, 1>, Conv2D<16, 3, Linear, 1, Padding::Same, false>, BatchNormalization<>,
///                         ActivationLayer<ReLU>, ...>;
/// \endcode
template <class Act>
struct ActivationLayer {
    static_assert(Activation<Act>, "strata::nn::ActivationLayer<Act>: Act must be an activation (Linear, ReLU, Sigmoid, Tanh, Softmax, GELU, GELUTanh)");
    static constexpr const char* name = "Activation";
    static constexpr const char* keras_name = "activation";
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::ActivationLayerImpl<Act, In, T, P>;
};

namespace detail {
// y = act(x) and dx = dy · act'(y) in one pass each (one element per index, on any place).
template <class T, class Act>
struct ApplyActivation {
    const T* x;
    T* y;
    STRATA_HD void operator()(std::int64_t i) const { y[i] = Act::apply(x[i]); }
};
template <class T, class Act>
struct ActivationGradInto {
    const T* y;
    const T* dy;
    T* dx;
    STRATA_HD void operator()(std::int64_t i) const { dx[i] = Act::grad(y[i], dy[i]); }
};
// GELU's: from the layer's input x.
template <class T, class Act>
struct ActivationGradFromInputInto {
    const T* x;
    const T* dy;
    T* dx;
    STRATA_HD void operator()(std::int64_t i) const { dx[i] = Act::grad_from_input(x[i], dy[i]); }
};

template <class Act, class In, class T, class P>
class ActivationLayerImpl {
    static_assert(LayerShapeError<ActivationLayer<Act>, AnyShapeOfRank<1>, In, !Act::rowwise || In::rank == 1>::value,
                  "strata::nn::ActivationLayer<Softmax>: a softmax layer takes a flat input (rank 1 per example); put "
                  "Flatten before it");

public:
    using input_shape = In;
    /// Carries the token mask (TokenMask): its output has the input's tokens, each from its own.
    static constexpr TokenMask token_mask = TokenMask::Passes;
    using output_shape = In;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        const TensorView<T, P> ym(y.data(), Shape{n, In::size});
        if constexpr (!Act::rowwise && !std::is_same_v<Act, Linear>) {
            if (!mode.skip_activation) {
                if (n > 0) {
                    if constexpr (gelu_lanes_v<Act, P, T>) {  // the eight-lane GELU (gelu_simd.hpp), in blocks
                        place::for_each_n<P>(GeluBlocksSimd::blocks(n * In::size), GeluBlocksSimd{x.data(), y.data(), n * In::size});
                    } else {
                        place::for_each_n<P>(n * In::size, ApplyActivation<T, Act>{x.data(), y.data()});
                    }
                }
                return;
            }
        }
        copy(TensorView<T, P>(x.data(), Shape{n, In::size}), ym);
        bias_activation<Act>(ym, static_cast<const T*>(nullptr), In::size, mode.skip_activation);
    }

    void backward(const T*, T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        if constexpr (!Act::rowwise && !std::is_same_v<Act, Linear>) {
            if (!mode.skip_activation) {
                if constexpr (grad_needs_input_v<Act>) {
                    if (!dx.empty() && n > 0) {
                        if constexpr (gelu_lanes_v<Act, P, T>) {
                            place::for_each_n<P>(GeluBlocksSimd::blocks(n * In::size),
                                                 GeluGradSimd{x.data(), dy.data(), dx.data(), n * In::size});
                        } else {
                            place::for_each_n<P>(n * In::size, ActivationGradFromInputInto<T, Act>{x.data(), dy.data(), dx.data()});
                        }
                    }
                } else {
                    if (!dx.empty() && n > 0) place::for_each_n<P>(n * In::size, ActivationGradInto<T, Act>{y.data(), dy.data(), dx.data()});
                }
                return;
            }
        }
        const TensorView<T, P> dym(dy.data(), Shape{n, In::size});
        if constexpr (!grad_needs_input_v<Act>)  // (a skipped GELU is the identity)
            activation_backward<Act>(TensorView<T, P>(y.data(), Shape{n, In::size}), dym, mode.skip_activation);
        if (!dx.empty()) copy(dym, TensorView<T, P>(dx.data(), Shape{n, In::size}));
    }
};
}  // namespace detail

}  // namespace strata::nn
