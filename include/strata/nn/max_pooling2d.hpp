#pragma once
/// \file strata/nn/max_pooling2d.hpp
/// `MaxPooling2D<Pool, Stride, Pad>` (square window and stride) and
/// `MaxPooling2DRect<PoolH, PoolW, StrideH, StrideW, Pad>`: the maximum of each window of each
/// channel of NHWC images, with Keras's semantics (stride defaults to the pool size; "same"
/// windows ignore padded positions).
///
/// The forward pass in training records, per output value, where in its window the maximum was (the first
/// maximum in row-major window order), in an int32 workspace. The backward pass is owned by the
/// input: each input value sums the gradients of the windows whose recorded maximum it is, so
/// overlapping windows (stride < pool) are handled, and no atomics are needed.

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {

// Forward, host form: one unit is one output row (n, oy). Each window keeps its running maxima
// in local arrays over the channels (contiguous in NHWC, and alias-free so the compiler
// vectorises the compare-and-select), then stores them once.
template <class T, class G>
struct MaxPoolRows {
    const T* x;
    T* y;
    std::int32_t* arg;
    STRATA_HD void operator()(std::int64_t r) const {
        const std::int64_t n = r / G::oh, oy = r % G::oh;
        const T* xn = x + n * (G::h * G::w * G::c);
        T* yo = y + r * (G::ow * G::c);
        std::int32_t* ao = arg ? arg + r * (G::ow * G::c) : nullptr;
        // Same padding never gives a window without a position inside the image (pad < kernel).
        const std::int64_t ky0 = G::pt - oy * G::sh > 0 ? G::pt - oy * G::sh : 0;
        const std::int64_t ky1 = G::h + G::pt - oy * G::sh < G::kh ? G::h + G::pt - oy * G::sh : G::kh;
        for (std::int64_t ox = 0; ox < G::ow; ++ox, yo += G::c, ao = ao ? ao + G::c : nullptr) {
            const std::int64_t kx0 = G::pl - ox * G::sw > 0 ? G::pl - ox * G::sw : 0;
            const std::int64_t kx1 = G::w + G::pl - ox * G::sw < G::kw ? G::w + G::pl - ox * G::sw : G::kw;
            T best[G::c];
            std::int32_t where[G::c];
            {
                const T* s = xn + ((oy * G::sh - G::pt + ky0) * G::w + (ox * G::sw - G::pl + kx0)) * G::c;
                for (std::int64_t ci = 0; ci < G::c; ++ci) {
                    best[ci] = s[ci];
                    where[ci] = std::int32_t(ky0 * G::kw + kx0);
                }
            }
            for (std::int64_t ky = ky0; ky < ky1; ++ky)
                for (std::int64_t kx = kx0; kx < kx1; ++kx) {
                    if (ky == ky0 && kx == kx0) continue;
                    const T* s = xn + ((oy * G::sh - G::pt + ky) * G::w + (ox * G::sw - G::pl + kx)) * G::c;
                    const auto k = std::int32_t(ky * G::kw + kx);
                    for (std::int64_t ci = 0; ci < G::c; ++ci) {
                        // A mask rather than a second select: GCC if-converts (vectorises) this form.
                        // A NaN is taken and then kept (nothing compares greater than it), so a
                        // window holding a NaN gives NaN, with its position as the maximum's.
                        const T v = s[ci], old = best[ci];
                        const bool take = (v > old) | (v != v);
                        const std::int32_t more = -std::int32_t(take);
                        best[ci] = take ? v : old;
                        where[ci] = (k & more) | (where[ci] & ~more);
                    }
                }
            for (std::int64_t ci = 0; ci < G::c; ++ci) yo[ci] = best[ci];
            if (arg)
                for (std::int64_t ci = 0; ci < G::c; ++ci) ao[ci] = where[ci];
        }
    }
};

// Forward, CUDA form: one thread per output value (`I`: the index type for_each_index chose,
// 32-bit where it can; see Im2ColElements).
template <class T, class G>
struct MaxPoolElements {
    const T* x;
    T* y;
    std::int32_t* arg;
    template <class I>
    STRATA_HD void operator()(I i) const {
        constexpr I c = I(G::c), ow = I(G::ow), oh = I(G::oh), h = I(G::h), w = I(G::w);
        const I ci = i % c, ox = (i / c) % ow, oy = (i / (c * ow)) % oh;
        const I n = i / (c * ow * oh);
        bool first = true;
        T best = T(0);
        std::int32_t where = 0;
        for (I ky = 0; ky < I(G::kh); ++ky) {
            const I iy = oy * I(G::sh) - I(G::pt) + ky;
            if (iy < 0 || iy >= h) continue;
            for (I kx = 0; kx < I(G::kw); ++kx) {
                const I ix = ox * I(G::sw) - I(G::pl) + kx;
                if (ix < 0 || ix >= w) continue;
                const T v = x[((n * h + iy) * w + ix) * c + ci];
                if (first || v > best || v != v) {  // a NaN is taken and kept, as on the host
                    best = v;
                    where = std::int32_t(ky * I(G::kw) + kx);
                    first = false;
                }
            }
        }
        y[i] = best;
        if (arg) arg[i] = where;
    }
};

// Backward, host form: one unit is one input row (n, iy), owned by one thread. Each input pixel
// gathers, over the windows covering it in a fixed order (ky, kx), the gradients of the channels
// whose recorded maximum it is, in a local accumulator: no atomics, no zeroing pass, and the
// result does not depend on the thread count. The local arrays also let the compiler vectorise
// the channel loops without runtime alias checks (which GCC does not emit at -O2).
//
// With `Act` other than Linear and `y` (this layer's output) given, each gradient that reaches an
// input pixel is multiplied by the derivative of the previous layer's activation at that pixel:
// Act::grad(y, g), since the pixel that receives a window's gradient holds that window's
// maximum, y (Conv2D's fused backward; windows that do not overlap only, so that each pixel
// receives at most one gradient and the product is the same as applying Act's derivative after).
template <class T, class G, class Act = Linear>
struct MaxPoolBackwardRows {
    const T* dy;
    const std::int32_t* arg;
    T* dx;
    const T* y = nullptr;
    STRATA_HD void operator()(std::int64_t r) const {
        const std::int64_t n = r / G::h, iy = r % G::h;
        T* row = dx + r * (G::w * G::c);
        if constexpr (G::sh >= G::kh && G::sw >= G::kw) {
            // Windows do not overlap (MaxPooling2D<2>): a pixel lies in at most one window, found
            // by division rather than by trying every window position.
            const std::int64_t ky = (iy + G::pt) % G::sh, oy = (iy + G::pt) / G::sh;
            for (std::int64_t ix = 0; ix < G::w; ++ix) {
                const std::int64_t kx = (ix + G::pl) % G::sw, ox = (ix + G::pl) / G::sw;
                T out[G::c];
                if (ky < G::kh && oy < G::oh && kx < G::kw && ox < G::ow) {
                    const std::int64_t o = ((n * G::oh + oy) * G::ow + ox) * G::c;
                    const auto k = std::int32_t(ky * G::kw + kx);
                    if constexpr (std::is_same_v<Act, Linear>) {
                        for (std::int64_t ci = 0; ci < G::c; ++ci) {
                            const T g = dy[o + ci];
                            out[ci] = arg[o + ci] == k ? g : T(0);
                        }
                    } else {
                        for (std::int64_t ci = 0; ci < G::c; ++ci) {
                            const T g = Act::grad(y[o + ci], dy[o + ci]);
                            out[ci] = arg[o + ci] == k ? g : T(0);
                        }
                    }
                } else {
                    for (std::int64_t ci = 0; ci < G::c; ++ci) out[ci] = T(0);
                }
                for (std::int64_t ci = 0; ci < G::c; ++ci) row[ix * G::c + ci] = out[ci];
            }
        } else {
            static_assert(std::is_same_v<Act, Linear>, "MaxPoolBackwardRows: an activation is fused only where windows do not overlap");
            gather(n, iy, row);
        }
    }

    STRATA_HD void gather(std::int64_t n, std::int64_t iy, T* row) const {
        for (std::int64_t ix = 0; ix < G::w; ++ix) {
            T acc[G::c];
            for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] = T(0);
            for (std::int64_t ky = 0; ky < G::kh; ++ky) {
                const std::int64_t ty = iy + G::pt - ky;
                if (ty < 0 || ty % G::sh != 0 || ty / G::sh >= G::oh) continue;
                for (std::int64_t kx = 0; kx < G::kw; ++kx) {
                    const std::int64_t tx = ix + G::pl - kx;
                    if (tx < 0 || tx % G::sw != 0 || tx / G::sw >= G::ow) continue;
                    const std::int64_t o = ((n * G::oh + ty / G::sh) * G::ow + tx / G::sw) * G::c;
                    const auto k = std::int32_t(ky * G::kw + kx);
                    for (std::int64_t ci = 0; ci < G::c; ++ci) {
                        const T g = dy[o + ci];
                        acc[ci] += arg[o + ci] == k ? g : T(0);
                    }
                }
            }
            for (std::int64_t ci = 0; ci < G::c; ++ci) row[ix * G::c + ci] = acc[ci];
        }
    }
};

