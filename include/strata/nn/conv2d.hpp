#pragma once
/// \file strata/nn/conv2d.hpp
/// `Conv2D<Filters, Kernel, Act, Stride, Pad>` (square kernel and stride) and
/// `Conv2DRect<Filters, KernelH, KernelW, Act, StrideH, StrideW, Pad>` (any kernel and stride):
/// 2-D convolution over NHWC images with Keras's semantics, layout (kernel [kh, kw, cin, cout],
/// "HWIO") and initialisation (Glorot uniform kernel, zero bias). Also `Padding` and the
/// sliding-window geometry that MaxPooling2D shares.
///
/// The convolution is lowered to one GEMM (im2col; Chellapilla, Puri, Simard, "High performance
/// convolutional neural networks for document processing", 2006): the patches of the batch are
/// copied into a [n·oh·ow, kh·kw·cin] workspace, which times the kernel seen as a
/// [kh·kw·cin, cout] matrix (HWIO flattened is exactly that matrix) gives the output. The
/// backward pass reuses that workspace: the kernel gradient is patchesᵀ·dy, then the workspace
/// is overwritten with the patch gradients dy·kernelᵀ, which col2im gathers into dx. On the host
/// a stride-1 layer instead computes dx as the convolution of dy with the kernel turned by 180°
/// (TransposedWindow2D): an im2col of dy and one GEMM as deep as a patch.

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

/// How a sliding window (convolution kernel, pooling window) treats the image border, as in
/// Keras:
/// - `Valid`: windows lie inside the image; out = floor((in − k) / stride) + 1.
/// - `Same`: out = ceil(in / stride); the image is padded by
///   pad_total = max((out − 1)·stride + k − in, 0), pad_total / 2 before and the rest after
///   (zeros for convolutions; pooling ignores padded positions).
/// (The enum itself is in strata/fwd.hpp: the layer specs' defaults name Padding::Valid.)

namespace detail {

/// One spatial axis of a sliding window: output extent and padding before the first element.
template <std::int64_t In, std::int64_t K, std::int64_t S, Padding Pad>
struct WindowAxis {
    static constexpr std::int64_t out = Pad == Padding::Same ? (In + S - 1) / S : (In >= K ? (In - K) / S + 1 : 1);
    static constexpr std::int64_t pad_total =
        Pad == Padding::Same && (out - 1) * S + K - In > 0 ? (out - 1) * S + K - In : 0;
    static constexpr std::int64_t pad_before = pad_total / 2;
};

template <class S>
constexpr std::int64_t extent_or_one(int i) {
    return i < S::rank ? S::dims[std::size_t(i)] : 1;
}

/// The compile-time geometry of a KH×KW window sliding with strides SH, SW over an image of
/// shape `In` = (h, w, c). When `In` is not rank 3, `rank_ok` is false and the extents are
/// placeholders (the layer's shape check reports the error).
template <class In, std::int64_t KH, std::int64_t KW, std::int64_t SH, std::int64_t SW, Padding Pad>
struct Window2D {
    static constexpr bool rank_ok = In::rank == 3;
    static constexpr std::int64_t h = extent_or_one<In>(0), w = extent_or_one<In>(1), c = extent_or_one<In>(2);
    static constexpr std::int64_t kh = KH, kw = KW, sh = SH, sw = SW;
    static constexpr bool fits = Pad == Padding::Same || (h >= KH && w >= KW);
    static constexpr std::int64_t oh = WindowAxis<h, KH, SH, Pad>::out, ow = WindowAxis<w, KW, SW, Pad>::out;
    static constexpr std::int64_t pt = WindowAxis<h, KH, SH, Pad>::pad_before, pl = WindowAxis<w, KW, SW, Pad>::pad_before;
    /// Values per patch (a row of the im2col matrix).
    static constexpr std::int64_t patch = KH * KW * c;
};

// im2col, host form: one unit is one output row (n, oy), whose ow patches are written one after
// the other. For each (patch, ky) the window row is kw·c contiguous input values (channels
// innermost, NHWC), so away from the border the copy is a straight contiguous run.
template <class T, class G>
struct Im2ColRows {
    const T* x;
    T* col;
    STRATA_HD void operator()(std::int64_t r) const {
        constexpr std::int64_t seg = G::kw * G::c;
        const std::int64_t n = r / G::oh, oy = r % G::oh;
        const T* xn = x + n * (G::h * G::w * G::c);
        T* out = col + r * (G::ow * G::patch);
        for (std::int64_t ox = 0; ox < G::ow; ++ox, out += G::patch) {
            const std::int64_t ix0 = ox * G::sw - G::pl;
            const bool inside_x = ix0 >= 0 && ix0 + G::kw <= G::w;
            for (std::int64_t ky = 0; ky < G::kh; ++ky) {
                const std::int64_t iy = oy * G::sh - G::pt + ky;
                T* d = out + ky * seg;
                if (iy < 0 || iy >= G::h) {
                    for (std::int64_t j = 0; j < seg; ++j) d[j] = T(0);
                    continue;
                }
                const T* s = xn + iy * (G::w * G::c);
                if (inside_x) {
                    memcpy(d, s + ix0 * G::c, sizeof(T) * seg);
                    continue;
                }
                for (std::int64_t kx = 0; kx < G::kw; ++kx) {
                    const std::int64_t ix = ix0 + kx;
                    T* dk = d + kx * G::c;
                    if (ix < 0 || ix >= G::w) {
                        for (std::int64_t ci = 0; ci < G::c; ++ci) dk[ci] = T(0);
                    } else {
                        memcpy(dk, s + ix * G::c, sizeof(T) * G::c);
                    }
                }
            }
        }
    }
};

// im2col, CUDA form: one thread per workspace element, so consecutive threads write
// consecutive addresses. `I` is the index type for_each_index chose: 32-bit where every index
// fits, since 64-bit division by a constant costs several times as many instructions and this
// kernel is nothing but index arithmetic and one copy (issue 18: 291 µs at batch 1024 on an H200
// with 64-bit indices).
template <class T, class G>
struct Im2ColElements {
    const T* x;
    T* col;
    template <class I>
    STRATA_HD void operator()(I i) const {
        constexpr I c = I(G::c), kw = I(G::kw), patch = I(G::patch), ow = I(G::ow), oh = I(G::oh);
        const I k = i % patch, p = i / patch;
        const I ci = k % c, kx = (k / c) % kw, ky = k / (c * kw);
        const I ox = p % ow, oy = (p / ow) % oh, n = p / (ow * oh);
        const I iy = oy * I(G::sh) - I(G::pt) + ky, ix = ox * I(G::sw) - I(G::pl) + kx;
        col[i] = (iy < 0 || iy >= I(G::h) || ix < 0 || ix >= I(G::w)) ? T(0)
                                                                        : x[((n * I(G::h) + iy) * I(G::w) + ix) * c + ci];
    }
};

// col2im, host form: one unit is one input row (n, iy), owned by one thread. Each input pixel
// gathers the entries of every patch that covers it, in a fixed order (ky, kx), into a local
// accumulator over its channels (contiguous in both the patch matrix and the image): no
// atomics, no zeroing pass, and a result that does not depend on the thread count.
template <class T, class G>
struct Col2ImRows {
    const T* dcol;
    T* dx;
    STRATA_HD void operator()(std::int64_t r) const {
        const std::int64_t n = r / G::h, iy = r % G::h;
        T* row = dx + r * (G::w * G::c);
        for (std::int64_t ix = 0; ix < G::w; ++ix) {
            T acc[G::c];
            for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] = T(0);
            for (std::int64_t ky = 0; ky < G::kh; ++ky) {
                const std::int64_t ty = iy + G::pt - ky;
                if (ty < 0 || ty % G::sh != 0 || ty / G::sh >= G::oh) continue;
                for (std::int64_t kx = 0; kx < G::kw; ++kx) {
                    const std::int64_t tx = ix + G::pl - kx;
                    if (tx < 0 || tx % G::sw != 0 || tx / G::sw >= G::ow) continue;
                    const T* s = dcol + ((n * G::oh + ty / G::sh) * G::ow + tx / G::sw) * G::patch + (ky * G::kw + kx) * G::c;
                    for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] += s[ci];
                }
            }
            for (std::int64_t ci = 0; ci < G::c; ++ci) row[ix * G::c + ci] = acc[ci];
        }
    }
};

