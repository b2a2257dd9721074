#pragma once
/// \file strata/nn/token_dense.hpp
/// `TokenDense<Units, Act, UseBias>`: a Dense layer applied to the last axis of each example,
/// every token (every position of the other axes) with the same kernel: [tokens, features] to
/// [tokens, Units]. What Keras' `Dense` does by itself on an input of rank > 2, and the MLP of
/// a transformer block.
///
/// Why a layer of its own: `Dense` refuses an unflattened input on purpose (a Dense straight
/// after a convolution, without Flatten, is almost always a mistake, and the compile-time error
/// says so: tests/compile_fail/dense_on_unflattened_input.cpp). Writing `TokenDense` says that
/// applying the kernel per token is meant. Variables and initialisation are Dense's, under
/// Keras' names (`dense/kernel` [features, Units], `dense/bias` [Units]): a Keras model with
/// `Dense` on a sequence has the same variables.

#include <cstdint>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/dense.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <std::int64_t Units, class Act, bool UseBias, class In, class T, class P>
class TokenDenseImpl;
}

/// Dense on the last axis of [..., features] examples (rank 2 or more).
///
/// \code
/// using Mlp = Residual<LayerNormalization<>, TokenDense<64, GELU>, TokenDense<32>>;   // on Input<16, 32>
/// \endcode
template <std::int64_t Units, class Act = Linear, bool UseBias = true>
struct TokenDense {
    static_assert(Units >= 1, "strata::nn::TokenDense<Units>: Units must be >= 1");
    static_assert(Activation<Act>, "strata::nn::TokenDense<Units, Act>: Act must be an activation (Linear, ReLU, Sigmoid, Tanh, "
                                   "Softmax, GELU, GELUTanh)");
    static constexpr const char* name = "TokenDense";
    static constexpr const char* keras_name = "dense";
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::TokenDenseImpl<Units, Act, UseBias, In, T, P>;
};

namespace detail {

template <class In, std::int64_t Last>
struct ReplaceLast {
    using type = In;
};
template <std::int64_t A, std::int64_t... D, std::int64_t Last>
    requires(sizeof...(D) >= 1)
struct ReplaceLast<StaticShape<A, D...>, Last> {
    template <std::size_t... I>
    static auto make(std::index_sequence<I...>) -> StaticShape<StaticShape<A, D...>::dims[I]..., Last>;
    using type = decltype(make(std::make_index_sequence<sizeof...(D)>{}));
};

template <std::int64_t Units, class Act, bool UseBias, class In, class T, class P>
class TokenDenseImpl {
    static_assert(LayerShapeError<TokenDense<Units, Act, UseBias>, AnyShapeOfRank<2>, In, (In::rank >= 2)>::value,
                  "strata::nn::TokenDense: the input must have a token axis and a feature axis (rank >= 2 per example); "
                  "on a flat input write Dense");
    static constexpr std::int64_t C = In::rank >= 1 ? In::dims[In::rank >= 1 ? In::rank - 1 : 0] : 1;
    using Inner = DenseImpl<Units, Act, UseBias, StaticShape<C>, T, P>;

public:
    using input_shape = In;
    /// Carries the token mask (TokenMask): its output has the input's tokens, each from its own.
    static constexpr TokenMask token_mask = TokenMask::Passes;
    using output_shape = typename ReplaceLast<In, Units>::type;
    /// Tokens per example: the positions that share the kernel.
    static constexpr std::int64_t tokens = In::size / C;
    static constexpr std::int64_t num_params = Inner::num_params;

    static std::vector<ParamInfo> param_info() { return Inner::param_info(); }
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const { inner_.init(params, seed, stream); }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t rows = x.dim(0) * tokens;
        inner_.forward(params, TensorView<T, P>(x.data(), Shape{rows, C}), TensorView<T, P>(y.data(), Shape{rows, Units}), mode);
    }
    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t rows = x.dim(0) * tokens;
        inner_.backward(params, grads, TensorView<T, P>(x.data(), Shape{rows, C}), TensorView<T, P>(y.data(), Shape{rows, Units}),
                        TensorView<T, P>(dy.data(), Shape{rows, Units}),
                        dx.empty() ? TensorView<T, P>() : TensorView<T, P>(dx.data(), Shape{rows, C}), mode);
    }

private:
    Inner inner_;
};

}  // namespace detail

}  // namespace strata::nn