// Backward, CUDA form: one thread per input value gathers from the windows covering it (`I` as
// in MaxPoolElements) the gradients of those whose recorded maximum it is.
template <class T, class G>
struct MaxPoolBackwardElements {
    const T* dy;
    const std::int32_t* arg;
    T* dx;
    template <class I>
    STRATA_HD void operator()(I i) const {
        const I ci = i % I(G::c);
        T s = T(0);
        for_covering_windows<G>(i, [&](I ky, I kx, I p) {
            const I o = p * I(G::c) + ci;
            if (arg[o] == std::int32_t(ky * I(G::kw) + kx)) s += dy[o];
        });
        dx[i] = s;
    }
};

template <class Spec, class In, class T, class P>
class MaxPooling2DImpl;

}  // namespace detail

/// Max pooling over PoolH×PoolW windows with strides StrideH, StrideW (Keras's
/// `MaxPooling2D(pool_size=(ph, pw), strides=(sh, sw), padding=...)`).
///
/// Requires: the input is an image, rank 3 per example (height, width, channels); with
/// `Padding::Valid` it is at least PoolH×PoolW. Otherwise the model does not compile, with
/// `LayerShapeError<MaxPooling2DRect<...>, Expected, Found>` in the message.
/// Ensures: output [n, oh, ow, c] (see `Padding`), the maximum of each window over its
/// positions inside the image; no parameters. The gradient of a window goes to its first
/// maximum in row-major window order. A window holding a NaN gives NaN (never the largest of
/// its other values), and its gradient goes to that NaN's position (its last NaN).
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<7, 9, 3>, MaxPooling2DRect<3, 2, 2, 2, Padding::Same>>;
/// static_assert(std::is_same_v<Net::output_shape, strata::StaticShape<4, 5, 3>>);
/// \endcode
template <std::int64_t PoolH, std::int64_t PoolW, std::int64_t StrideH, std::int64_t StrideW, Padding Pad>
struct MaxPooling2DRect {
    static_assert(PoolH >= 1 && PoolW >= 1, "strata::nn::MaxPooling2DRect<PoolH, PoolW>: window extents must be >= 1");
    static_assert(StrideH >= 1 && StrideW >= 1, "strata::nn::MaxPooling2DRect<..., StrideH, StrideW>: strides must be >= 1");
    static constexpr const char* name = "MaxPooling2D";
    static constexpr const char* keras_name = "max_pooling2d";
    static constexpr std::int64_t pool_h = PoolH, pool_w = PoolW, stride_h = StrideH, stride_w = StrideW;
    static constexpr Padding padding = Pad;
    template <class In, class T, class P>
    using bind = detail::MaxPooling2DImpl<MaxPooling2DRect, In, T, P>;
};