// The windows of geometry G that cover element i of an NHWC input, in order (ky, kx): calls
// f(ky, kx, p) with p the index of the window's output pixel (n, oy, ox). The gather of the CUDA
// forms of col2im and of max pooling's backward (`I`: the index type for_each_index chose).
template <class G, class I, class F>
STRATA_HD void for_covering_windows(I i, F&& f) {
    constexpr I c = I(G::c), w = I(G::w), h = I(G::h), sh = I(G::sh), sw = I(G::sw), oh = I(G::oh), ow = I(G::ow);
    const I ix = (i / c) % w, iy = (i / (c * w)) % h, n = i / (c * w * h);
    for (I ky = 0; ky < I(G::kh); ++ky) {
        const I ty = iy + I(G::pt) - ky;
        if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
        for (I kx = 0; kx < I(G::kw); ++kx) {
            const I tx = ix + I(G::pl) - kx;
            if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
            f(ky, kx, (n * oh + ty / sh) * ow + tx / sw);
        }
    }
}

// col2im, CUDA form: one thread per input element gathers the entries of every patch that
// covers it.
template <class T, class G>
struct Col2ImElements {
    const T* dcol;
    T* dx;
    template <class I>
    STRATA_HD void operator()(I i) const {
        const I ci = i % I(G::c);
        T s = T(0);
        for_covering_windows<G>(i, [&](I ky, I kx, I p) { s += dcol[p * I(G::patch) + (ky * I(G::kw) + kx) * I(G::c) + ci]; });
        dx[i] = s;
    }
};

// Bias and activation over [rows, C] with C known at compile time. One unit is a block of
// `block` rows: the channel of an element is its position in the row (no division per
// element), and the bias is copied to a local array once per block so that the compiler sees
// it cannot alias the output and vectorises the row loop.
template <class T, class Act, std::int64_t C, bool UseBias>
struct BiasActivateRows {
    static constexpr std::int64_t block = C >= 1024 ? 1 : 1024 / C;
    T* y;
    const T* bias;
    std::int64_t rows;
    STRATA_HD void operator()(std::int64_t b) const {
        T local[C];
        for (std::int64_t c = 0; c < C; ++c) local[c] = UseBias ? bias[c] : T(0);
        const std::int64_t last = (b + 1) * block < rows ? (b + 1) * block : rows;
        for (std::int64_t r = b * block; r < last; ++r) {
            T* row = y + r * C;
            for (std::int64_t c = 0; c < C; ++c) row[c] = Act::apply(row[c] + local[c]);
        }
    }
};

// The activation's backward and the bias gradient in one pass over dy ([rows, C], host): one
// unit is one of a fixed number of row blocks, which writes its column sums (in
// accumulate_t<T>) to `partial`; the blocks are then combined in order. The grouping depends
// only on the shape, so the bias gradient does not depend on the thread count.
template <class T, class Act, std::int64_t C, bool ApplyGrad>
struct ActivationGradColumnSums {
    static constexpr std::int64_t blocks = 64;
    const T* y;
    T* dy;
    accumulate_t<T>* partial;
    std::int64_t rows;
    STRATA_HD void operator()(std::int64_t b) const {
        accumulate_t<T> acc[C];
        for (std::int64_t c = 0; c < C; ++c) acc[c] = 0;
        const std::int64_t per = (rows + blocks - 1) / blocks;
        const std::int64_t first = b * per, last = first + per < rows ? first + per : rows;
        for (std::int64_t r = first; r < last; ++r) {
            T* d = dy + r * C;
            if constexpr (ApplyGrad) {
                T g[C];
                const T* yr = y + r * C;
                for (std::int64_t c = 0; c < C; ++c) g[c] = Act::grad(yr[c], d[c]);
                for (std::int64_t c = 0; c < C; ++c) d[c] = g[c];
            }
            for (std::int64_t c = 0; c < C; ++c) acc[c] += accumulate_t<T>(d[c]);
        }
        for (std::int64_t c = 0; c < C; ++c) partial[b * C + c] = acc[c];
    }
};

