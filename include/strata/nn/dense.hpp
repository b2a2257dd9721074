#pragma once
/// \file strata/nn/dense.hpp
/// `Dense<Units, Activation>`: y = act(x · kernel + bias), with Keras's layout (kernel is
/// [inputs, units]) and initialisation (Glorot uniform kernel, zero bias).
///
/// With an activation whose derivative needs its input (GELU, GELUTanh: grad_needs_input_v),
/// the layer keeps x · kernel + bias of its last forward for backward ([n, Units], one buffer;
/// not kept when `Mode::no_backward`).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <std::int64_t Units, class Act, bool UseBias, class In, class T, class P>
class DenseImpl;
}

/// A fully connected layer of `Units` units. Its input must be flat (rank 1 per example):
/// put `Flatten` after convolutions.
///
/// \code
/// using Net = strata::nn::Sequential<strata::nn::Input<784>, strata::nn::Dense<64, strata::nn::ReLU>,
///                                    strata::nn::Dense<10, strata::nn::Softmax>>;
/// \endcode
template <std::int64_t Units, class Act, bool UseBias>
struct Dense {
    static_assert(Units >= 1, "strata::nn::Dense<Units>: Units must be >= 1");
    static_assert(Activation<Act>, "strata::nn::Dense<Units, Act>: Act must be an activation (Linear, ReLU, Sigmoid, Tanh, Softmax, GELU, GELUTanh)");
    static constexpr const char* name = "Dense";
    static constexpr const char* keras_name = "dense";
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::DenseImpl<Units, Act, UseBias, In, T, P>;
};

namespace detail {
/// pre[i] = y[i] + bias[i % channels]; y[i] = act(pre[i]) (the pre-activation kept for an
/// activation whose derivative needs it).
template <class T, class Act>
struct BiasActivateKeep {
    T* y;
    T* pre;
    const T* bias;
    std::int64_t channels;
    STRATA_HD void operator()(std::int64_t i) const {
        const T v = bias ? y[i] + bias[i % channels] : y[i];
        pre[i] = v;
        y[i] = Act::apply(v);
    }
};
/// dy[i] = act'(pre[i]) · dy[i] in place.
template <class T, class Act>
struct ActivationGradFromInput {
    const T* pre;
    T* dy;
    STRATA_HD void operator()(std::int64_t i) const { dy[i] = Act::grad_from_input(pre[i], dy[i]); }
};
struct NoBuffer {};

/// The buffer a dense layer keeps its pre-activation in: a tensor for an activation whose
/// derivative needs its input (GELU), nothing otherwise.
template <class Act, class T, class P>
using PreActivation = std::conditional_t<grad_needs_input_v<Act>, Tensor<T, P>, NoBuffer>;

/// A dense layer's bias and activation on its GEMM's output y [n, units], in place. With an
/// activation whose derivative needs its input the pre-activation is kept in `pre` (unless
/// Mode::no_backward); Mode::skip_activation adds the bias only.
template <class Act, class T, class P>
void dense_bias_activation(const TensorView<T, P>& y, const T* bias, std::int64_t units, const Mode& mode, PreActivation<Act, T, P>& pre) {
    const std::int64_t count = y.size();
    if constexpr (grad_needs_input_v<Act>) {
        if (!mode.skip_activation && count > 0) {
            if (mode.no_backward) {
                bias_activate_values<Act, P>(count, y.data(), bias, units);
            } else {
                pre.resize(Shape{count / units, units});
                if (!bias_activate_rows<Act, P>(count, y.data(), pre.data(), bias, units))
                    place::for_each_n<P>(count, BiasActivateKeep<T, Act>{y.data(), pre.data(), bias, units});
            }
            return;
        }
        bias_activation<Linear>(y, bias, units, false);
    } else {
        bias_activation<Act>(y, bias, units, mode.skip_activation);
    }
}

/// Backward of dense_bias_activation: dy [n, units] becomes the gradient before the activation,
/// in place, and bias_grad (when given) the sum of its rows. `layer` names the layer in the
/// error a backward without the forward's pre-activation gives.
template <class Act, class T, class P>
void dense_activation_backward(const TensorView<T, P>& y, const TensorView<T, P>& dy, T* bias_grad, std::int64_t units, const Mode& mode,
                               const PreActivation<Act, T, P>& pre, const char* layer) {
    const std::int64_t count = dy.size();
    if constexpr (grad_needs_input_v<Act>) {
        if (!mode.skip_activation && count > 0) {
            STRATA_CHECK(pre.size() == count, ValueError, layer, "<", units, ", ", Act::name,
                         ">: backward needs the pre-activation of a forward on the same batch (", count / units,
                         " rows) without Mode::no_backward");
            if constexpr (gelu_lanes_v<Act, P, T>)
                place::for_each_n<P>(GeluBlocksSimd::blocks(count), GeluGradSimd{pre.data(), dy.data(), dy.data(), count});
            else
                place::for_each_n<P>(count, ActivationGradFromInput<T, Act>{pre.data(), dy.data()});
        }
        if (bias_grad) sum(dy, 0, TensorView<T, P>(bias_grad, Shape{units}));
    } else {
        activation_backward_and_bias_grad<Act>(y, dy, mode.skip_activation, bias_grad);
    }
}

template <std::int64_t Units, class Act, bool UseBias, class In, class T, class P>
class DenseImpl {

