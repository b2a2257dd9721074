#pragma once
/// \file strata/distribute/tensor_parallel_attention.hpp
/// Tensor-parallel self-attention: `TensorParallelMultiHeadAttention<NumHeads, KeyDim, ValueDim,
/// Shards, Options>` is `nn::MultiHeadAttention` with its heads split over `Shards` threads (over
/// logical devices when at least `Shards` are configured), as Megatron-LM splits a transformer's
/// attention (Shoeybi et al. 2019, "Megatron-LM", §3 and its Figure 3b):
///
/// | part                    | shard j holds                              | communication                      |
/// |-------------------------|--------------------------------------------|------------------------------------|
/// | query/key/value kernels | the columns of its heads (column-parallel)  | none: every shard reads all of x   |
/// | scores, softmax, A·V    | its heads, whole                            | none                               |
/// | output kernel           | the rows of its heads (row-parallel)        | forward: **one sum** of the partial outputs |
/// | input gradient          | its heads' part of dx                       | backward: **one sum** of the parts  |
///
/// Heads are split as evenly as possible, the first shards one head more (1 <= Shards <=
/// NumHeads). The layer is a drop-in for MultiHeadAttention: the same variables, flat layout,
/// names (`query/kernel` … `attention_output/bias`) and initial values, so checkpoints are
/// interchangeable and training equals the unsplit layer up to the order of the sums over heads
/// (tests/test_tensor_parallel.cpp: float64 to 1e-12). The output bias is added once, after the
/// sum. Attention dropout draws MultiHeadAttention's mask: the mask of a weight is a function of
/// its index in the global batch's [examples, heads, queries, keys], which a shard computes for
/// its heads. The variables stay in the model's flat buffer; each shard gathers the kernel
/// columns it multiplies (the output kernel's rows of a shard are contiguous and read in place)
/// and scatters its kernel gradients back, so what is split is the compute and the
/// activations, each shard's on its device.
///
/// \code
/// using Block = Residual<LayerNormalization<>, distribute::TensorParallelMultiHeadAttention<4, 16, 0, 2>>;
/// \endcode

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/distribute/tensor_parallel.hpp"
#include "strata/nn/multi_head_attention.hpp"

namespace strata::distribute {

namespace detail {
template <class Spec, class In, class T, class P>
class TensorParallelMultiHeadAttentionImpl;
}

/// MultiHeadAttention<NumHeads, KeyDim, ValueDim, Options> with its heads split over `Shards`
/// threads/devices; see the file comment.
template <std::int64_t NumHeads, std::int64_t KeyDim, std::int64_t ValueDim, int Shards,
          nn::MultiHeadAttentionOptions O = nn::MultiHeadAttentionOptions{}>
struct TensorParallelMultiHeadAttention {
    static_assert(Shards >= 1, "strata::distribute::TensorParallelMultiHeadAttention<NumHeads, KeyDim, ValueDim, Shards>: Shards "
                               "must be >= 1");
    static_assert(Shards <= NumHeads, "strata::distribute::TensorParallelMultiHeadAttention<NumHeads, KeyDim, ValueDim, Shards>: "
                                      "more shards than heads (a shard holds whole heads)");
    using unsplit = nn::MultiHeadAttention<NumHeads, KeyDim, ValueDim, O>;  // checks the other arguments
    static constexpr const char* name = "TensorParallelMultiHeadAttention";
    static constexpr const char* keras_name = "multi_head_attention";  // its variables are MultiHeadAttention's
    static constexpr std::int64_t num_heads = NumHeads;
    static constexpr int shards = Shards;
    static constexpr nn::MultiHeadAttentionOptions options = O;
    template <class In, class T, class P>
    using bind = detail::TensorParallelMultiHeadAttentionImpl<TensorParallelMultiHeadAttention, In, T, P>;
};

namespace detail {

template <std::int64_t NumHeads, std::int64_t KeyDim, std::int64_t ValueDim, int Shards, nn::MultiHeadAttentionOptions O, class In,
          class T, class P>
class TensorParallelMultiHeadAttentionImpl<TensorParallelMultiHeadAttention<NumHeads, KeyDim, ValueDim, Shards, O>, In, T, P> {
    using Spec = TensorParallelMultiHeadAttention<NumHeads, KeyDim, ValueDim, Shards, O>;
    using Plain = typename Spec::unsplit::template bind<In, T, P>;  // the layout, the initialisation, the shapes' checks

public:
    using input_shape = In;
    /// Uses the token mask as MultiHeadAttention does (nn::TokenMask).
    static constexpr nn::TokenMask token_mask = nn::TokenMask::Passes;
    using output_shape = In;
    static constexpr std::int64_t S = Plain::S, F = Plain::F, H = Plain::H, Dk = Plain::Dk, Dv = Plain::Dv;
    static constexpr bool bias = Plain::bias, drops = Plain::drops;
    static constexpr std::int64_t num_params = Plain::num_params;

