#pragma once
/// \file strata/nn/global_average_pooling1d.hpp
/// `GlobalAveragePooling1D`: the mean of each feature over the tokens (steps) of [tokens,
/// features] examples, [n, S, D] → [n, D] (Keras' `GlobalAveragePooling1D()`, channels last):
/// the mean pooling head of a Vision Transformer without a class token (Beyer et al., "Better
/// plain ViT baselines for ImageNet-1k", 2022, pool the tokens' mean: "GAP").
///
/// Each output sums its feature's S values in token order in accumulate_t<T> (double for float)
/// and divides once; each input value's gradient is its feature's output gradient divided by S.
/// Places: every place (one output value, or one input value, per index).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <class In, class T, class P>
class GlobalAveragePooling1DImpl;
}

/// The mean over the tokens of [tokens, features] examples: [n, S, D] → [n, D]; no variables.
///
/// \code
/// using Head = Sequential<Input<49, 64>, LayerNormalization<>, GlobalAveragePooling1D, Dense<10, Softmax>>;
/// \endcode
struct GlobalAveragePooling1D {
    static constexpr const char* name = "GlobalAveragePooling1D";
    static constexpr const char* keras_name = "global_average_pooling1d";
    template <class In, class T, class P>
    using bind = detail::GlobalAveragePooling1DImpl<In, T, P>;
};

namespace detail {

/// Forward: output (n, d) = Σ_s x[n, s, d] / S, one output value per index.
template <class T>
struct MeanOverTokens {
    const T* x;
    T* y;
    std::int64_t S, D;
    STRATA_HD void operator()(std::int64_t i) const {
        using A = accumulate_t<T>;
        const std::int64_t d = i % D, e = i / D;
        const T* xe = x + e * S * D + d;
        A s = A(0);
        for (std::int64_t t = 0; t < S; ++t) s += A(xe[t * D]);
        y[i] = T(s / A(S));
    }
};
/// Backward: dx[n, s, d] = dy[n, d] / S, one input value per index.
template <class T>
struct MeanOverTokensGrad {
    const T* dy;
    T* dx;
    std::int64_t S, D;
    STRATA_HD void operator()(std::int64_t i) const {
        using A = accumulate_t<T>;
        dx[i] = T(A(dy[i / (S * D) * D + i % D]) / A(S));
    }
};

template <class In, class T, class P>
class GlobalAveragePooling1DImpl {
    static constexpr bool rank_ok = In::rank == 2;
    static_assert(LayerShapeError<GlobalAveragePooling1D, AnyShapeOfRank<2>, In, rank_ok>::value,
                  "strata::nn::GlobalAveragePooling1D: the input must be [tokens, features] per example (rank 2); on an "
                  "image [H, W, C] write GlobalAveragePooling2D");

public:
    using input_shape = In;
    static constexpr std::int64_t S = rank_ok ? In::dims[0] : 1;
    static constexpr std::int64_t D = rank_ok ? In::dims[rank_ok ? 1 : 0] : 1;
    /// (On a malformed input: its last axis, flat, so that the next layers take it: one mistake,
    /// one error.)
    using output_shape = StaticShape<rank_ok ? D : (In::rank >= 1 ? In::dims[In::rank >= 1 ? In::rank - 1 : 0] : 1)>;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        const std::int64_t count = x.dim(0) * D;
        if (count > 0) place::for_each_n<P>(count, MeanOverTokens<T>{x.data(), y.data(), S, D});
    }
    void backward(const T*, T*, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        const std::int64_t count = x.dim(0) * S * D;
        if (!dx.empty() && count > 0) place::for_each_n<P>(count, MeanOverTokensGrad<T>{dy.data(), dx.data(), S, D});
    }
};

}  // namespace detail

}  // namespace strata::nn