/// Max pooling over Pool×Pool windows with stride `Stride` (default `Pool`: windows tile the
/// image): Keras's `MaxPooling2D(Pool, strides=Stride, padding=...)`. Everything else is as in
/// `MaxPooling2DRect`.
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<11, 11, 64>, MaxPooling2D<2>>;           // -> (5, 5, 64)
/// using Overlapping = Sequential<Input<13, 13, 8>, MaxPooling2D<3, 2>>;  // -> (6, 6, 8)
/// \endcode
template <std::int64_t Pool, std::int64_t Stride, Padding Pad>
struct MaxPooling2D {
    static_assert(Pool >= 1, "strata::nn::MaxPooling2D<Pool>: Pool must be >= 1");
    static_assert(Stride >= 1, "strata::nn::MaxPooling2D<Pool, Stride>: Stride must be >= 1");
    static constexpr const char* name = "MaxPooling2D";
    static constexpr const char* keras_name = "max_pooling2d";
    static constexpr std::int64_t pool_h = Pool, pool_w = Pool, stride_h = Stride, stride_w = Stride;
    static constexpr Padding padding = Pad;
    template <class In, class T, class P>
    using bind = detail::MaxPooling2DImpl<MaxPooling2D, In, T, P>;
};

namespace detail {

/// The bound max pooling (see strata/nn/layer.hpp). It owns the int32 argmax workspace, which
/// grows to the largest batch seen and is then reused.
template <class Spec, class In, class T, class P>
class MaxPooling2DImpl {
    using G = Window2D<In, Spec::pool_h, Spec::pool_w, Spec::stride_h, Spec::stride_w, Spec::padding>;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<3>, In, G::rank_ok>::value,
                  "strata::nn::MaxPooling2D: the input must be an image, rank 3 per example (height, width, channels)");
    static_assert(LayerShapeError<Spec, AtLeastSpatial<Spec::pool_h, Spec::pool_w>, In, !G::rank_ok || G::fits>::value,
                  "strata::nn::MaxPooling2D: with Padding::Valid the image must be at least as large as the window; "
                  "use a smaller window or Padding::Same");

public:
    using input_shape = In;
    /// (When the shape check fails, the input shape passes through: one mistake, one error.)
    using output_shape = std::conditional_t<G::rank_ok && G::fits, StaticShape<G::oh, G::ow, G::c>, In>;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    /// Inference (`mode.training` false) records no positions: only backward needs them.
    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        std::int32_t* arg = nullptr;
        if (mode.training) {
            arg_.resize(Shape{n * output_shape::size});
            arg = arg_.data();
        }
        if constexpr (elementwise_place<P>)
            for_each_index<P>(y.size(), MaxPoolElements<T, G>{x.data(), y.data(), arg}, x.size());
        else
            for_each_index<P>(n * G::oh, MaxPoolRows<T, G>{x.data(), y.data(), arg});
        arg_of_ = mode.training ? x.data() : nullptr;
        arg_batch_ = mode.training ? n : -1;
    }

    /// Host: the forward pass of images [first, first + count) of the batch, whose input images
    /// start at `x` (a Conv2D before this layer hands over each chunk of its output while it is
    /// in cache, possibly from a scratch buffer). `y` is the whole batch's output. Called for
    /// every image of the batch, from the threads of one team, between forward_begin and
    /// forward_done.
    void forward_images(const T* x, std::int64_t first, std::int64_t count, T* y, const Mode& mode) {
        std::int32_t* arg = mode.training ? arg_.data() + first * output_shape::size : nullptr;
        const MaxPoolRows<T, G> f{x, y + first * output_shape::size, arg};
        for (std::int64_t r = 0; r < count * G::oh; ++r) f(r);
    }
    /// Before forward_images on a batch of `n` (sizes the positions' workspace).
    void forward_begin(std::int64_t n, const Mode& mode) {
        if (mode.training) arg_.resize(Shape{n * output_shape::size});
    }
    /// After forward_images covered the batch whose input is at `input`.
    void forward_done(const T* input, std::int64_t n, const Mode& mode) {
        arg_of_ = mode.training ? input : nullptr;
        arg_batch_ = mode.training ? n : -1;
    }

    /// Sizes (and touches) the positions' workspace for training batches of `n` (Network::reserve).
    void reserve(std::int64_t n, bool training) {
        if (!training) return;
        arg_.resize(Shape{n * output_shape::size});
        if constexpr (place::host_accessible_v<P>)
            std::memset(static_cast<void*>(arg_.data()), 0, std::size_t(arg_.size()) * sizeof(std::int32_t));
    }

    /// Whether backward_images can fold the previous layer's activation `Act` in: on the host,
    /// where windows do not overlap (each input pixel gets at most one window's gradient).
    template <class Act>
    static constexpr bool fuses_activation_grad = !elementwise_place<P> && !Act::rowwise && G::sh >= G::kh && G::sw >= G::kw;

    /// Host: the gradient w.r.t. the input of images [first, first + count) of the batch, written
    /// to `dx` (those images' input gradient only), each value multiplied by the derivative of
    /// the previous layer's activation `Act` there (see MaxPoolBackwardRows). `y` and `dy` are the
    /// whole batch's output and output gradient. A Conv2D before this layer calls it for each
    /// chunk of its backward pass, after a forward that ran through forward_images: the chunk's
    /// gradient is made in cache, and the batch's input gradient is never stored.
    /// With `db`, the channel sums of the gradient written are added to db[0, c) (the previous
    /// layer's bias gradient), each row summed while it is in L1, in the order of the pixels.
    template <class Act>
    void backward_images(const T* y, const T* dy, std::int64_t first, std::int64_t count, T* dx, accumulate_t<T>* db) const
        requires fuses_activation_grad<Act>
    {
        const std::int64_t o = first * output_shape::size;
        const MaxPoolBackwardRows<T, G, Act> f{dy + o, arg_.data() + o, dx, y + o};
        accumulate_t<T> acc[G::c];
        for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] = 0;
        for (std::int64_t r = 0; r < count * G::h; ++r) {
            f(r);
            if (!db) continue;
            const T* row = dx + r * (G::w * G::c);
            for (std::int64_t ix = 0; ix < G::w; ++ix)
                for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] += accumulate_t<T>(row[ix * G::c + ci]);
        }
        if (db)
            for (std::int64_t ci = 0; ci < G::c; ++ci) db[ci] += acc[ci];
    }

    void backward(const T* params, T*, const TensorView<T, P>& x, const TensorView<T, P>& y,
                  const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode) {
        if (dx.empty()) return;
        // The positions are those of the forward pass on this input; recompute them if another
        // input went through the layer since.
        if (arg_of_ != x.data() || arg_batch_ != x.dim(0)) {
            Mode recording = mode;
            recording.training = true;
            forward(params, x, y, recording);
        }
        const std::int64_t n = x.dim(0);
        if constexpr (elementwise_place<P>)
            for_each_index<P>(dx.size(), MaxPoolBackwardElements<T, G>{dy.data(), arg_.data(), dx.data()}, dy.size());
        else
            for_each_index<P>(n * G::h, MaxPoolBackwardRows<T, G>{dy.data(), arg_.data(), dx.data()});
    }

private:
    Tensor<std::int32_t, P> arg_;
    const T* arg_of_ = nullptr;
    std::int64_t arg_batch_ = -1;
};

}  // namespace detail

}  // namespace strata::nn
