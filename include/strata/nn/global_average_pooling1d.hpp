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
/// After an Embedding with mask_zero (Mode::token_mask), the mean of the tokens that count
/// (padding skipped; 0 for an example of padding only, where Keras divides 0 by 0), and the
/// padding gets no gradient: the layer consumes the mask (nn::TokenMask).
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

/// Forward: output (n, d) = Σ_s x[n, s, d] / S, one output value per index; with the token mask,
/// the mean of the tokens that count (0 for an example of padding only).
template <class T>
struct MeanOverTokens {
    const T* x;
    T* y;
    std::int64_t S, D;
    const T* mask = nullptr;    // the token mask [n, S], or null: every token counts
    const T* counts = nullptr;  // with a mask: the tokens that count per example [n]
    STRATA_HD void operator()(std::int64_t i) const {
        using A = accumulate_t<T>;
        const std::int64_t d = i % D, e = i / D;
        const T* xe = x + e * S * D + d;
        A s = A(0);
        if (mask) {
            const T* me = mask + e * S;
            for (std::int64_t t = 0; t < S; ++t)
                if (me[t] != T(0)) s += A(xe[t * D]);
            y[i] = counts[e] > T(0) ? T(s / A(counts[e])) : T(0);  // a sequence of padding only: 0
            return;
        }
        for (std::int64_t t = 0; t < S; ++t) s += A(xe[t * D]);
        y[i] = T(s / A(S));
    }
};
/// Backward: dx[n, s, d] = dy[n, d] / S, one input value per index; with the token mask,
/// dy[n, d] / (the tokens that count) for a token that counts, 0 for padding.
template <class T>
struct MeanOverTokensGrad {
    const T* dy;
    T* dx;
    std::int64_t S, D;
    const T* mask = nullptr;
    const T* counts = nullptr;
    STRATA_HD void operator()(std::int64_t i) const {
        using A = accumulate_t<T>;
        const std::int64_t e = i / (S * D);
        if (mask) {
            dx[i] = mask[i / D] != T(0) ? T(A(dy[e * D + i % D]) / A(counts[e])) : T(0);
            return;
        }
        dx[i] = T(A(dy[e * D + i % D]) / A(S));
    }
};
/// The same as MeanOverTokensGrad, one example per index (the host's shape: no divisions per
/// value, which made the per-value form 1.3% of the ViT's step).
template <class T>
struct MeanOverTokensGradByExample {
    const T* dy;
    T* dx;
    std::int64_t S, D;
    const T* mask = nullptr;
    const T* counts = nullptr;
    void operator()(std::int64_t e) const {
        using A = accumulate_t<T>;
        const T* g = dy + e * D;
        T* d = dx + e * S * D;
        for (std::int64_t t = 0; t < S; ++t) {
            const bool counts_here = !mask || mask[e * S + t] != T(0);
            const A div = mask ? A(counts[e]) : A(S);
            for (std::int64_t c = 0; c < D; ++c) d[t * D + c] = counts_here ? T(A(g[c]) / div) : T(0);
        }
    }
};
/// counts[e] = the tokens of example e the mask counts; one example per index.
template <class T>
struct CountTokens {
    const T* mask;
    T* counts;
    std::int64_t S;
    STRATA_HD void operator()(std::int64_t e) const {
        std::int64_t c = 0;
        for (std::int64_t t = 0; t < S; ++t) c += mask[e * S + t] != T(0) ? 1 : 0;
        counts[e] = T(c);
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
    /// Consumes the token mask (nn::TokenMask): the mean of the tokens that count.
    static constexpr TokenMask token_mask = TokenMask::Consumes;
    static constexpr std::int64_t S = rank_ok ? In::dims[0] : 1;
    static constexpr std::int64_t D = rank_ok ? In::dims[rank_ok ? 1 : 0] : 1;
    /// (On a malformed input: its last axis, flat, so that the next layers take it: one mistake,
    /// one error.)
    using output_shape = StaticShape<rank_ok ? D : (In::rank >= 1 ? In::dims[In::rank >= 1 ? In::rank - 1 : 0] : 1)>;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    /// Sizes the per-example token counts a token mask needs (harmless without one).
    void reserve(std::int64_t n, bool) {
        if (n > 0) counts_.resize(Shape{n});
    }

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t count = x.dim(0) * D;
        if (count == 0) return;
        const T* mask = token_mask_of<T>(mode, S, "GlobalAveragePooling1D");
        if (mask) {
            counts_.resize(Shape{x.dim(0)});
            place::for_each_n<P>(x.dim(0), CountTokens<T>{mask, counts_.data(), S});
        }
        place::for_each_n<P>(count, MeanOverTokens<T>{x.data(), y.data(), S, D, mask, mask ? counts_.data() : nullptr});
    }
    void backward(const T*, T*, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t count = x.dim(0) * S * D;
        if (dx.empty() || count == 0) return;
        const T* mask = token_mask_of<T>(mode, S, "GlobalAveragePooling1D");
        if (mask) {  // the counts of this batch's mask (a backward may follow another forward)
            counts_.resize(Shape{x.dim(0)});
            place::for_each_n<P>(x.dim(0), CountTokens<T>{mask, counts_.data(), S});
        }
        if constexpr (std::is_same_v<P, place::Host>)
            place::for_each_n<P>(x.dim(0), MeanOverTokensGradByExample<T>{dy.data(), dx.data(), S, D, mask, mask ? counts_.data() : nullptr});
        else
            place::for_each_n<P>(count, MeanOverTokensGrad<T>{dy.data(), dx.data(), S, D, mask, mask ? counts_.data() : nullptr});
    }

private:
    Tensor<T, P> counts_{};  // with a token mask: the tokens that count per example
};

}  // namespace detail

}  // namespace strata::nn