/// The geometry of a stride-1 convolution's data gradient seen as a convolution of its own: dx =
/// dy convolved with the kernel turned by 180° (input and output channels swapped), over dy's
/// extents (oh, ow) with the kernel's other padding (kh − 1 − pt before), giving (h, w). With
/// stride 1, dx[iy, ix, c] = Σ dy[iy + pt − ky, ix + pl − kx, f] · W[ky, kx, c, f], and ky' =
/// kh − 1 − ky makes that row iy − (kh − 1 − pt) + ky' of dy: an im2col window.
template <class G, std::int64_t F>
struct TransposedWindow2D {
    static_assert(G::sh == 1 && G::sw == 1, "strata::nn: a data gradient as a convolution needs stride 1");
    static constexpr std::int64_t h = G::oh, w = G::ow, c = F;
    static constexpr std::int64_t kh = G::kh, kw = G::kw, sh = 1, sw = 1;
    static constexpr std::int64_t oh = G::h, ow = G::w;
    static constexpr std::int64_t pt = G::kh - 1 - G::pt, pl = G::kw - 1 - G::pl;
    static constexpr std::int64_t patch = kh * kw * c;
};

/// Writes the im2col matrix of `x` ([n, h, w, c]) into `col` ([n·oh·ow, kh·kw·c]).
template <class G, class T, class P>
void im2col(const TensorView<T, P>& x, const TensorView<T, P>& col) {
    const std::int64_t n = x.dim(0);
    if constexpr (elementwise_place<P>)
        for_each_index<P>(col.size(), Im2ColElements<T, G>{x.data(), col.data()}, x.size());
    else
        for_each_index<P>(n * G::oh, Im2ColRows<T, G>{x.data(), col.data()});
}

/// Sums the patch gradients `dcol` ([n·oh·ow, kh·kw·c]) into `dx` ([n, h, w, c], overwritten).
template <class G, class T, class P>
void col2im(const TensorView<T, P>& dcol, const TensorView<T, P>& dx) {
    const std::int64_t n = dx.dim(0);
    if constexpr (elementwise_place<P>)
        for_each_index<P>(dx.size(), Col2ImElements<T, G>{dcol.data(), dx.data()}, dcol.size());
    else
        for_each_index<P>(n * G::h, Col2ImRows<T, G>{dcol.data(), dx.data()});
}

/// `y = act(y + bias)` over `y` seen as [rows, C], C a compile-time channel count.
template <class Act, std::int64_t C, bool UseBias, class T, class P>
void bias_activation_rows(const TensorView<T, P>& y, const T* bias, bool skip_activation) {
    const std::int64_t rows = y.size() / C;
    if constexpr (Act::rowwise || elementwise_place<P>) {
        bias_activation<Act>(y, UseBias ? bias : nullptr, C, skip_activation);
    } else if (skip_activation || std::is_same_v<Act, Linear>) {
        using F = BiasActivateRows<T, Linear, C, true>;
        if constexpr (UseBias) for_each_index<P>((rows + F::block - 1) / F::block, F{y.data(), bias, rows});
    } else {
        using F = BiasActivateRows<T, Act, C, UseBias>;
        for_each_index<P>((rows + F::block - 1) / F::block, F{y.data(), bias, rows});
    }
}

/// How the host convolution cuts a batch (see Conv2DImpl): chunks of `images` whole images,
/// whose patch matrix, output and output gradient take about `budget` bytes (they then stay in
/// a core's L2 cache between the chunk's passes), and at most `groups` partial sums of the
/// weight gradient.
template <class G, std::int64_t Filters, class T>
struct ConvChunking {
    static constexpr std::int64_t budget = 512 * 1024;
    static constexpr std::int64_t pixels = G::oh * G::ow;  // output rows per image
    static constexpr std::int64_t per_image = pixels * (G::patch + 2 * Filters) * std::int64_t(sizeof(T));
    static constexpr std::int64_t images = per_image >= budget ? 1 : budget / per_image;
    static constexpr std::int64_t groups = 16;
};

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

template <class Spec, class In, class T, class P>
class Conv2DImpl;

}  // namespace detail

/// A 2-D convolution with `Filters` output channels, a KernelH×KernelW kernel, strides
/// StrideH, StrideW and `Pad` padding, followed by the activation `Act` (Keras's
/// `Conv2D(filters, (kh, kw), strides=(sh, sw), padding=..., activation=...)`).
///
/// Requires: the input is an image, rank 3 per example (height, width, channels; NHWC
/// batches); with `Padding::Valid` it is at least KernelH×KernelW. Otherwise the model does not
/// compile, with `LayerShapeError<Conv2DRect<...>, Expected, Found>` in the message.
/// Ensures: output [n, oh, ow, Filters] (see `Padding` for oh, ow); parameters "kernel"
/// [KernelH, KernelW, cin, Filters] (Glorot uniform, fan_in = kh·kw·cin, fan_out = kh·kw·Filters)
/// then "bias" [Filters] (zeros) when `UseBias`.
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<32, 48, 3>, Conv2DRect<16, 3, 5, ReLU, 1, 2, Padding::Same>>;
/// static_assert(std::is_same_v<Net::output_shape, strata::StaticShape<32, 24, 16>>);
/// \endcode
template <std::int64_t Filters, std::int64_t KernelH, std::int64_t KernelW, class Act, std::int64_t StrideH, std::int64_t StrideW,
          Padding Pad, bool UseBias>
