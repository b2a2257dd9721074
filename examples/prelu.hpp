#pragma once
// A user-defined layer, written outside the library against the Layer concept
// (strata/nn/layer.hpp): PReLU, the parametric ReLU of He et al., "Delving deep into rectifiers",
// ICCV 2015. y = x where x > 0, alpha * x elsewhere, with one learned alpha per input value
// (Keras's PReLU without shared axes). examples/custom_layer.cpp trains it; tests/test_layers.cpp
// checks its gradients against finite differences like the built-in layers'.
//
// A layer is two types: the *spec* users write in a Sequential (PReLU), and the *bound* layer
// it gives for an input shape, element type and place (PReLUImpl), which computes.
#include <strata/nn/layer.hpp>

#include <cstdint>
#include <vector>

namespace example {

template <class In, class T, class P>
class PReLUImpl {
    // This layer loops over plain pointers, so it runs where the host can read the data. (A
    // layer for every place writes its loops with strata::place::for_each_n<P> and its siblings,
    // strata/place/algorithm.hpp, like the built-in ones.)
    static_assert(strata::place::host_accessible_v<P>,
                  "example::PReLU runs on host places only (its loops read tensors from the host)");

public:
    using input_shape = In;
    using output_shape = In;                                  // elementwise: same shape out
    static constexpr std::int64_t num_params = In::size;      // one alpha per input value

    static std::vector<strata::nn::ParamInfo> param_info() { return {{"alpha", In::unbatched(), 0}}; }

    /// alpha = 0.25 everywhere, He et al.'s starting value (no randomness needed).
    void init(T* params, std::uint64_t /*seed*/, std::uint64_t /*stream*/) const {
        for (std::int64_t i = 0; i < num_params; ++i) params[i] = T(0.25);
    }

    void forward(const T* alpha, const strata::TensorView<T, P>& x, const strata::TensorView<T, P>& y,
                 const strata::nn::Mode&) {
        const std::int64_t n = x.dim(0);
        const T* in = x.data();
        T* out = y.data();
        for (std::int64_t b = 0; b < n; ++b)
            for (std::int64_t i = 0; i < In::size; ++i) {
                const T v = in[b * In::size + i];
                out[b * In::size + i] = v > T(0) ? v : alpha[i] * v;
            }
    }

    /// dx = dy where x > 0, alpha * dy elsewhere; d alpha_i = sum over the batch of dy * x where x <= 0.
    void backward(const T* alpha, T* grads, const strata::TensorView<T, P>& x, const strata::TensorView<T, P>&,
                  const strata::TensorView<T, P>& dy, const strata::TensorView<T, P>& dx, const strata::nn::Mode&) {
        const std::int64_t n = x.dim(0);
        const T* in = x.data();
        const T* g = dy.data();
        for (std::int64_t i = 0; i < In::size; ++i) grads[i] = T(0);  // the contract: overwrite, not accumulate
        for (std::int64_t b = 0; b < n; ++b)
            for (std::int64_t i = 0; i < In::size; ++i) {
                const std::int64_t k = b * In::size + i;
                if (in[k] <= T(0)) grads[i] += g[k] * in[k];
                if (!dx.empty()) dx.data()[k] = in[k] > T(0) ? g[k] : alpha[i] * g[k];  // empty dx: first layer
            }
    }
};

/// The spec: what goes into a Sequential, `Sequential<Input<784>, Dense<64>, example::PReLU, ...>`.
struct PReLU {
    static constexpr const char* name = "PReLU";        // summary()'s type column
    static constexpr const char* keras_name = "p_re_lu";  // variables: p_re_lu/alpha (Keras's name)
    template <class In, class T, class P>
    using bind = PReLUImpl<In, T, P>;
};

}  // namespace example
