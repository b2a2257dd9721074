#pragma once
/// \file strata/nn/position_embedding.hpp
/// `PositionEmbedding<SequenceLength>`: a learned position embedding added to the tokens of
/// [tokens, features] examples, as a Vision Transformer adds one to its patch embeddings
/// (Dosovitskiy et al. 2021, eq. 1: z₀ = [x_p¹E; ...; x_pᴺE] + E_pos).
///
/// The variable is Keras-NLP's (keras_hub.layers.PositionEmbedding): `position_embedding/
/// embeddings` [SequenceLength, features], Glorot-uniform (Keras' default for that layer; fans
/// SequenceLength and features, keras.initializers' compute_fans for a rank-2 shape). An input
/// of S ≤ SequenceLength tokens uses the first S rows, as Keras-NLP's does; the rows past S get
/// a zero gradient. SequenceLength 0 (the default) means exactly the input's tokens.
///
/// One difference: Keras-NLP's layer returns the embeddings broadcast to the input's shape, for
/// the caller to add (`x + PositionEmbedding(S)(x)`); strata's Sequential has no add, so this
/// layer returns x + embeddings itself. Backward: dx = dy, and d embeddings[s] = Σ_examples dy[s].
///
/// Places: every place (one value per index; the gradient is strata::sum over the batch axis).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/layer.hpp"
#include "strata/tensor/reduce.hpp"

namespace strata::nn {

namespace detail {
template <std::int64_t SequenceLength, class In, class T, class P>
class PositionEmbeddingImpl;
}

/// Adds a learned [SequenceLength, features] embedding to [tokens, features] examples
/// (SequenceLength 0: the input's tokens; otherwise at least that many).
///
/// \code
/// using Stem = Sequential<Input<28, 28, 1>, PatchEmbedding<4, 64>, PositionEmbedding<>>;   // 49 × 64 embeddings
/// \endcode
template <std::int64_t SequenceLength = 0>
struct PositionEmbedding {
    static_assert(SequenceLength >= 0, "strata::nn::PositionEmbedding<SequenceLength>: SequenceLength must be >= 1 (or 0: the "
                                       "input's tokens)");
    static constexpr const char* name = "PositionEmbedding";
    static constexpr const char* keras_name = "position_embedding";
    static constexpr std::int64_t sequence_length = SequenceLength;
    template <class In, class T, class P>
    using bind = detail::PositionEmbeddingImpl<SequenceLength, In, T, P>;
};

/// Fails with a message naming the layer, the input's tokens and the embedding's length when the
/// input has more tokens than the embedding has rows (the template arguments of
/// SequenceLengthError<Layer, Tokens, SequenceLength> in the instantiation the compiler prints).
template <class Layer, std::int64_t Tokens, std::int64_t SequenceLength, bool Ok>
struct SequenceLengthError {
    static_assert(Ok, "strata::nn::PositionEmbedding<SequenceLength>: the input has more tokens than the position embedding "
                      "has positions; the layer, the tokens and SequenceLength are the template arguments of "
                      "SequenceLengthError<Layer, Tokens, SequenceLength> (give a SequenceLength >= the tokens, or 0)");
    static constexpr bool value = Ok;
};

namespace detail {

/// y = x + embeddings[i mod (S·D)]: one value per index, on any place.
template <class T>
struct AddPositions {
    const T* x;
    const T* e;
    T* y;
    std::int64_t per_example;
    STRATA_HD void operator()(std::int64_t i) const { y[i] = x[i] + e[i % per_example]; }
};
/// The same, one example per index (the host's shape: the per-value `i % per_example` is a 64-bit
/// division per value, 1% of the ViT's step; a GPU keeps one thread per value).
template <class T>
struct AddPositionsByExample {
    const T* x;
    const T* e;
    T* y;
    std::int64_t per_example;
    void operator()(std::int64_t n) const {
        const T* xr = x + n * per_example;
        T* yr = y + n * per_example;
        for (std::int64_t j = 0; j < per_example; ++j) yr[j] = xr[j] + e[j];
    }
};

template <std::int64_t SequenceLength, class In, class T, class P>
class PositionEmbeddingImpl {
    using Spec = PositionEmbedding<SequenceLength>;
    static constexpr bool rank_ok = In::rank == 2;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<2>, In, rank_ok>::value,
                  "strata::nn::PositionEmbedding: the input must be [tokens, features] per example (rank 2); after an image "
                  "write PatchEmbedding first");

public:
    using input_shape = In;
    /// Carries the token mask (TokenMask): its output has the input's tokens, each from its own.
    static constexpr TokenMask token_mask = TokenMask::Passes;
    using output_shape = In;
    static constexpr std::int64_t S = rank_ok ? In::dims[0] : 1;
    static constexpr std::int64_t D = rank_ok ? In::dims[rank_ok ? 1 : 0] : 1;
    /// Rows of the variable.
    static constexpr std::int64_t L = SequenceLength != 0 ? SequenceLength : S;
    static_assert(SequenceLengthError<Spec, S, SequenceLength, (L >= S)>::value,
                  "strata::nn::PositionEmbedding: more tokens than positions");
    static constexpr std::int64_t num_params = L * D;

    static std::vector<ParamInfo> param_info() { return {{"embeddings", Shape{L, D}, 0}}; }
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const { glorot_uniform<T, P>(params, L * D, L, D, seed, stream); }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        const std::int64_t count = x.dim(0) * S * D;
        if (count == 0) return;
        if constexpr (std::is_same_v<P, place::Host>) place::for_each_n<P>(x.dim(0), AddPositionsByExample<T>{x.data(), params, y.data(), S * D});
        else place::for_each_n<P>(count, AddPositions<T>{x.data(), params, y.data(), S * D});
    }

    void backward(const T*, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        const std::int64_t n = x.dim(0);
        if (n == 0) fill(TensorView<T, P>(grads, Shape{S * D}), T(0));
        else sum(TensorView<T, P>(dy.data(), Shape{n, S * D}), 0, TensorView<T, P>(grads, Shape{S * D}));
        if constexpr (L > S) fill(TensorView<T, P>(grads + S * D, Shape{(L - S) * D}), T(0));
        if (!dx.empty()) copy(dy, dx);
    }
};

}  // namespace detail

}  // namespace strata::nn