struct Conv2DRect {
    static_assert(Filters >= 1, "strata::nn::Conv2DRect<Filters, ...>: Filters must be >= 1");
    static_assert(KernelH >= 1 && KernelW >= 1, "strata::nn::Conv2DRect<Filters, KernelH, KernelW, ...>: kernel extents must be >= 1");
    static_assert(StrideH >= 1 && StrideW >= 1, "strata::nn::Conv2DRect<..., StrideH, StrideW>: strides must be >= 1");
    static_assert(Activation<Act>, "strata::nn::Conv2DRect<..., Act>: Act must be an activation (Linear, ReLU, Sigmoid, Tanh, Softmax)");
    static_assert(!grad_needs_input_v<Act>, "strata::nn::Conv2DRect<..., Act>: GELU's derivative needs the pre-activation, which a "
                                            "convolution does not keep: write Linear here and ActivationLayer<GELU> after it");
    static constexpr const char* name = "Conv2D";
    static constexpr const char* keras_name = "conv2d";
    static constexpr std::int64_t filters = Filters, kernel_h = KernelH, kernel_w = KernelW;
    static constexpr std::int64_t stride_h = StrideH, stride_w = StrideW;
    static constexpr Padding padding = Pad;
    static constexpr bool use_bias = UseBias;
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::Conv2DImpl<Conv2DRect, In, T, P>;
};

/// A 2-D convolution with a square Kernel×Kernel kernel and equal strides: Keras's
/// `Conv2D(Filters, Kernel, strides=Stride, padding=..., activation=Act)`. Everything else is as
/// in `Conv2DRect` (which takes non-square kernels and strides).
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>,            // -> (26, 26, 32)
///                        Conv2D<8, 3, Linear, 2, Padding::Same>>;         // -> (13, 13, 8)
/// static_assert(Net::num_params == (3 * 3 * 1 * 32 + 32) + (3 * 3 * 32 * 8 + 8));
/// \endcode
template <std::int64_t Filters, std::int64_t Kernel, class Act, std::int64_t Stride, Padding Pad, bool UseBias>
struct Conv2D {
    static_assert(Filters >= 1, "strata::nn::Conv2D<Filters, Kernel>: Filters must be >= 1");
    static_assert(Kernel >= 1, "strata::nn::Conv2D<Filters, Kernel>: Kernel must be >= 1");
    static_assert(Stride >= 1, "strata::nn::Conv2D<Filters, Kernel, Act, Stride>: Stride must be >= 1");
    static_assert(Activation<Act>, "strata::nn::Conv2D<Filters, Kernel, Act>: Act must be an activation (Linear, ReLU, Sigmoid, Tanh, Softmax)");
    static_assert(!grad_needs_input_v<Act>, "strata::nn::Conv2D<Filters, Kernel, Act>: GELU's derivative needs the pre-activation, which a "
                                            "convolution does not keep: write Linear here and ActivationLayer<GELU> after it");
    static constexpr const char* name = "Conv2D";
    static constexpr const char* keras_name = "conv2d";
    static constexpr std::int64_t filters = Filters, kernel_h = Kernel, kernel_w = Kernel;
    static constexpr std::int64_t stride_h = Stride, stride_w = Stride;
    static constexpr Padding padding = Pad;
    static constexpr bool use_bias = UseBias;
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::Conv2DImpl<Conv2D, In, T, P>;
};

namespace detail {

/// The bound convolution (see the layer contract in strata/nn/layer.hpp). It owns its
/// workspaces (the im2col matrix, and 64×Filters partial bias sums), which grow to the largest
/// batch seen and are then reused: after the first batch of a given size, neither pass
/// allocates. On the host, bias and activation are applied in one pass after the GEMM, and the
/// activation's backward and the bias gradient in one pass before it.
template <class Spec, class In, class T, class P>
class Conv2DImpl {
    using G = Window2D<In, Spec::kernel_h, Spec::kernel_w, Spec::stride_h, Spec::stride_w, Spec::padding>;
    using Act = typename Spec::activation;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<3>, In, G::rank_ok>::value,
                  "strata::nn::Conv2D: the input must be an image, rank 3 per example (height, width, channels)");
    static_assert(LayerShapeError<Spec, AtLeastSpatial<Spec::kernel_h, Spec::kernel_w>, In, !G::rank_ok || G::fits>::value,
                  "strata::nn::Conv2D: with Padding::Valid the image must be at least as large as the kernel; use a "
                  "smaller kernel or Padding::Same");

public:
    using input_shape = In;
    /// (When the shape check fails, the input shape passes through: one mistake, one error.)
    using output_shape = std::conditional_t<G::rank_ok && G::fits, StaticShape<G::oh, G::ow, Spec::filters>, In>;
    static constexpr std::int64_t in_channels = G::c, filters = Spec::filters;
    /// Rows of the kernel matrix: values per patch, kh·kw·cin.
    static constexpr std::int64_t patch = G::patch;
    static constexpr std::int64_t kernel_size = patch * filters;
    static constexpr std::int64_t num_params = kernel_size + (Spec::use_bias ? filters : 0);
    /// A 1×1 kernel with unit strides reads each pixel once: the input already is the patch
    /// matrix, and no workspace is needed.
    static constexpr bool direct = Spec::kernel_h == 1 && Spec::kernel_w == 1 && Spec::stride_h == 1 && Spec::stride_w == 1;
    /// On the host (and not direct) the batch is processed in chunks of images (below).
    static constexpr bool blocked = !direct && !elementwise_place<P>;

    static std::vector<ParamInfo> param_info() {
        std::vector<ParamInfo> p{{"kernel", Shape{Spec::kernel_h, Spec::kernel_w, in_channels, filters}, 0}};
        if (Spec::use_bias) p.push_back({"bias", Shape{filters}, kernel_size});
        return p;
    }

    void init(T* params, std::uint64_t seed, std::uint64_t stream) const {
        glorot_uniform<T, P>(params, kernel_size, patch, Spec::kernel_h * Spec::kernel_w * filters, seed, stream);
        if (Spec::use_bias) zeros<T, P>(params + kernel_size, filters);
    }