    static std::vector<nn::ParamInfo> param_info() { return Plain::param_info(); }
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const { Plain().init(params, seed, stream); }

    /// The dropout masks' stream, as MultiHeadAttention's (only with a dropout rate above 0).
    void set_stream(std::uint64_t stream)
        requires drops
    {
        stream_ = stream;
    }
    std::uint64_t stream() const { return stream_; }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const nn::Mode& mode) {
        const std::int64_t n = x.dim(0);
        n_ = n;
        dropped_ = drops && mode.training;
        if (n == 0) return;
        const std::int64_t rows = n * S;
        const TensorView<T, P> xm(x.data(), Shape{rows, F});
        const T* key_mask = nn::token_mask_of<T>(mode, S, "TensorParallelMultiHeadAttention");
        run([&](int j) {
            Shard& s = shards_[std::size_t(j)];
            const auto [h0, hc] = part(j);
            const std::int64_t nh = n * hc;
            s.size(n, hc);
            project(s, xm, params, Plain::q_kernel, Plain::q_bias, Dk, h0, hc, s.wq, s.q);
            project(s, xm, params, Plain::k_kernel, Plain::k_bias, Dk, h0, hc, s.wk, s.k);
            project(s, xm, params, Plain::v_kernel, Plain::v_bias, Dv, h0, hc, s.wv, s.v);
            gemm_strided_batched<T, P>(Trans::No, Trans::Yes, S, S, Dk, T(scale()), s.q.data(), Dk, S * Dk, s.k.data(), Dk, S * Dk,
                                       T(0), s.a.data(), S, S * S, nh);
            nn::detail::attention_softmax_rows<P>(s.a.data(), nh * S, S, O.causal, key_mask, hc);
            if (dropped_) drop(s.a.data(), s.ad.data(), nh * S * S, h0, hc, mode);
            gemm_strided_batched<T, P>(Trans::No, Trans::No, S, Dv, S, T(1), weights(s), S, S * S, s.v.data(), Dv, S * Dv, T(0),
                                       s.o.data(), Dv, S * Dv, nh);
            nn::detail::merge_heads<P>(rows, s.o.data(), s.merged.data(), S, hc, Dv);
            // This shard's part of the output: its heads times their rows of the output kernel.
            gemm(Trans::No, Trans::No, T(1), s.merged.view(),
                 TensorView<T, P>(const_cast<T*>(params) + Plain::o_kernel + h0 * Dv * F, Shape{hc * Dv, F}), T(0), s.y.view());
            P::synchronize();
        });
        // The sum over shards, in shard order (the same sum every run), then the bias once.
        const TensorView<T, P> ym(y.data(), Shape{rows, F});
        sum_over_shards(pool_, Shards, [&](int j) { return shards_[std::size_t(j)].y.view(); }, ym, "tensor-parallel attention forward");
        if (bias) nn::bias_activation<nn::Linear>(ym, params + Plain::o_bias, F, false);
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const nn::Mode& mode) {
        const std::int64_t n = x.dim(0);
        STRATA_CHECK(n == n_, ValueError, "TensorParallelMultiHeadAttention: backward on ", n,
                     " examples needs the attention weights of a forward on the same batch; the last forward had ", n_);
        STRATA_CHECK(dropped_ == (drops && mode.training), ValueError, "TensorParallelMultiHeadAttention: backward in ",
                     mode.training ? "training" : "inference", " mode after a forward in ", dropped_ ? "training" : "inference",
                     " mode: the attention dropout must be the forward's");
        if (n == 0) {
            fill(TensorView<T, P>(grads, Shape{num_params}), T(0));
            return;
        }
        const std::int64_t rows = n * S;
        const TensorView<T, P> xm(x.data(), Shape{rows, F}), dym(dy.data(), Shape{rows, F});
        if (bias) sum(dym, 0, TensorView<T, P>(grads + Plain::o_bias, Shape{F}));
        const bool want_dx = !dx.empty();
        // Every variable before the output bias is split by heads: across processes each writes
        // its heads' part, and the others' are gathered below.
        run([&](int j) {
            Shard& s = shards_[std::size_t(j)];
            const auto [h0, hc] = part(j);
            const std::int64_t nh = n * hc;
            // The output kernel's rows of this shard's heads (contiguous in the flat buffer).
            const TensorView<T, P> wo(const_cast<T*>(params) + Plain::o_kernel + h0 * Dv * F, Shape{hc * Dv, F});
            gemm(Trans::Yes, Trans::No, T(1), s.merged.view(), dym, T(0),
                 TensorView<T, P>(grads + Plain::o_kernel + h0 * Dv * F, Shape{hc * Dv, F}));
            const TensorView<T, P> dmerged(s.rows.data(), Shape{rows, hc * Dv});
            gemm(Trans::No, Trans::Yes, T(1), dym, wo, T(0), dmerged);
            nn::detail::split_heads<P>(rows, s.rows.data(), static_cast<const T*>(nullptr), s.do_.data(), S, hc, Dv);
            gemm_strided_batched<T, P>(Trans::No, Trans::Yes, S, S, Dv, T(1), s.do_.data(), Dv, S * Dv, s.v.data(), Dv, S * Dv, T(0),
                                       s.da.data(), S, S * S, nh);
            gemm_strided_batched<T, P>(Trans::Yes, Trans::No, S, Dv, S, T(1), weights(s), S, S * S, s.do_.data(), Dv, S * Dv, T(0),
                                       s.dv.data(), Dv, S * Dv, nh);
            if (dropped_) drop(s.da.data(), s.da.data(), nh * S * S, h0, hc, mode);
            place::for_each_n<P>(nh * S, nn::detail::AttentionSoftmaxGradRows<T>{s.a.data(), s.da.data(), S});
            gemm_strided_batched<T, P>(Trans::No, Trans::No, S, Dk, S, T(scale()), s.da.data(), S, S * S, s.k.data(), Dk, S * Dk, T(0),
                                       s.dq.data(), Dk, S * Dk, nh);
            gemm_strided_batched<T, P>(Trans::Yes, Trans::No, S, Dk, S, T(scale()), s.da.data(), S, S * S, s.q.data(), Dk, S * Dk, T(0),
                                       s.dk.data(), Dk, S * Dk, nh);
            project_back(s, xm, grads, Plain::q_kernel, Plain::q_bias, Dk, h0, hc, s.wq, s.dq, want_dx, false);
            project_back(s, xm, grads, Plain::k_kernel, Plain::k_bias, Dk, h0, hc, s.wk, s.dk, want_dx, true);
            project_back(s, xm, grads, Plain::v_kernel, Plain::v_bias, Dv, h0, hc, s.wv, s.dv, want_dx, true);
            P::synchronize();
        });
        if (want_dx)  // the sum over shards of their heads' input gradients
            sum_over_shards(pool_, Shards, [&](int j) { return shards_[std::size_t(j)].dx.view(); }, TensorView<T, P>(dx.data(), Shape{rows, F}),
                            "tensor-parallel attention backward (input gradient)");
        if (pool_.across())
            pool_.gather(grads, [&](int j, auto&& f) { split_grad_blocks(j, f); }, "tensor-parallel attention backward (gradients, all-gather)");
    }

