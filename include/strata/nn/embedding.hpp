#pragma once
/// \file strata/nn/embedding.hpp
/// `Embedding<InputDim, OutputDim>`: Keras' `Embedding(input_dim, output_dim)`, a lookup table
/// that turns each integer token id of a [tokens] example into a row of a learned
/// [InputDim, OutputDim] matrix: [tokens] to [tokens, OutputDim].
///
/// Token ids. strata's model input is float (the data pipeline carries x as float), so ids
/// arrive as floats holding exact integers: float represents every integer up to 2^24
/// (16,777,216), far past any vocabulary here. An id that is not an integer (1.5, NaN) or is
/// outside [0, InputDim) is a strata::ValueError naming the id, its position (example and token
/// of the batch) and the vocabulary size, raised before any row is read. Under a mixed precision
/// policy Network does not round the model's input when its first layer takes integers
/// (`integer_input`, below): bfloat16 keeps integers exactly only up to 256 and float16 up to
/// 2048, so rounding would change the ids.
///
/// The variable is Keras': `embedding/embeddings` [InputDim, OutputDim], initialised from
/// U(-0.05, 0.05) (Keras' default `embeddings_initializer="uniform"`, RandomUniform(-0.05,
/// 0.05)), drawn with the house's Philox generator (strata::random_uniform).
///
/// Backward: d embeddings[v] = Σ over the batch's tokens with id v of dy[token] (a scatter-add);
/// the ids have no gradient (dx, when asked for, is zeros). The sum is deterministic, bit for bit
/// whatever the thread count: the tokens are sorted by id (a counting sort, stable, so each
/// row's tokens stay in batch order), and each row of the gradient is summed by one thread in
/// that order, with no atomics (rows are partitioned among the threads, never a row's tokens).
/// On Cuda the same: one thread per value of the gradient, from the sorted order.
///
/// Padding (Keras' `mask_zero=True`): `Embedding<V, D, EmbeddingOptions{.mask_zero = true}>`
/// makes id 0 padding. The layer still looks its row up (as Keras does), and Network makes the
/// token mask from the model's input (1 where the id is not 0) and hands it to every layer
/// (Mode::token_mask): MultiHeadAttention gives the padded keys weight 0 (a query attends only
/// to the tokens that count; a sequence of padding only attends to nothing and gets 0 before
/// the output projection, where Keras' large negative score would spread its weights evenly
/// over the padding), and GlobalAveragePooling1D averages the tokens that count (0 for a
/// sequence of padding, where Keras divides 0 by 0). So nothing a padded token holds reaches a
/// token that counts, the pooled features, the loss or the gradients (tests/test_embedding.cpp
/// checks it by changing row 0 of the table). As in Keras, ids run over [0, V) with 0 reserved:
/// a vocabulary of V − 1 words. The layers after the Embedding must carry the mask
/// (nn::TokenMask: LayerNormalization, TokenDense, Dropout, ActivationLayer, PositionEmbedding,
/// MultiHeadAttention, TensorParallelMultiHeadAttention and TensorParallelTokenDense, Residual
/// blocks of those; one ClassToken, whose token counts, the layers after it getting the mask with
/// a 1 in front) up to a GlobalAveragePooling1D or FirstToken that consumes it, or up to a per-token output
/// ([tokens, classes], targets one id per token): then Model's SparseCategoricalCrossentropy and
/// accuracy are the means over the tokens that count in each global batch (Keras' masked
/// reduction), the global count summed over the replicas of a step, so that N replicas equal one
/// device. A model that does not compile otherwise names the layer (Keras raises for a layer
/// without supports_masking). The masking Embedding is the model's first layer (the mask comes
/// from its input); a pipeline stage after it and at or before the layer that consumes the mask
/// makes the same mask from the replica's input ids (Network::set_token_ids).
///
/// Not implemented: ids of rank other than 1 per example (a compile-time error; Keras appends
/// the axis to any rank).
///
/// Places: every place. The ids are checked on the host (on Cuda they are copied back once per
/// pass: tokens × 4 or 8 bytes), which also builds the sorted order backward uses.

#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/fwd.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

/// Embedding's options (Keras' arguments): `mask_zero` makes id 0 padding, masked in the layers
/// after it (above).
struct EmbeddingOptions {
    bool mask_zero = false;
};