    /// Sizes (and touches) the workspaces a batch of `n` needs on the calling thread's team
    /// (Network::reserve): the per-thread chunk workspace, and for training the weight
    /// gradient's partial sums.
    void reserve(std::int64_t n, bool training) {
        if constexpr (blocked) {
            const std::int64_t threads = num_threads();
            const std::int64_t per = forward_chunk_images(n, threads);
            // (+ a chunk of output: forward_then's inference scratch)
            std::int64_t ws = std::min(threads, ceil_div(n, per)) * per * (Chunks::pixels * patch + out_image);
            if (training) {
                const std::int64_t groups = std::min(Chunks::groups, ceil_div(n, Chunks::images));
                ws = std::max(ws, std::min(threads, groups) * (chunk_ws + chunk_out_grad));  // (+ backward_then's scratch)
                if constexpr (transposed_data) {
                    wt_.resize(Shape{kernel_size});
                    touch(wt_);
                }
                dw_.resize(Shape{groups, kernel_size});
                touch(dw_);
                if (Spec::use_bias) {
                    partial_.resize(Shape{groups, filters});
                    touch(partial_);
                }
            }
            ws_.resize(Shape{ws});
            touch(ws_);
        }
    }

    /// Whether forward_then can run `Next`'s forward on each chunk of this layer's output.
    template <class Next>
    static constexpr bool fuses = blocked && !Act::rowwise && requires(Next& next, const T* c, T* o, const Mode& m) {
        next.forward_begin(std::int64_t(0), m);
        next.forward_images(c, std::int64_t(0), std::int64_t(0), o, m);
        next.forward_done(c, std::int64_t(0), m);
    };

    /// Whether backward_then can take each chunk's output gradient from `Next` (a MaxPooling2D
    /// whose windows do not overlap), this layer's activation derivative included: then
    /// neither this layer's output nor its output gradient is ever stored.
    template <class Next>
    static constexpr bool fuses_backward = fuses<Next> && requires { Next::template fuses_activation_grad<Act>; } &&
                                           Next::template fuses_activation_grad<Act>;

    /// forward, then `next`'s forward (a MaxPooling2D) on each chunk of whole images of the
    /// output while the chunk is still in cache: the pooling does not read the convolution's
    /// output back from memory. The convolution's output is not even stored (each chunk goes to
    /// a per-thread scratch; `y` is left unwritten) when nothing will read it: with
    /// `mode.no_backward`, or in training when the backward pass will be backward_then
    /// (fuses_backward; it needs the positions of the maxima, which the pooling records in
    /// training only).
    /// Returns false, having done nothing, when the batch is too small to give every thread a
    /// chunk (the caller then runs the two layers one after the other, and their backward too).
    template <class Next>
    bool forward_then(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, Next& next,
                      const TensorView<T, P>& next_y, const Mode& mode) {
        const std::int64_t n = x.dim(0), threads = num_threads();
        const std::int64_t per = forward_chunk_images(n, threads);
        if (threads > 1 && ceil_div(n, per) < threads) return false;
        next.forward_begin(n, mode);
        const bool store = !mode.no_backward && !(fuses_backward<Next> && mode.training);
        blocked_forward(params, x, y, mode, per, store, [&](const T* yc, std::int64_t n0, std::int64_t count) {
            next.forward_images(yc, n0, count, next_y.data(), mode);
        });
        next.forward_done(y.data(), n, mode);
        return true;
    }

    /// The backward pass after a training forward_then that returned true, for a `Next` that
    /// fuses_backward: each chunk's output gradient, this layer's activation derivative
    /// included, comes from `next.backward_images` (from the pooling's output `next_y` and its
    /// gradient `next_dy`) into a per-thread scratch while the chunk is in cache; then the bias
    /// and weight gradients and `dx` as in backward. The figures are bitwise those of the two
    /// layers' own backward passes.
    template <class Next>
        requires fuses_backward<Next>
    void backward_then(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& dx, const Next& next,
                       const TensorView<T, P>& next_y, const TensorView<T, P>& next_dy) {
        const T* const ny = next_y.data();
        const T* const ndy = next_dy.data();
        blocked_backward(params, grads, x, TensorView<T, P>(), TensorView<T, P>(), dx, Mode{},
                         [&](T* scratch, std::int64_t n0, std::int64_t count, accumulate_t<T>* db) {
                             next.template backward_images<Act>(ny, ndy, n0, count, scratch, db);
                             return scratch;
                         });
    }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        if constexpr (blocked) {
            // Chunks for every thread of the team; a batch too small for that keeps one
            // whole-batch GEMM, which the team splits.
            const std::int64_t n = x.dim(0), threads = num_threads();
            const std::int64_t per = forward_chunk_images(n, threads);
            if (threads == 1 || ceil_div(n, per) >= threads) return blocked_forward(params, x, y, mode, per, true, nullptr);
        }
        const std::int64_t rows = x.dim(0) * G::oh * G::ow;
        const TensorView<T, P> ym(y.data(), Shape{rows, filters});
        const TensorView<T, P> cols = patches(x);
        {
            STRATA_PROFILE_PHASE("forward.gemm");
            gemm(Trans::No, Trans::No, T(1), cols, kernel(params), T(0), ym);
        }
        STRATA_PROFILE_PHASE("forward.bias_activation");
        bias_activation_rows<Act, filters, Spec::use_bias>(ym, params + kernel_size, mode.skip_activation);
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y,
                  const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode) {
        if constexpr (blocked) {
            return blocked_backward(params, grads, x, y, dy, dx, mode, nullptr);
        }
        const std::int64_t n = x.dim(0), rows = n * G::oh * G::ow;
        const TensorView<T, P> dym(dy.data(), Shape{rows, filters}), ym(y.data(), Shape{rows, filters});
        if constexpr (Spec::use_bias && !Act::rowwise && !elementwise_place<P>) {
            STRATA_PROFILE_PHASE("backward.activation");
            if (mode.skip_activation || std::is_same_v<Act, Linear>)
                activation_and_bias_grad<false>(ym, dym, grads + kernel_size);
            else
                activation_and_bias_grad<true>(ym, dym, grads + kernel_size);
        } else {
            STRATA_PROFILE_PHASE("backward.activation");
            activation_backward_and_bias_grad<Act>(ym, dym, mode.skip_activation, Spec::use_bias ? grads + kernel_size : nullptr);
        }
        {
            const TensorView<T, P> cols = col_holds(x) ? col_.view() : patches(x);
            STRATA_PROFILE_PHASE("backward.weights");
            gemm(Trans::Yes, Trans::No, T(1), cols, dym, T(0), TensorView<T, P>(grads, Shape{patch, filters}));
        }
        if (dx.empty()) return;
        STRATA_PROFILE_PHASE("backward.data");
        if constexpr (direct) {
            gemm(Trans::No, Trans::Yes, T(1), dym, kernel(params), T(0), TensorView<T, P>(dx.data(), Shape{rows, patch}));
        } else {
            // The patches are no longer needed: their gradients take the same workspace.
            gemm(Trans::No, Trans::Yes, T(1), dym, kernel(params), T(0), col_.view());
            col_of_ = nullptr;
            col2im<G>(col_.view(), dx);
        }
    }

