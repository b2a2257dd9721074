#pragma once
/// \file strata/nn/multi_head_attention.hpp
/// `MultiHeadAttention<NumHeads, KeyDim, ValueDim, Options>`: multi-head scaled dot-product
/// self-attention (Vaswani et al., "Attention is all you need", NeurIPS 2017), as Keras'
/// `MultiHeadAttention(num_heads, key_dim, value_dim)` called as `mha(x, x)` (query = value =
/// key = x) with the output projected back to the input's feature size (Keras' default
/// `output_shape`). Per example, x is [S tokens, F features]:
///
///     Q_h = x · Wq_h + bq_h,  K_h = x · Wk_h + bk_h,  V_h = x · Wv_h + bv_h     (h < NumHeads)
///     A_h = softmax(Q_h · K_hᵀ / sqrt(KeyDim))        (over the keys; causal: key j ≤ query i)
///     y   = Σ_h (A_h · V_h) · Wo_h + bo                                        [S, F]
///
/// Variables, Keras' names, shapes and order: `query/kernel` [F, NumHeads, KeyDim],
/// `query/bias` [NumHeads, KeyDim], `key/kernel`, `key/bias` (the same shapes), `value/kernel`
/// [F, NumHeads, ValueDim], `value/bias` [NumHeads, ValueDim], `attention_output/kernel`
/// [NumHeads, ValueDim, F], `attention_output/bias` [F] (no biases with use_bias = false).
/// Kernels start Glorot-uniform with Keras' fans for a kernel of rank 3 (fan_in = shape[-2] ·
/// shape[0], fan_out = shape[-1] · shape[0], keras.initializers' compute_fans), biases at zero.
///
/// The causal mask is Keras' `use_causal_mask=True`: query i attends to keys 0..i only (a
/// masked score gets probability exactly 0, where Keras adds -1e9 before the softmax; the same
/// up to float rounding).
///
/// Computation: the projections are one GEMM each over every token of the batch; the heads are
/// split into [batch · heads, S, D] (one pass, which also adds the bias), the score and
/// weighted-sum products are strided batched GEMMs over batch · heads (one cuBLAS launch each on
/// Cuda, gemm_strided_batched), the softmax one row of scores per index (as strata::softmax).
/// The forward keeps Q, K, V, the attention weights and the merged heads for backward:
/// batch · S · (NumHeads · (2·KeyDim + 2·ValueDim + S) + NumHeads · ValueDim) values, and the
/// buffers backward fills are as many again (sized on the first pass of a batch size, grow-only).
///
/// Dropout on the attention weights (Keras' `dropout`, MultiHeadAttentionOptions::dropout = p):
/// in training, each weight A_h[i, j] is kept with probability 1 − p and scaled by 1 / (1 − p)
/// after the softmax (the softmax itself is not changed), so inference is unchanged. The mask is
/// Dropout's (strata/nn/dropout.hpp): a pure function of (Mode::seed, Mode::step, the layer's
/// stream, the weight's index g in the global batch's [examples, heads, queries, keys]), so a
/// replica's share of the batch draws what one device draws for the same examples, on every
/// place. Backward recomputes it; the dropped weights are kept for dV (batch · NumHeads · S²
/// more values, only with a rate above 0).

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/dropout.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/layer.hpp"
#include "strata/tensor/gemm.hpp"
#include "strata/tensor/reduce.hpp"