    /// The logical devices the shards run on (names), once the layer has run.
    std::vector<std::string> shard_devices() const { return pool_.devices(); }
    /// The heads [first, first + count) shard j computes.
    static ShardPart heads_of(int j) { return part(j); }

private:
    struct Shard {
        // wq/wk/wv: the kernels' columns of this shard's heads, [F, hc·D]; rows: a projection's
        // [rows, hc·D] (and its gradient after the merge); dw: a kernel's gradient before the
        // scatter; y, dx: this shard's parts of the output and of the input gradient.
        Tensor<T, P> wq, wk, wv, rows, q, k, v, a, ad, o, merged, y, do_, da, dq, dk, dv, dw, dx;
        void size(std::int64_t n, std::int64_t hc) {
            const std::int64_t r = n * S, nh = n * hc;
            rows.resize(Shape{r, hc * (Dk > Dv ? Dk : Dv)});
            q.resize(Shape{nh, S, Dk});
            k.resize(Shape{nh, S, Dk});
            v.resize(Shape{nh, S, Dv});
            a.resize(Shape{nh, S, S});
            if constexpr (drops) ad.resize(Shape{nh, S, S});
            o.resize(Shape{nh, S, Dv});
            merged.resize(Shape{r, hc * Dv});
            y.resize(Shape{r, F});
            do_.resize(Shape{nh, S, Dv});
            da.resize(Shape{nh, S, S});
            dq.resize(Shape{nh, S, Dk});
            dk.resize(Shape{nh, S, Dk});
            dv.resize(Shape{nh, S, Dv});
            dx.resize(Shape{r, F});
        }
    };
    static ShardPart part(int j) { return shard_part(H, Shards, j); }
    // Shard j's part of the variables' gradient (across processes): the query, key and value
    // kernels' columns of its heads and their biases' slices, and the output kernel's rows.
    template <class Emit>
    static void split_grad_blocks(int j, Emit&& f) {
        const auto [h0, hc] = part(j);
        f(SplitBlock{Plain::q_kernel, F, H * Dk, h0 * Dk, hc * Dk});
        if (bias) f(SplitBlock{Plain::q_bias, 1, H * Dk, h0 * Dk, hc * Dk});
        f(SplitBlock{Plain::k_kernel, F, H * Dk, h0 * Dk, hc * Dk});
        if (bias) f(SplitBlock{Plain::k_bias, 1, H * Dk, h0 * Dk, hc * Dk});
        f(SplitBlock{Plain::v_kernel, F, H * Dv, h0 * Dv, hc * Dv});
        if (bias) f(SplitBlock{Plain::v_bias, 1, H * Dv, h0 * Dv, hc * Dv});
        f(SplitBlock{Plain::o_kernel + h0 * Dv * F, 1, hc * Dv * F, 0, hc * Dv * F});
    }
    static constexpr double scale() { return 1.0 / std::sqrt(double(Dk)); }
    const T* weights(const Shard& s) const { return dropped_ ? s.ad.data() : s.a.data(); }