namespace detail {
template <std::int64_t InputDim, std::int64_t OutputDim, bool MaskZero, class In, class T, class P>
class EmbeddingImpl;
}

/// A lookup table of `InputDim` rows (the vocabulary) of `OutputDim` features: [tokens] integer
/// ids (as floats) to [tokens, OutputDim]. The first layer of a sequence model.
///
/// \code
/// using Lm = Sequential<Input<8>, Embedding<16, 32>, PositionEmbedding<>,
///                       Residual<LayerNormalization<>, MultiHeadAttention<2, 16, 0, MultiHeadAttentionOptions{.causal = true}>>,
///                       TokenDense<16, Softmax>>;   // next-token probabilities over 16 ids
/// \endcode
/// With padding: `Embedding<10001, 64, EmbeddingOptions{.mask_zero = true}>` (10 000 words, id 0
/// the padding), then layers that carry the mask and a GlobalAveragePooling1D.
template <std::int64_t InputDim, std::int64_t OutputDim, EmbeddingOptions Options = EmbeddingOptions{}>
struct Embedding {
    static_assert(InputDim >= 1, "strata::nn::Embedding<InputDim, OutputDim>: InputDim (the vocabulary size: ids are in "
                                 "[0, InputDim)) must be >= 1");
    static_assert(OutputDim >= 1, "strata::nn::Embedding<InputDim, OutputDim>: OutputDim (the features of each id's row) "
                                  "must be >= 1");
    static constexpr const char* name = "Embedding";
    static constexpr const char* keras_name = "embedding";
    static constexpr std::int64_t input_dim = InputDim;
    static constexpr std::int64_t output_dim = OutputDim;
    /// Id 0 is padding, masked in the layers after this one (Keras' mask_zero).
    static constexpr bool mask_zero = Options.mask_zero;
    template <class In, class T, class P>
    using bind = detail::EmbeddingImpl<InputDim, OutputDim, Options.mask_zero, In, T, P>;
};

namespace detail {

/// Whether v is a valid id of a vocabulary of `vocabulary` rows.
template <class T>
bool is_token_id(T v, std::int64_t vocabulary) {
    return v >= T(0) && v < T(vocabulary) && v == std::floor(v);
}

/// y[t, d] = embeddings[ids[t], d]: one value per index, on any place (ids checked before).
template <class T>
struct GatherRows {
    const T* ids;
    const T* e;
    T* y;
    std::int64_t D;
    STRATA_HD void operator()(std::int64_t i) const { y[i] = e[std::int64_t(ids[i / D]) * D + i % D]; }
};

/// g[v, d] = Σ_{k in [start[v], start[v+1])} dy[order[k], d]: one value of the gradient per
/// index, the tokens of row v in the (stable) sorted order, so the sum's order is fixed.
template <class T>
struct ScatterRows {
    const std::int64_t* order;
    const std::int64_t* start;
    const T* dy;
    T* g;
    std::int64_t D;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t v = i / D, d = i % D;
        accumulate_t<T> s = 0;
        for (std::int64_t k = start[v]; k < start[v + 1]; ++k) s += accumulate_t<T>(dy[order[k] * D + d]);
        g[i] = T(s);
    }
};

/// mask[t] = 1 where ids[t] is not 0 (a token that counts), 0 where it is (padding); one value
/// per index, on any place.
template <class T>
struct TokenMaskFromIds {
    const T* ids;
    T* mask;
    STRATA_HD void operator()(std::int64_t t) const { mask[t] = ids[t] != T(0) ? T(1) : T(0); }
};

template <std::int64_t InputDim, std::int64_t OutputDim, bool MaskZero, class In, class T, class P>
class EmbeddingImpl {
    using Spec = Embedding<InputDim, OutputDim, EmbeddingOptions{.mask_zero = MaskZero}>;
    static constexpr bool rank_ok = In::rank == 1;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<1>, In, rank_ok>::value,
                  "strata::nn::Embedding<InputDim, OutputDim>: the input must be [tokens] integer ids per example (rank 1: "
                  "Input<Tokens>); the layer, the shape it expects and the shape it was given are the template arguments of "
                  "LayerShapeError");