private:
    using Chunks = ConvChunking<G, Spec::filters, T>;
    static constexpr std::int64_t in_image = G::h * G::w * G::c;          // input values per image
    static constexpr std::int64_t out_image = Chunks::pixels * filters;    // output values per image
    static constexpr std::int64_t chunk_col = Chunks::images * Chunks::pixels * patch;
    static constexpr std::int64_t chunk_out_grad = Chunks::images * out_image;  // backward_then's scratch
    // A stride-1 layer computes its data gradient as a convolution (TransposedWindow2D): an
    // im2col of the chunk's dy and one GEMM kh·kw·Filters deep into dx, in place of the GEMM
    // Filters deep into the patch gradients and col2im. The same products; a shape a GEMM runs
    // near its peak at (the resnet's 16-channel stage ran its data gradient at 47% of the
    // machine's SGEMM ceiling), and no patch-gradient matrix written and read back.
    // Only where dy's patch matrix is no larger than the patch gradients' (in pixels × filters
    // against out pixels × in channels): with more filters than channels (the seed CNN's second
    // layer, 32 → 64 at 13×13 valid) the im2col of dy writes 2.8× the bytes, and the step was
    // measured 12% slower that way.
    static constexpr bool transposed_data = Spec::stride_h == 1 && Spec::stride_w == 1 &&
                                            G::h * G::w * Spec::filters <= G::oh * G::ow * G::c;
    using GT = std::conditional_t<transposed_data, TransposedWindow2D<G, Spec::filters>, G>;
    static constexpr std::int64_t chunk_col_data = transposed_data ? Chunks::images * G::h * G::w * GT::patch : 0;
    // Per thread: the chunk's patch matrix, or its dy's (the larger of the two).
    static constexpr std::int64_t chunk_ws = chunk_col > chunk_col_data ? chunk_col : chunk_col_data;

    // The host convolution, blocked by images. A chunk of whole images goes through im2col, its
    // GEMM and its bias and activation (forward), or through its activation's gradient, the
    // weight-gradient GEMM, the data-gradient GEMM and col2im (backward), on one thread of the
    // team, in that thread's workspace: the chunk's patch matrix (about Chunks::budget bytes)
    // is built, used and overwritten while it is in the core's cache. The batch's whole patch
    // matrix (18 MB for the seed CNN's second layer at batch 128) is never written to memory
    // and read back; backward rebuilds each chunk's patches from the input instead, which moves
    // far fewer bytes (the input is kh·kw times smaller).
    //
    // The weight and bias gradients sum over the batch. The chunks are cut by the batch size
    // alone and gathered into at most Chunks::groups consecutive groups; one thread sums a
    // group's chunks in order (the GEMM accumulates), and the groups' sums are added in order at
    // the end. The gradients therefore do not depend on the number of threads.
    // `then(chunk output, first image, images)`, when given, runs on each chunk's output after
    // its bias and activation (forward_then); without `store` that output is then a per-thread
    // scratch, not `y`.
    template <class Then>
    void blocked_forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode,
                         std::int64_t per, bool store, Then&& then) {
        constexpr bool chained = !std::is_same_v<std::decay_t<Then>, std::nullptr_t>;
        const std::int64_t n = x.dim(0), chunks = ceil_div(n, per);
        const int team = int(std::min<std::int64_t>(num_threads(), chunks));
        const bool scratch_out = chained && !store;
        const std::int64_t chunk_out = per * out_image;
        ws_.resize(Shape{team * (per * Chunks::pixels * patch + (scratch_out ? chunk_out : 0))});
        strata::detail::blas_init_once();
        T* const ws = ws_.data();
        const T* const xs = x.data();
        T* const ys = y.data();
        const T* const bias = params + kernel_size;
        const bool skip = mode.skip_activation;
        [[maybe_unused]] const void* key = profile::current();
#if STRATA_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(team)
#endif
        for (std::int64_t c = 0; c < chunks; ++c) {
            const std::int64_t n0 = c * per, count = std::min(per, n - n0), rows = count * Chunks::pixels;
            T* col = ws + thread_index() * (per * Chunks::pixels * patch + (scratch_out ? chunk_out : 0));
            T* yc = scratch_out ? col + per * Chunks::pixels * patch : ys + n0 * out_image;
            {
                STRATA_PROFILE_SCOPE(key, "forward.im2col");
                const Im2ColRows<T, G> f{xs + n0 * in_image, col};
                for (std::int64_t r = 0; r < count * G::oh; ++r) f(r);
            }
            {
                STRATA_PROFILE_SCOPE(key, "forward.gemm");
                strata::detail::cblas_gemm(Trans::No, Trans::No, rows, filters, patch, T(1), col, int(patch), params, int(filters), T(0), yc,
                           int(filters));
            }
            if constexpr (!Act::rowwise) {
                STRATA_PROFILE_SCOPE(key, "forward.bias_activation");
                bias_activation_chunk(yc, bias, rows, skip);
            }
            if constexpr (chained) {
                STRATA_PROFILE_SCOPE(key, "forward.next_layer (fused)");
                then(static_cast<const T*>(yc), n0, count);
            }
        }
        if constexpr (Act::rowwise) {  // across each row's channels: on the whole output, after the GEMMs
            STRATA_PROFILE_PHASE("forward.bias_activation");
            bias_activation_rows<Act, filters, Spec::use_bias>(TensorView<T, P>(ys, Shape{n * Chunks::pixels, filters}), bias,
                                                               skip);
        }
    }

    // `source(scratch, first image, images, db)`, when given, writes a chunk's output gradient,
    // with the activation's derivative applied, into the thread's scratch, adds its channel sums
    // to db (when not null) and returns it (backward_then); `y` and `dy` are then not read.
    template <class Source>
    void blocked_backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y,
                          const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode, Source&& source) {
        constexpr bool sourced = !std::is_same_v<std::decay_t<Source>, std::nullptr_t>;
        const std::int64_t n = x.dim(0), chunks = ceil_div(n, Chunks::images);
        const std::int64_t groups = std::min(Chunks::groups, chunks);
        const int team = int(std::min<std::int64_t>(num_threads(), groups));
        constexpr bool fuse_activation = !Act::rowwise;
        const bool apply_grad = !mode.skip_activation && !std::is_same_v<Act, Linear>;
        constexpr std::int64_t stride = chunk_ws + (sourced ? chunk_out_grad : 0);  // per thread
        if (!sourced && !fuse_activation) {
            STRATA_PROFILE_PHASE("backward.activation");
            activation_backward<Act>(TensorView<T, P>(y.data(), Shape{y.size() / filters, filters}),
                                     TensorView<T, P>(dy.data(), Shape{dy.size() / filters, filters}), mode.skip_activation);
        }
        ws_.resize(Shape{team * stride});
        dw_.resize(Shape{groups, kernel_size});
        if (Spec::use_bias) partial_.resize(Shape{groups, filters});
        strata::detail::blas_init_once();
        T* const ws = ws_.data();
        T* const dws = dw_.data();
        accumulate_t<T>* const dbs = Spec::use_bias ? partial_.data() : nullptr;
        const T *const xs = x.data(), *const ys = sourced ? nullptr : y.data();
        T* const dys = sourced ? nullptr : dy.data();
        T* const dxs = dx.empty() ? nullptr : dx.data();
        // The kernel turned by 180°, channels swapped: [kh·kw·Filters, cin] (transposed_data).
        [[maybe_unused]] const T* wt = nullptr;
        if constexpr (transposed_data) {
            if (dxs) {
                wt_.resize(Shape{kernel_size});
                T* t = wt_.data();
                for (std::int64_t ky = 0; ky < G::kh; ++ky)
                    for (std::int64_t kx = 0; kx < G::kw; ++kx)
                        for (std::int64_t c = 0; c < in_channels; ++c)
                            for (std::int64_t f = 0; f < filters; ++f)
                                t[(((G::kh - 1 - ky) * G::kw + (G::kw - 1 - kx)) * filters + f) * in_channels + c] =
                                    params[((ky * G::kw + kx) * in_channels + c) * filters + f];
                wt = t;
            }
        }
        [[maybe_unused]] const void* key = profile::current();
#if STRATA_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(team)
#endif
        for (std::int64_t g = 0; g < groups; ++g) {
            T* col = ws + thread_index() * stride;
            accumulate_t<T>* db = Spec::use_bias ? dbs + g * filters : nullptr;
            if (Spec::use_bias)
                for (std::int64_t f = 0; f < filters; ++f) db[f] = 0;
            const std::int64_t first = g * chunks / groups, last = (g + 1) * chunks / groups;
            for (std::int64_t c = first; c < last; ++c) {
                const std::int64_t n0 = c * Chunks::images, count = std::min(Chunks::images, n - n0);
                const std::int64_t rows = count * Chunks::pixels;
                T* dyc = sourced ? nullptr : dys + n0 * out_image;
                {
                    STRATA_PROFILE_SCOPE(key, "backward.activation");
                    if constexpr (sourced) {
                        STRATA_PROFILE_SCOPE(key, "backward.next_layer (fused)");
                        dyc = source(col + chunk_ws, n0, count, db);
                    } else if constexpr (fuse_activation) {
                        if (apply_grad) activation_grad_chunk(ys + n0 * out_image, dyc, db, rows);
                        else if (Spec::use_bias) column_sums_chunk(dyc, db, rows);
                    } else if (Spec::use_bias) {
                        column_sums_chunk(dyc, db, rows);
                    }
                }
                {
                    STRATA_PROFILE_SCOPE(key, "backward.weights");
                    const Im2ColRows<T, G> f{xs + n0 * in_image, col};
                    for (std::int64_t r = 0; r < count * G::oh; ++r) f(r);
                    strata::detail::cblas_gemm(Trans::Yes, Trans::No, patch, filters, rows, T(1), col, int(patch), dyc, int(filters),
                               T(c == first ? 0 : 1), dws + g * kernel_size, int(filters));
                }
                if (dxs) {
                    STRATA_PROFILE_SCOPE(key, "backward.data");
                    if constexpr (transposed_data) {
                        const Im2ColRows<T, GT> f{dyc, col};
                        for (std::int64_t r = 0; r < count * GT::oh; ++r) f(r);
                        strata::detail::cblas_gemm(Trans::No, Trans::No, count * G::h * G::w, in_channels, GT::patch, T(1), col,
                                                   int(GT::patch), wt, int(in_channels), T(0), dxs + n0 * in_image, int(in_channels));
                    } else {
                        strata::detail::cblas_gemm(Trans::No, Trans::Yes, rows, patch, filters, T(1), dyc, int(filters), params, int(filters),
                                                   T(0), col, int(patch));
                        const Col2ImRows<T, G> f{col, dxs + n0 * in_image};
                        for (std::int64_t r = 0; r < count * G::h; ++r) f(r);
                    }
                }
            }
        }
        STRATA_PROFILE_PHASE("backward.weights");
        sum_groups(dws, groups, kernel_size, grads);
        if (Spec::use_bias) {
            for (std::int64_t f = 0; f < filters; ++f) {
                accumulate_t<T> s = 0;
                for (std::int64_t g = 0; g < groups; ++g) s += dbs[g * filters + f];
                grads[kernel_size + f] = T(s);
            }
        }
    }

    // Images per forward chunk: the cache budget's, or fewer so that every thread gets one.
    static std::int64_t forward_chunk_images(std::int64_t n, std::int64_t threads) {
        return std::min(Chunks::images, ceil_div(n, threads));
    }

    template <class U>
    static void touch(Tensor<U, P>& t) {
        if (t.size() > 0) std::memset(static_cast<void*>(t.data()), 0, std::size_t(t.size()) * sizeof(U));
    }

    static int thread_index() {
#if STRATA_HAS_OPENMP
        return omp_get_thread_num();
#else
        return 0;
#endif
    }

    // y = act(y + bias) over one chunk's rows (in cache after its GEMM).
    static void bias_activation_chunk(T* y, const T* bias, std::int64_t rows, bool skip) {
        T b[filters];
        for (std::int64_t f = 0; f < filters; ++f) b[f] = Spec::use_bias ? bias[f] : T(0);
        if (skip || std::is_same_v<Act, Linear>) {
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t f = 0; f < filters; ++f) y[r * filters + f] += b[f];
        } else {
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t f = 0; f < filters; ++f) y[r * filters + f] = Act::apply(y[r * filters + f] + b[f]);
        }
    }

    // dy = act'(y) · dy over one chunk's rows, adding the columns of the result to db (if any).
    static void activation_grad_chunk(const T* y, T* dy, accumulate_t<T>* db, std::int64_t rows) {
        accumulate_t<T> acc[filters];
        for (std::int64_t f = 0; f < filters; ++f) acc[f] = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
            T g[filters];
            for (std::int64_t f = 0; f < filters; ++f) g[f] = Act::grad(y[r * filters + f], dy[r * filters + f]);
            for (std::int64_t f = 0; f < filters; ++f) {
                dy[r * filters + f] = g[f];
                acc[f] += accumulate_t<T>(g[f]);
            }
        }
        if (db)
            for (std::int64_t f = 0; f < filters; ++f) db[f] += acc[f];
    }

    static void column_sums_chunk(const T* dy, accumulate_t<T>* db, std::int64_t rows) {
        accumulate_t<T> acc[filters];
        for (std::int64_t f = 0; f < filters; ++f) acc[f] = 0;
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t f = 0; f < filters; ++f) acc[f] += accumulate_t<T>(dy[r * filters + f]);
        for (std::int64_t f = 0; f < filters; ++f) db[f] += acc[f];
    }

    // out[i] = sum over the groups of parts[g·size + i], in group order, over the team.
    static void sum_groups(const T* parts, std::int64_t groups, std::int64_t size, T* out) {
        constexpr std::int64_t block = 1024;
        const std::int64_t blocks = ceil_div(size, block);
#if STRATA_HAS_OPENMP
#pragma omp parallel for schedule(static) if (size * groups >= 65536)
#endif
        for (std::int64_t b = 0; b < blocks; ++b) {
            const std::int64_t first = b * block, last = std::min(size, first + block);
            accumulate_t<T> acc[block];
            for (std::int64_t i = first; i < last; ++i) acc[i - first] = accumulate_t<T>(parts[i]);
            for (std::int64_t g = 1; g < groups; ++g)
                for (std::int64_t i = first; i < last; ++i) acc[i - first] += accumulate_t<T>(parts[g * size + i]);
            for (std::int64_t i = first; i < last; ++i) out[i] = T(acc[i - first]);
        }
    }

    static TensorView<T, P> kernel(const T* params) { return TensorView<T, P>(const_cast<T*>(params), Shape{patch, filters}); }

    // dy = act'(y) * dy and dbias = column sums of dy, in one pass (host).
    template <bool ApplyGrad>
    void activation_and_bias_grad(const TensorView<T, P>& y, const TensorView<T, P>& dy, T* dbias) {
        using F = ActivationGradColumnSums<T, Act, filters, ApplyGrad>;
        partial_.resize(Shape{F::blocks, filters});
        for_each_index<P>(F::blocks, F{y.data(), dy.data(), partial_.data(), y.dim(0)});
        for (std::int64_t c = 0; c < filters; ++c) {
            accumulate_t<T> s = 0;
            for (std::int64_t b = 0; b < F::blocks; ++b) s += partial_.data()[b * filters + c];
            dbias[c] = T(s);
        }
    }

    bool col_holds(const TensorView<T, P>& x) const { return !direct && col_of_ == x.data() && col_batch_ == x.dim(0); }

    // The patch matrix of x: x itself for a direct layer, else im2col into the workspace. The
    // workspace remembers which input it holds so that backward (which receives the same input)
    // does not rebuild it.
    TensorView<T, P> patches(const TensorView<T, P>& x) {
        const std::int64_t rows = x.dim(0) * G::oh * G::ow;
        if constexpr (direct) {
            return TensorView<T, P>(x.data(), Shape{rows, patch});
        } else {
            STRATA_PROFILE_PHASE("forward.im2col");
            col_.resize(Shape{rows, patch});
            im2col<G>(x, col_.view());
            col_of_ = x.data();
            col_batch_ = x.dim(0);
            return col_.view();
        }
    }

    Tensor<T, P> col_;
    Tensor<T, P> ws_;  // blocked: one chunk's patch matrix per thread of the team
    Tensor<T, P> dw_;  // blocked: the weight gradient's partial sums, one per group
    Tensor<T, P> wt_;  // blocked, stride 1: the kernel turned for the data gradient
    Tensor<accumulate_t<T>, P> partial_;
    const T* col_of_ = nullptr;
    std::int64_t col_batch_ = -1;
};

}  // namespace detail

}  // namespace strata::nn
