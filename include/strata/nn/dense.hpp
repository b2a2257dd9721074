#pragma once
/// \file strata/nn/dense.hpp
/// `Dense<Units, Activation>`: y = act(x · kernel + bias), with Keras's layout (kernel is
/// [inputs, units]) and initialisation (Glorot uniform kernel, zero bias).

#include <cstdint>
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
    static_assert(Activation<Act>, "strata::nn::Dense<Units, Act>: Act must be an activation (Linear, ReLU, Sigmoid, Tanh, Softmax)");
    static constexpr const char* name = "Dense";
    static constexpr const char* keras_name = "dense";
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::DenseImpl<Units, Act, UseBias, In, T, P>;
};

namespace detail {
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
        bias_activation<Act>(ym, UseBias ? params + kernel_size : nullptr, Units, mode.skip_activation);
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y,
                  const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        const TensorView<T, P> xm(x.data(), Shape{n, inputs}), dym(dy.data(), Shape{n, Units});
        {
            STRATA_PROFILE_PHASE("backward.activation");
            activation_backward_and_bias_grad<Act>(TensorView<T, P>(y.data(), Shape{n, Units}), dym, mode.skip_activation,
                                                   UseBias ? grads + kernel_size : nullptr);
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
};
}  // namespace detail

}  // namespace strata::nn