public:
    using input_shape = In;
    /// Tokens per example.
    static constexpr std::int64_t S = rank_ok ? In::dims[0] : 1;
    static constexpr std::int64_t V = InputDim;
    static constexpr std::int64_t D = OutputDim;
    using output_shape = StaticShape<S, D>;
    static constexpr std::int64_t num_params = V * D;
    /// The input holds integer ids: a mixed precision policy leaves it as it is.
    static constexpr bool integer_input = true;
    /// Id 0 is padding: Network makes the token mask from this layer's input (Mode::token_mask).
    static constexpr bool mask_zero = MaskZero;
    /// The mask, [n, S] as T on P, of the ids x (Network calls it when mask_zero).
    static void make_token_mask(const TensorView<T, P>& x, T* mask) {
        if (x.size() > 0) place::for_each_n<P>(x.size(), TokenMaskFromIds<T>{x.data(), mask});
    }

    static std::vector<ParamInfo> param_info() { return {{"embeddings", Shape{V, D}, 0}}; }
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const {
        random_uniform(TensorView<T, P>(params, Shape{V * D}), T(-0.05), T(0.05), seed, stream);
    }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        const std::int64_t tokens = x.dim(0) * S;
        if (tokens == 0) return;
        check_ids(host_ids(x), x.dim(0));
        place::for_each_n<P>(tokens * D, GatherRows<T>{x.data(), params, y.data(), D});
    }

    void backward(const T*, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        if (!dx.empty()) fill(dx, T(0));
        const std::int64_t tokens = x.dim(0) * S;
        const T* ids = tokens > 0 ? host_ids(x) : nullptr;
        if (tokens > 0) check_ids(ids, x.dim(0));  // backward may follow a forward on other ids
        // Counting sort of the tokens by id (stable: a row's tokens stay in batch order).
        start_.assign(std::size_t(V + 1), 0);
        order_.resize(std::size_t(tokens));
        for (std::int64_t t = 0; t < tokens; ++t) ++start_[std::size_t(ids[t]) + 1];
        for (std::int64_t v = 0; v < V; ++v) start_[std::size_t(v + 1)] += start_[std::size_t(v)];
        next_.assign(start_.begin(), start_.end() - 1);
        for (std::int64_t t = 0; t < tokens; ++t) order_[std::size_t(next_[std::size_t(ids[t])]++)] = t;
        const std::int64_t* order = order_.data();
        const std::int64_t* start = start_.data();
        if constexpr (!place::host_accessible_v<P>) {
            order_dev_.resize(Shape{tokens > 0 ? tokens : 1});
            start_dev_.resize(Shape{V + 1});
            if (tokens > 0) copy(TensorView<std::int64_t, place::Host>(order_.data(), Shape{tokens}), order_dev_.view().slice(0, tokens));
            copy(TensorView<std::int64_t, place::Host>(start_.data(), Shape{V + 1}), start_dev_.view());
            order = order_dev_.data();
            start = start_dev_.data();
        }
        place::for_each_n<P>(V * D, ScatterRows<T>{order, start, dy.data(), grads, D});
    }

private:
    // The ids where the host can read them: x itself on a host place, a copy otherwise.
    const T* host_ids(const TensorView<T, P>& x) {
        if constexpr (place::host_accessible_v<P>) {
            return x.data();
        } else {
            ids_host_.resize(Shape{x.size()});
            copy(x, ids_host_.view());
            return ids_host_.data();
        }
    }
    // Every id an integer in [0, V), or a ValueError naming the first that is not.
    static void check_ids(const T* ids, std::int64_t n) {
        for (std::int64_t t = 0; t < n * S; ++t) {
            if (!is_token_id(ids[t], V))
                throw_error<ValueError>("Embedding<", V, ", ", D, ">: token id ", double(ids[t]), " at example ", t / S,
                                        ", token ", t % S, " of the batch is not an integer in [0, ", V,
                                        ") (the vocabulary size is ", V, ")");
        }
    }

    std::vector<std::int64_t> start_, next_, order_;  // backward's counting sort (grow-only)
    Tensor<T, place::Host> ids_host_{};                // device places: the ids, copied back
    Tensor<std::int64_t, P> order_dev_{}, start_dev_{};
};

}  // namespace detail

}  // namespace strata::nn