namespace strata::nn {

/// MultiHeadAttention's settings, Keras' names and defaults (`causal` is Keras' call argument
/// `use_causal_mask`).
struct MultiHeadAttentionOptions {
    bool use_bias = true;
    bool causal = false;
    double dropout = 0;  ///< on the attention weights, in training (Keras' `dropout`): in [0, 1)
};

namespace detail {
template <class Spec, class In, class T, class P>
class MultiHeadAttentionImpl;
}

/// Padding: after an Embedding with mask_zero (Mode::token_mask), the padded keys get weight 0
/// in every query's softmax (Keras' key mask); a query whose keys are all padding (or all masked
/// with `causal`) gets weights 0 and attends to nothing.
///
/// Self-attention over [tokens, features] examples: `NumHeads` heads of `KeyDim` query/key
/// features and `ValueDim` value features (ValueDim = 0: KeyDim, Keras' default). KeyDim = 0
/// takes features / NumHeads (PyTorch's `nn.MultiheadAttention` head size), which NumHeads must
/// divide.
///
/// \code
/// using Block = Sequential<Input<16, 64>, MultiHeadAttention<4, 16>, ...>;       // 4 heads of 16
/// using Causal = MultiHeadAttention<8, 0, 0, MultiHeadAttentionOptions{.causal = true}>;  // 8 heads of F/8
/// \endcode
template <std::int64_t NumHeads, std::int64_t KeyDim, std::int64_t ValueDim = 0,
          MultiHeadAttentionOptions O = MultiHeadAttentionOptions{}>
struct MultiHeadAttention {
    static_assert(NumHeads >= 1, "strata::nn::MultiHeadAttention<NumHeads, KeyDim>: NumHeads must be >= 1");
    static_assert(KeyDim >= 0, "strata::nn::MultiHeadAttention<NumHeads, KeyDim>: KeyDim must be >= 1 (or 0: features / NumHeads)");
    static_assert(ValueDim >= 0, "strata::nn::MultiHeadAttention<NumHeads, KeyDim, ValueDim>: ValueDim must be >= 1 (or 0: KeyDim)");
    static_assert(O.dropout >= 0 && O.dropout < 1,
                  "strata::nn::MultiHeadAttention: MultiHeadAttentionOptions::dropout is the probability of dropping an attention "
                  "weight in training and must be in [0, 1)");
    static constexpr const char* name = "MultiHeadAttention";
    static constexpr const char* keras_name = "multi_head_attention";
    static constexpr std::int64_t num_heads = NumHeads;
    static constexpr MultiHeadAttentionOptions options = O;
    template <class In, class T, class P>
    using bind = detail::MultiHeadAttentionImpl<MultiHeadAttention, In, T, P>;
};

/// Fails with a message naming the layer, the input's features and the number of heads that
/// does not divide them (the template arguments of AttentionHeadsError<Layer, Features,
/// NumHeads> in the instantiation the compiler prints).
template <class Layer, std::int64_t Features, std::int64_t NumHeads, bool Ok>
struct AttentionHeadsError {
    static_assert(Ok, "strata::nn::MultiHeadAttention<NumHeads, 0>: KeyDim 0 means features / NumHeads, and NumHeads does "
                      "not divide the features; the layer, the features and NumHeads are the template arguments of "
                      "AttentionHeadsError<Layer, Features, NumHeads> (give KeyDim explicitly, or another NumHeads)");
    static constexpr bool value = Ok;
};

namespace detail {

/// [n, S, H, D] (rows of H·D: a projection's output) to [n, H, S, D] (one matrix per head),
/// adding bias[h·D + d] when given; one value per index, on any place.
template <class T>
struct SplitHeads {
    const T* src;
    const T* bias;
    T* dst;
    std::int64_t S, H, D;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t d = i % D, s = i / D % S, h = i / (D * S) % H, e = i / (D * S * H);
        const std::int64_t hd = h * D + d;
        const T v = src[(e * S + s) * H * D + hd];
        dst[i] = bias ? v + bias[hd] : v;
    }
};
/// [n, H, S, D] to [n, S, H, D] (the heads merged into rows of H·D); one value per index.
template <class T>
struct MergeHeads {
    const T* src;
    T* dst;
    std::int64_t S, H, D;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t d = i % D, h = i / D % H, s = i / (D * H) % S, e = i / (D * H * S);
        dst[i] = src[((e * H + h) * S + s) * D + d];
    }
};
/// The same two moves with one index per row of D values (a token's part for one head), for the
/// host: three divisions a row instead of four a value, and a contiguous copy the compiler
/// vectorises. The per-value form took 37% of the ViT's training step on the host (perf: the
/// divisions, not the copy); on a GPU one thread per value keeps the accesses coalesced, so it
/// stays there (split_heads / merge_heads choose). `split`: row j of dst is in [n, H, S] order
/// and comes from [n, S, H] (+ bias[h·D + d] when given); otherwise the other way round.
template <class T>
struct HeadRows {
    const T* src;
    const T* bias;
    T* dst;
    std::int64_t S, H, D;
    bool split;
    STRATA_HD void operator()(std::int64_t j) const {
        const std::int64_t s = split ? j % S : j / H % S, h = split ? j / S % H : j % H, e = j / (S * H);
        const T* from = src + (split ? (e * S + s) * H + h : (e * H + h) * S + s) * D;
        T* to = dst + j * D;
        if (bias) {
            const T* b = bias + h * D;
            for (std::int64_t d = 0; d < D; ++d) to[d] = from[d] + b[d];
        } else {
            for (std::int64_t d = 0; d < D; ++d) to[d] = from[d];
        }
    }
};
/// `tokens` = n·S rows of H·D values [n, S, H, D] to [n, H, S, D] (+ bias[h·D + d] when given),
/// in the shape that suits the place.
template <class P, class T>
void split_heads(std::int64_t tokens, const T* src, const T* bias, T* dst, std::int64_t S, std::int64_t H, std::int64_t D) {
    if constexpr (std::is_same_v<P, place::Host>) place::for_each_n<P>(tokens * H, HeadRows<T>{src, bias, dst, S, H, D, true});
    else place::for_each_n<P>(tokens * H * D, SplitHeads<T>{src, bias, dst, S, H, D});
}
/// [n, H, S, D] to [n, S, H, D], `tokens` = n·S, in the shape that suits the place.
template <class P, class T>
void merge_heads(std::int64_t tokens, const T* src, T* dst, std::int64_t S, std::int64_t H, std::int64_t D) {
    if constexpr (std::is_same_v<P, place::Host>) place::for_each_n<P>(tokens * H, HeadRows<T>{src, nullptr, dst, S, H, D, false});
    else place::for_each_n<P>(tokens * H * D, MergeHeads<T>{src, dst, S, H, D});
}
/// Masks row r's keys in place before its softmax: the scores of the keys the token mask marks
/// as padding (key_mask [n, S], the row's example e = r / (heads · S)) become −inf; returns
/// whether any of its first `valid` keys counts. Without a mask, true.
template <class T>
STRATA_HD inline bool mask_keys(T* row, std::int64_t r, std::int64_t valid, std::int64_t S, const T* key_mask, std::int64_t heads) {
    if (!key_mask) return true;
    const T* km = key_mask + r / (heads * S) * S;
    bool any = false;
    for (std::int64_t j = 0; j < valid; ++j) {
        if (km[j] == T(0)) row[j] = -T(INFINITY);
        else any = true;
    }
    if (!any)
        for (std::int64_t j = 0; j < S; ++j) row[j] = T(0);  // nothing to attend to: weights 0, output 0
    return any;
}
/// Softmax of one row of scores per index, in place; row r is query r % S; with `causal` its
/// keys after the query get probability 0, and with a token mask (key_mask [n, S], `heads`
/// heads per example in the buffer) the padded keys too (a row with no key left: all 0).
/// Accumulated in accumulate_t (double for float).
template <class T>
struct AttentionSoftmaxRows {
    T* a;
    std::int64_t S;
    bool causal;
    const T* key_mask = nullptr;
    std::int64_t heads = 1;
    STRATA_HD void operator()(std::int64_t r) const {
        T* row = a + r * S;
        const std::int64_t valid = causal ? r % S + 1 : S;
        if (!mask_keys(row, r, valid, S, key_mask, heads)) return;
        T m = row[0];
        for (std::int64_t j = 1; j < valid; ++j) m = row[j] > m ? row[j] : m;
        accumulate_t<T> s = 0;
        for (std::int64_t j = 0; j < valid; ++j) {
            using std::exp;
            const T e = exp(row[j] - m);
            row[j] = e;
            s += e;
        }
        const T inv = T(1.0 / double(s));
        for (std::int64_t j = 0; j < valid; ++j) row[j] *= inv;
        for (std::int64_t j = valid; j < S; ++j) row[j] = T(0);
    }
};
/// The host's float rows through the eight lanes (strata/nn/gelu_simd.hpp, softmax_row_simd).
struct AttentionSoftmaxRowsSimd {
    float* a;
    std::int64_t S;
    bool causal;
    const float* key_mask = nullptr;
    std::int64_t heads = 1;
    void operator()(std::int64_t r) const {
        const std::int64_t valid = causal ? r % S + 1 : S;
        if (mask_keys(a + r * S, r, valid, S, key_mask, heads)) softmax_row_simd(a + r * S, valid, S);
    }
};
/// The attention's softmax over `rows` rows of S scores, in place, in the shape that suits the
/// place: eight lanes for float on a host built for them, one row per index otherwise. With a
/// token mask, key_mask is [n, S] and `heads` the heads per example in the buffer.
template <class P, class T>
void attention_softmax_rows(T* a, std::int64_t rows, std::int64_t S, bool causal, const T* key_mask = nullptr, std::int64_t heads = 1) {
    if constexpr (gelu_simd && std::is_same_v<T, float> && std::is_same_v<P, place::Host>)
        place::for_each_n<P>(rows, AttentionSoftmaxRowsSimd{a, S, causal, key_mask, heads});
    else
        place::for_each_n<P>(rows, AttentionSoftmaxRows<T>{a, S, causal, key_mask, heads});
}
/// Softmax backward of one row per index, in place: dS = A ⊙ (dA − Σ_j dA_j A_j) (masked
/// entries have A = 0, so 0).
template <class T>
struct AttentionSoftmaxGradRows {
    const T* a;
    T* da;
    std::int64_t S;
    STRATA_HD void operator()(std::int64_t r) const {
        const T* ar = a + r * S;
        T* d = da + r * S;
        accumulate_t<T> s = 0;
        for (std::int64_t j = 0; j < S; ++j) s += accumulate_t<T>(d[j]) * accumulate_t<T>(ar[j]);
        for (std::int64_t j = 0; j < S; ++j) d[j] = T(accumulate_t<T>(ar[j]) * (accumulate_t<T>(d[j]) - s));
    }
};

