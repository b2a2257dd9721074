#pragma once
/// \file strata/nn/class_token.hpp
/// `ClassToken` and `FirstToken`: the Vision Transformer's class token (Dosovitskiy et al. 2021,
/// after BERT's [class] token): a learned token prepended to the patch tokens, [S, D] →
/// [S + 1, D], whose output after the encoder is the image's representation: `FirstToken` takes
/// it, [S + 1, D] → [D] (what keras_hub's ViT head does with `x[:, 0]`).
///
/// The variable: `class_token/class_token` [1, D] (keras_hub's ViTPatchingAndEmbedding calls its
/// weight `class_token`), initialised at zeros as in Google's vision_transformer (its `cls`
/// parameter, `nn.initializers.zeros`). A position embedding after ClassToken covers S + 1
/// positions. Backward: d class_token = Σ_examples dy[:, 0], dx = dy[:, 1:]; FirstToken's dx is
/// dy at token 0 and zeros elsewhere.
///
/// Places: every place (one value per index; the class token's gradient one feature per index,
/// summed over the examples in order).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <class In, class T, class P>
class ClassTokenImpl;
template <class In, class T, class P>
class FirstTokenImpl;
}  // namespace detail

/// Prepends a learned token to [tokens, features] examples: [S, D] → [S + 1, D].
///
/// \code
/// using Stem = Sequential<Input<28, 28, 1>, PatchEmbedding<4, 64>, ClassToken, PositionEmbedding<>>;   // 50 tokens
/// \endcode
struct ClassToken {
    static constexpr const char* name = "ClassToken";
    static constexpr const char* keras_name = "class_token";
    template <class In, class T, class P>
    using bind = detail::ClassTokenImpl<In, T, P>;
};

/// The first token of [tokens, features] examples: [S, D] → [D] (the class token's output).
struct FirstToken {
    static constexpr const char* name = "FirstToken";
    static constexpr const char* keras_name = "first_token";
    template <class In, class T, class P>
    using bind = detail::FirstTokenImpl<In, T, P>;
};

namespace detail {

/// y[e, 0] = token, y[e, 1 + s] = x[e, s]: one output value per index.
template <class T>
struct PrependToken {
    const T* x;
    const T* token;
    T* y;
    std::int64_t S, D;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t d = i % D, t = i / D % (S + 1), e = i / (D * (S + 1));
        y[i] = t == 0 ? token[d] : x[(e * S + t - 1) * D + d];
    }
};
/// d token[d] = Σ_e dy[e, 0, d]: one feature per index, the examples in order.
template <class T>
struct FirstTokenSum {
    const T* dy;
    T* g;
    std::int64_t n, per_example;
    STRATA_HD void operator()(std::int64_t d) const {
        accumulate_t<T> s = 0;
        for (std::int64_t e = 0; e < n; ++e) s += accumulate_t<T>(dy[e * per_example + d]);
        g[d] = T(s);
    }
};
/// dx[e, s] = dy[e, 1 + s]: one input value per index.
template <class T>
struct DropFirstToken {
    const T* dy;
    T* dx;
    std::int64_t S, D;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t e = i / (S * D), r = i % (S * D);
        dx[i] = dy[e * (S + 1) * D + D + r];
    }
};
/// y[e] = x[e, 0]: one output value per index.
template <class T>
struct TakeFirstToken {
    const T* x;
    T* y;
    std::int64_t S, D;
    STRATA_HD void operator()(std::int64_t i) const { y[i] = x[i / D * S * D + i % D]; }
};
/// dx[e, t] = dy[e] at t = 0, 0 elsewhere: one input value per index.
template <class T>
struct FirstTokenGrad {
    const T* dy;
    T* dx;
    std::int64_t S, D;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t d = i % D, t = i / D % S, e = i / (S * D);
        dx[i] = t == 0 ? dy[e * D + d] : T(0);
    }
};

template <class In, class T, class P>
class ClassTokenImpl {
    static constexpr bool rank_ok = In::rank == 2;
    static_assert(LayerShapeError<ClassToken, AnyShapeOfRank<2>, In, rank_ok>::value,
                  "strata::nn::ClassToken: the input must be [tokens, features] per example (rank 2); after an image write "
                  "PatchEmbedding first");

public:
    static constexpr std::int64_t S = rank_ok ? In::dims[0] : 1;
    // (On a malformed input: tokens of its last axis, so that the next layers take them: one
    // mistake, one error.)
    static constexpr std::int64_t D = In::rank >= 1 ? In::dims[In::rank >= 1 ? In::rank - 1 : 0] : 1;
    using input_shape = In;
    using output_shape = StaticShape<S + 1, D>;
    /// After an Embedding with mask_zero, the class token counts, and the tokens after it carry
    /// the mask as they had it (nn::TokenMask).
    static constexpr TokenMask token_mask = TokenMask::Prepends;
    static constexpr std::int64_t num_params = D;
    static std::vector<ParamInfo> param_info() { return {{"class_token", Shape{1, D}, 0}}; }
    void init(T* params, std::uint64_t, std::uint64_t) const { zeros<T, P>(params, D); }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        const std::int64_t count = x.dim(0) * (S + 1) * D;
        if (count > 0) place::for_each_n<P>(count, PrependToken<T>{x.data(), params, y.data(), S, D});
    }
    void backward(const T*, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        const std::int64_t n = x.dim(0);
        place::for_each_n<P>(D, FirstTokenSum<T>{dy.data(), grads, n, (S + 1) * D});
        if (!dx.empty() && n > 0) place::for_each_n<P>(n * S * D, DropFirstToken<T>{dy.data(), dx.data(), S, D});
    }
};

template <class In, class T, class P>
class FirstTokenImpl {
    static constexpr bool rank_ok = In::rank == 2;
    static_assert(LayerShapeError<FirstToken, AnyShapeOfRank<2>, In, rank_ok>::value,
                  "strata::nn::FirstToken: the input must be [tokens, features] per example (rank 2)");

public:
    static constexpr std::int64_t S = rank_ok ? In::dims[0] : 1;
    static constexpr std::int64_t D = rank_ok ? In::dims[rank_ok ? 1 : 0] : In::size;
    using input_shape = In;
    using output_shape = StaticShape<D>;
    /// Consumes the token mask (nn::TokenMask): it takes token 0, whatever the mask says of it
    /// (after a ClassToken, the class token, which counts).
    static constexpr TokenMask token_mask = TokenMask::Consumes;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        const std::int64_t count = x.dim(0) * D;
        if (count > 0) place::for_each_n<P>(count, TakeFirstToken<T>{x.data(), y.data(), S, D});
    }
    void backward(const T*, T*, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        const std::int64_t count = x.dim(0) * S * D;
        if (!dx.empty() && count > 0) place::for_each_n<P>(count, FirstTokenGrad<T>{dy.data(), dx.data(), S, D});
    }
};

}  // namespace detail

}  // namespace strata::nn