    template <class Fn>
    void run(Fn&& f) {
        pool_.run(f);
    }

    // MultiHeadAttention's mask on this shard's weights [n, hc, S, S] (Plain::drop_heads).
    void drop(const T* in, T* out, std::int64_t count, std::int64_t h0, std::int64_t hc, const nn::Mode& mode) const {
        Plain::drop_heads(in, out, count, h0, hc, mode, stream_);
    }

    // x [rows, F] times the kernel's columns of heads [h0, h0 + hc) (gathered into w, [F, hc·D]),
    // plus their bias, split into heads: out [n·hc, S, D].
    void project(Shard& s, const TensorView<T, P>& xm, const T* params, std::int64_t kernel, std::int64_t b, std::int64_t D,
                 std::int64_t h0, std::int64_t hc, Tensor<T, P>& w, Tensor<T, P>& out) {
        const std::int64_t rows = xm.dim(0);
        w.resize(Shape{F, hc * D});
        each_index<P>(F * hc * D, GatherColumns<T>{params + kernel, w.data(), H * D, h0 * D, hc * D});
        const TensorView<T, P> raw(s.rows.data(), Shape{rows, hc * D});
        gemm(Trans::No, Trans::No, T(1), xm, w.view(), T(0), raw);
        nn::detail::split_heads<P>(rows, s.rows.data(), bias ? params + b + h0 * D : static_cast<const T*>(nullptr), out.data(), S, hc, D);
    }
    // One projection's gradients from its heads' gradient dh [n·hc, S, D]: the kernel's columns
    // (scattered into grads), the bias's slice, and this shard's dx (+)= dh_merged · wᵀ.
    void project_back(Shard& s, const TensorView<T, P>& xm, T* grads, std::int64_t kernel, std::int64_t b, std::int64_t D,
                      std::int64_t h0, std::int64_t hc, const Tensor<T, P>& w, const Tensor<T, P>& dh, bool want_dx, bool accumulate) {
        const std::int64_t rows = xm.dim(0);
        const TensorView<T, P> g(s.rows.data(), Shape{rows, hc * D});
        nn::detail::merge_heads<P>(rows, dh.data(), s.rows.data(), S, hc, D);
        if (bias) sum(g, 0, TensorView<T, P>(grads + b + h0 * D, Shape{hc * D}));
        s.dw.resize(Shape{F, hc * D});
        gemm(Trans::Yes, Trans::No, T(1), xm, g, T(0), s.dw.view());
        each_index<P>(F * hc * D, ScatterColumns<T>{s.dw.data(), grads + kernel, H * D, h0 * D, hc * D});
        if (want_dx) gemm(Trans::No, Trans::Yes, T(1), g, w.view(), T(accumulate ? 1 : 0), s.dx.view());
    }

    ShardPool<P> pool_{Shards, "TensorParallelMultiHeadAttention"};
    std::vector<Shard> shards_ = std::vector<Shard>(std::size_t(Shards));
    std::int64_t n_ = 0;
    bool dropped_ = false;      // the last forward dropped weights (training, rate > 0)
    std::uint64_t stream_ = 0;  // set_stream's (dropout masks)
};

}  // namespace detail

}  // namespace strata::distribute