template <class Spec, class In>
constexpr std::int64_t attention_features() {
    if constexpr (In::rank == 2) return In::dims[1];
    else return 1;
}
template <class Spec, class In>
constexpr std::int64_t attention_tokens() {
    if constexpr (In::rank == 2) return In::dims[0];
    else return 1;
}

template <std::int64_t NumHeads, std::int64_t KeyDim, std::int64_t ValueDim, MultiHeadAttentionOptions O, class In, class T, class P>
class MultiHeadAttentionImpl<MultiHeadAttention<NumHeads, KeyDim, ValueDim, O>, In, T, P> {
    using Spec = MultiHeadAttention<NumHeads, KeyDim, ValueDim, O>;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<2>, In, In::rank == 2>::value,
                  "strata::nn::MultiHeadAttention: the input must be [tokens, features] per example (rank 2): "
                  "Input<Tokens, Features>, or a layer giving that shape");

public:
    using input_shape = In;
    /// Uses the token mask (nn::TokenMask): padded keys get weight 0; every token's output has
    /// the input's place, so the mask carries on past the layer.
    static constexpr TokenMask token_mask = TokenMask::Passes;
    using output_shape = In;
    static constexpr std::int64_t S = attention_tokens<Spec, In>();
    static constexpr std::int64_t F = attention_features<Spec, In>();
    static constexpr std::int64_t H = NumHeads;
    static_assert(AttentionHeadsError<Spec, F, NumHeads, (KeyDim != 0 || F % NumHeads == 0)>::value,
                  "strata::nn::MultiHeadAttention: NumHeads does not divide the features (KeyDim 0)");
    static constexpr std::int64_t Dk = KeyDim != 0 ? KeyDim : (F / NumHeads > 0 ? F / NumHeads : 1);
    static constexpr std::int64_t Dv = ValueDim != 0 ? ValueDim : Dk;
    static constexpr bool bias = O.use_bias;
    /// Whether training drops attention weights (MultiHeadAttentionOptions::dropout > 0).
    static constexpr bool drops = O.dropout > 0;
    /// ceil(dropout · 2^24): a weight is kept when its 24 random bits reach it (as Dropout's).
    static constexpr std::uint32_t dropout_threshold = [] {
        const double t = O.dropout * 16777216.0;
        auto u = std::uint64_t(t);
        if (double(u) < t) ++u;
        return std::uint32_t(u);
    }();
    // Offsets in the layer's block, Keras' order.
    static constexpr std::int64_t q_kernel = 0, q_bias = q_kernel + F * H * Dk;
    static constexpr std::int64_t k_kernel = q_bias + (bias ? H * Dk : 0), k_bias = k_kernel + F * H * Dk;
    static constexpr std::int64_t v_kernel = k_bias + (bias ? H * Dk : 0), v_bias = v_kernel + F * H * Dv;
    static constexpr std::int64_t o_kernel = v_bias + (bias ? H * Dv : 0), o_bias = o_kernel + H * Dv * F;
    static constexpr std::int64_t num_params = o_bias + (bias ? F : 0);

    static std::vector<ParamInfo> param_info() {
        std::vector<ParamInfo> p{{"query/kernel", Shape{F, H, Dk}, q_kernel}};
        if (bias) p.push_back({"query/bias", Shape{H, Dk}, q_bias});
        p.push_back({"key/kernel", Shape{F, H, Dk}, k_kernel});
        if (bias) p.push_back({"key/bias", Shape{H, Dk}, k_bias});
        p.push_back({"value/kernel", Shape{F, H, Dv}, v_kernel});
        if (bias) p.push_back({"value/bias", Shape{H, Dv}, v_bias});
        p.push_back({"attention_output/kernel", Shape{H, Dv, F}, o_kernel});
        if (bias) p.push_back({"attention_output/bias", Shape{F}, o_bias});
        return p;
    }

    /// Glorot-uniform kernels with Keras' fans (see the file comment), each from its own stream
    /// (the layer's stream + 0..3: a Network spaces its layers' streams 16 apart); zero biases.
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const {
        glorot_uniform<T, P>(params + q_kernel, F * H * Dk, H * F, Dk * F, seed, stream);
        glorot_uniform<T, P>(params + k_kernel, F * H * Dk, H * F, Dk * F, seed, stream + 1);
        glorot_uniform<T, P>(params + v_kernel, F * H * Dv, H * F, Dv * F, seed, stream + 2);
        glorot_uniform<T, P>(params + o_kernel, H * Dv * F, Dv * H, F * H, seed, stream + 3);
        if (bias) {
            zeros<T, P>(params + q_bias, H * Dk);
            zeros<T, P>(params + k_bias, H * Dk);
            zeros<T, P>(params + v_bias, H * Dv);
            zeros<T, P>(params + o_bias, F);
        }
    }

    void reserve(std::int64_t n, bool) { size_buffers(n); }

    /// The stream that separates this layer's dropout masks from other layers' (a Network sets
    /// it to the layer's index × 16, as init's); only with a dropout rate above 0, so that a Model
    /// knows the layer draws random numbers.
    void set_stream(std::uint64_t stream)
        requires drops
    {
        stream_ = stream;
    }
    std::uint64_t stream() const { return stream_; }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        n_ = n;
        if (n == 0) return;
        size_buffers(n);
        T* w = const_cast<T*>(params);
        const std::int64_t rows = n * S, nh = n * H;
        const TensorView<T, P> xm(x.data(), Shape{rows, F});
        project(xm, w + q_kernel, bias ? params + q_bias : nullptr, Dk, q_.data());
        project(xm, w + k_kernel, bias ? params + k_bias : nullptr, Dk, k_.data());
        project(xm, w + v_kernel, bias ? params + v_bias : nullptr, Dv, v_.data());
        // Scores, softmax, weighted values: per (example, head).
        gemm_strided_batched<T, P>(Trans::No, Trans::Yes, S, S, Dk, T(scale()), q_.data(), Dk, S * Dk, k_.data(), Dk, S * Dk, T(0),
                                   a_.data(), S, S * S, nh);
        attention_softmax_rows<P>(a_.data(), nh * S, S, O.causal, token_mask_of<T>(mode, S, "MultiHeadAttention"), H);
        dropped_ = drops && mode.training;
        if (dropped_) drop(a_.data(), ad_.data(), nh * S * S, mode);  // the weights the values are summed with
        gemm_strided_batched<T, P>(Trans::No, Trans::No, S, Dv, S, T(1), weights(), S, S * S, v_.data(), Dv, S * Dv, T(0), o_.data(), Dv,
                                   S * Dv, nh);
        merge_heads<P>(rows, o_.data(), merged_.data(), S, H, Dv);
        const TensorView<T, P> ym(y.data(), Shape{rows, F});
        gemm(Trans::No, Trans::No, T(1), merged_.view(), TensorView<T, P>(w + o_kernel, Shape{H * Dv, F}), T(0), ym);
        if (bias) bias_activation<Linear>(ym, params + o_bias, F, false);
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        STRATA_CHECK(n == n_, ValueError, "MultiHeadAttention: backward on ", n,
                     " examples needs the attention weights of a forward on the same batch; the last forward had ", n_);
        if (n == 0) {
            fill(TensorView<T, P>(grads, Shape{num_params}), T(0));
            return;
        }
        T* w = const_cast<T*>(params);
        const std::int64_t rows = n * S, nh = n * H;
        const TensorView<T, P> xm(x.data(), Shape{rows, F}), dym(dy.data(), Shape{rows, F});
        // The output projection.
        if (bias) sum(dym, 0, TensorView<T, P>(grads + o_bias, Shape{F}));
        gemm(Trans::Yes, Trans::No, T(1), merged_.view(), dym, T(0), TensorView<T, P>(grads + o_kernel, Shape{H * Dv, F}));
        const TensorView<T, P> dmerged(rows_.data(), Shape{rows, H * Dv});
        gemm(Trans::No, Trans::Yes, T(1), dym, TensorView<T, P>(w + o_kernel, Shape{H * Dv, F}), T(0), dmerged);
        split_heads<P>(rows, rows_.data(), static_cast<const T*>(nullptr), do_.data(), S, H, Dv);
        // Through the weighted sum and the softmax: dA = dO · Vᵀ, dV = Aᵀ · dO, dS = softmax'(dA)
        // (with dropout, A is the dropped weights in dV, and dA goes back through the same mask).
        STRATA_CHECK(dropped_ == (drops && mode.training), ValueError, "MultiHeadAttention: backward in ",
                     mode.training ? "training" : "inference", " mode after a forward in ", dropped_ ? "training" : "inference",
                     " mode: the attention dropout must be the forward's");
        gemm_strided_batched<T, P>(Trans::No, Trans::Yes, S, S, Dv, T(1), do_.data(), Dv, S * Dv, v_.data(), Dv, S * Dv, T(0), da_.data(), S,
                                   S * S, nh);
        gemm_strided_batched<T, P>(Trans::Yes, Trans::No, S, Dv, S, T(1), weights(), S, S * S, do_.data(), Dv, S * Dv, T(0), dv_.data(), Dv,
                                   S * Dv, nh);
        if (dropped_) drop(da_.data(), da_.data(), nh * S * S, mode);
        place::for_each_n<P>(nh * S, AttentionSoftmaxGradRows<T>{a_.data(), da_.data(), S});
        // Through the scaled scores: dQ = c · dS · K, dK = c · dSᵀ · Q.
        gemm_strided_batched<T, P>(Trans::No, Trans::No, S, Dk, S, T(scale()), da_.data(), S, S * S, k_.data(), Dk, S * Dk, T(0), dq_.data(),
                                   Dk, S * Dk, nh);
        gemm_strided_batched<T, P>(Trans::Yes, Trans::No, S, Dk, S, T(scale()), da_.data(), S, S * S, q_.data(), Dk, S * Dk, T(0),
                                   dk_.data(), Dk, S * Dk, nh);
        // Through the three projections; dx sums their input gradients.
        const bool want_dx = !dx.empty();
        const TensorView<T, P> dxm(want_dx ? dx.data() : nullptr, Shape{rows, F});
        project_back(xm, w + q_kernel, dq_.data(), Dk, grads + q_kernel, bias ? grads + q_bias : nullptr, want_dx, dxm, false);
        project_back(xm, w + k_kernel, dk_.data(), Dk, grads + k_kernel, bias ? grads + k_bias : nullptr, want_dx, dxm, true);
        project_back(xm, w + v_kernel, dv_.data(), Dv, grads + v_kernel, bias ? grads + v_bias : nullptr, want_dx, dxm, true);
    }

    /// out = in ⊙ mask / (1 − p) over `count` attention weights [n, hc, S, S] of heads
    /// [h0, h0 + hc) (in place when out == in): weight i is the global batch's
    /// (first_example + i / (hc·S²))·H·S² + h0·S² + i % (hc·S²), drawn as Dropout draws, so that
    /// a tensor-parallel shard holding some of the heads draws this layer's mask for them.
    static void drop_heads(const T* in, T* out, std::int64_t count, std::int64_t h0, std::int64_t hc, const Mode& mode,
                           std::uint64_t stream) {
        const auto offset = std::uint64_t(mode.first_example) * std::uint64_t(H * S * S) + std::uint64_t(h0 * S * S);
        place::for_each_n<P>(count, DropoutElements<T>{in, out, offset, mode.seed, mode.step, dropout_counter_base(stream),
                                                       dropout_threshold, T(1.0 / (1.0 - O.dropout)), hc * S * S, H * S * S});
    }

    /// The last forward's attention weights, [n, NumHeads, S queries, S keys] (for tests).
    std::vector<T> attention_weights() const {
        std::vector<T> out(std::size_t(n_ * H * S * S));
        if (n_ > 0) copy(TensorView<T, P>(const_cast<T*>(a_.data()), Shape{n_ * H * S * S}), TensorView<T, place::Host>(out.data(), Shape{n_ * H * S * S}));
        return out;
    }