    static_assert(LayerShapeError<Dense<Units, Act, UseBias>, AnyShapeOfRank<1>, In, In::rank == 1>::value,
                  "strata::nn::Dense: the input must be flat (rank 1 per example); put Flatten before Dense");

public:
    using input_shape = In;
    using output_shape = StaticShape<Units>;
    static constexpr std::int64_t inputs = In::size;
    static constexpr std::int64_t kernel_size = inputs * Units;
    static constexpr std::int64_t num_params = kernel_size + (UseBias ? Units : 0);

    static std::vector<ParamInfo> param_info() {
        std::vector<ParamInfo> p{{"kernel", Shape{inputs, Units}, 0}};
        if (UseBias) p.push_back({"bias", Shape{Units}, kernel_size});
        return p;
    }

    void init(T* params, std::uint64_t seed, std::uint64_t stream) const {
        glorot_uniform<T, P>(params, kernel_size, inputs, Units, seed, stream);
        if (UseBias) zeros<T, P>(params + kernel_size, Units);
    }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        const TensorView<T, P> xm(x.data(), Shape{n, inputs}), ym(y.data(), Shape{n, Units});
        const TensorView<T, P> w(const_cast<T*>(params), Shape{inputs, Units});
        gemm(Trans::No, Trans::No, T(1), xm, w, T(0), ym);
        dense_bias_activation<Act>(ym, UseBias ? params + kernel_size : nullptr, Units, mode, pre_);
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y,
                  const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        const TensorView<T, P> xm(x.data(), Shape{n, inputs}), dym(dy.data(), Shape{n, Units});
        {
            STRATA_PROFILE_PHASE("backward.activation");
            dense_activation_backward<Act>(TensorView<T, P>(y.data(), Shape{n, Units}), dym, UseBias ? grads + kernel_size : nullptr, Units,
                                           mode, pre_, "Dense");
        }
        {
            STRATA_PROFILE_PHASE("backward.weights");
            gemm(Trans::Yes, Trans::No, T(1), xm, dym, T(0), TensorView<T, P>(grads, Shape{inputs, Units}));
        }
        STRATA_PROFILE_PHASE("backward.data");
        if (!dx.empty())
            gemm(Trans::No, Trans::Yes, T(1), dym, TensorView<T, P>(const_cast<T*>(params), Shape{inputs, Units}), T(0),
                 TensorView<T, P>(dx.data(), Shape{n, inputs}));
    }

private:
    [[no_unique_address]] PreActivation<Act, T, P> pre_;
};
}  // namespace detail

}  // namespace strata::nn