private:
    static constexpr double scale() { return 1.0 / std::sqrt(double(Dk)); }

    // The weights the values are summed with: the dropped ones after a forward in training.
    const T* weights() const { return dropped_ ? ad_.data() : a_.data(); }
    void drop(const T* in, T* out, std::int64_t count, const Mode& mode) const { drop_heads(in, out, count, 0, H, mode, stream_); }

    // x [rows, F] · kernel [F, H·D] (+ bias), split into heads: out [n·H, S, D].
    void project(const TensorView<T, P>& xm, T* kernel, const T* b, std::int64_t D, T* out) {
        const std::int64_t rows = xm.dim(0);
        const TensorView<T, P> raw(rows_.data(), Shape{rows, H * D});
        gemm(Trans::No, Trans::No, T(1), xm, TensorView<T, P>(kernel, Shape{F, H * D}), T(0), raw);
        split_heads<P>(rows, rows_.data(), b, out, S, H, D);
    }
    // The gradients of one projection from its heads' gradient dh [n·H, S, D]: kernel, bias, and
    // dx (+)= dh_merged · kernelᵀ.
    void project_back(const TensorView<T, P>& xm, T* kernel, const T* dh, std::int64_t D, T* dkernel, T* dbias, bool want_dx,
                      const TensorView<T, P>& dxm, bool accumulate) {
        const std::int64_t rows = xm.dim(0);
        const TensorView<T, P> g(rows_.data(), Shape{rows, H * D});
        merge_heads<P>(rows, dh, rows_.data(), S, H, D);
        if (dbias) sum(g, 0, TensorView<T, P>(dbias, Shape{H * D}));
        gemm(Trans::Yes, Trans::No, T(1), xm, g, T(0), TensorView<T, P>(dkernel, Shape{F, H * D}));
        if (want_dx) gemm(Trans::No, Trans::Yes, T(1), g, TensorView<T, P>(kernel, Shape{F, H * D}), T(accumulate ? 1 : 0), dxm);
    }

    void size_buffers(std::int64_t n) {
        const std::int64_t rows = n * S, nh = n * H;
        rows_.resize(Shape{rows, H * (Dk > Dv ? Dk : Dv)});
        q_.resize(Shape{nh, S, Dk});
        k_.resize(Shape{nh, S, Dk});
        v_.resize(Shape{nh, S, Dv});
        a_.resize(Shape{nh, S, S});
        if constexpr (drops) ad_.resize(Shape{nh, S, S});
        o_.resize(Shape{nh, S, Dv});
        merged_.resize(Shape{rows, H * Dv});
        do_.resize(Shape{nh, S, Dv});
        da_.resize(Shape{nh, S, S});
        dq_.resize(Shape{nh, S, Dk});
        dk_.resize(Shape{nh, S, Dk});
        dv_.resize(Shape{nh, S, Dv});
    }

    // rows_: a projection's [rows, H·D] before the split (and its gradient after the merge).
    // ad_: the attention weights after dropout (only with a rate above 0).
    Tensor<T, P> rows_, q_, k_, v_, a_, ad_, o_, merged_, do_, da_, dq_, dk_, dv_;
    std::int64_t n_ = 0;
    bool dropped_ = false;         // the last forward dropped weights (training, rate > 0)
    std::uint64_t stream_ = 0;     // set_stream's (dropout masks)
};

}  // namespace detail

}  // namespace strata::nn
