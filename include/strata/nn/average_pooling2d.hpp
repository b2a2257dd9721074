#pragma once
/// \file strata/nn/average_pooling2d.hpp
/// `AveragePooling2D<Pool, Stride, Pad>` (square window and stride),
/// `AveragePooling2DRect<PoolH, PoolW, StrideH, StrideW, Pad>` and `GlobalAveragePooling2D`:
/// the mean of each window (or of the whole image) of each channel of NHWC images, with
/// Keras's semantics (stride defaults to the pool size; "same" windows average over their
/// positions inside the image only, as TensorFlow does).
///
/// Each output is the sum of its window's values in accumulate_t<T> (double for float), taken
/// in row-major window order, divided by the number of positions summed and rounded to T once.
/// The backward pass is owned by the input: each input value sums, in the same order, the
/// gradients of the windows covering it, each divided by its window's count. The host forms
/// (one unit per output or input row) and the GPU forms (one thread per output or input value)
/// take the same terms in the same order, so they give the same bits.

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {

// The number of positions of window (oy, ox) inside the image (all kh·kw of them with
// Padding::Valid; fewer at a "same" border).
template <class G, class I>
STRATA_HD I window_count(I oy, I ox) {
    const I y0 = oy * I(G::sh) - I(G::pt), x0 = ox * I(G::sw) - I(G::pl);
    const I y1 = y0 + I(G::kh) < I(G::h) ? y0 + I(G::kh) : I(G::h), x1 = x0 + I(G::kw) < I(G::w) ? x0 + I(G::kw) : I(G::w);
    return ((y1) - (y0 > 0 ? y0 : I(0))) * ((x1) - (x0 > 0 ? x0 : I(0)));
}

// Forward, host form: one unit is one output row (n, oy). Each window sums over its positions
// inside the image into a local array over the channels (contiguous in NHWC), then stores the
// means once.
template <class T, class G>
struct AvgPoolRows {
    const T* x;
    T* y;
    STRATA_HD void operator()(std::int64_t r) const {
        using A = accumulate_t<T>;
        const std::int64_t n = r / G::oh, oy = r % G::oh;
        const T* xn = x + n * (G::h * G::w * G::c);
        T* yo = y + r * (G::ow * G::c);
        const std::int64_t ky0 = G::pt - oy * G::sh > 0 ? G::pt - oy * G::sh : 0;
        const std::int64_t ky1 = G::h + G::pt - oy * G::sh < G::kh ? G::h + G::pt - oy * G::sh : G::kh;
        for (std::int64_t ox = 0; ox < G::ow; ++ox, yo += G::c) {
            const std::int64_t kx0 = G::pl - ox * G::sw > 0 ? G::pl - ox * G::sw : 0;
            const std::int64_t kx1 = G::w + G::pl - ox * G::sw < G::kw ? G::w + G::pl - ox * G::sw : G::kw;
            A acc[G::c];
            for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] = A(0);
            for (std::int64_t ky = ky0; ky < ky1; ++ky)
                for (std::int64_t kx = kx0; kx < kx1; ++kx) {
                    const T* s = xn + ((oy * G::sh - G::pt + ky) * G::w + (ox * G::sw - G::pl + kx)) * G::c;
                    for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] += A(s[ci]);
                }
            const A count = A((ky1 - ky0) * (kx1 - kx0));
            for (std::int64_t ci = 0; ci < G::c; ++ci) yo[ci] = T(acc[ci] / count);
        }
    }
};

// Forward, CUDA form: one thread per output value (`I`: the index type for_each_index chose,
// 32-bit where it can; see Im2ColElements), the window's terms in the host form's order.
template <class T, class G>
struct AvgPoolElements {
    const T* x;
    T* y;
    template <class I>
    STRATA_HD void operator()(I i) const {
        using A = accumulate_t<T>;
        constexpr I c = I(G::c), ow = I(G::ow), oh = I(G::oh), h = I(G::h), w = I(G::w);
        const I ci = i % c, ox = (i / c) % ow, oy = (i / (c * ow)) % oh;
        const I n = i / (c * ow * oh);
        A acc = A(0);
        for (I ky = 0; ky < I(G::kh); ++ky) {
            const I iy = oy * I(G::sh) - I(G::pt) + ky;
            if (iy < 0 || iy >= h) continue;
            for (I kx = 0; kx < I(G::kw); ++kx) {
                const I ix = ox * I(G::sw) - I(G::pl) + kx;
                if (ix < 0 || ix >= w) continue;
                acc += A(x[((n * h + iy) * w + ix) * c + ci]);
            }
        }
        y[i] = T(acc / A(window_count<G>(oy, ox)));
    }
};

// Backward, host form: one unit is one input row (n, iy), owned by one thread. Each input pixel
// gathers, over the windows covering it in a fixed order (ky, kx), each window's gradient
// divided by its count, in a local accumulator over its channels: no atomics, no zeroing pass,
// and a result that does not depend on the thread count.
template <class T, class G>
struct AvgPoolBackwardRows {
    const T* dy;
    T* dx;
    STRATA_HD void operator()(std::int64_t r) const {
        using A = accumulate_t<T>;
        const std::int64_t n = r / G::h, iy = r % G::h;
        T* row = dx + r * (G::w * G::c);
        for (std::int64_t ix = 0; ix < G::w; ++ix) {
            A acc[G::c];
            for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] = A(0);
            for (std::int64_t ky = 0; ky < G::kh; ++ky) {
                const std::int64_t ty = iy + G::pt - ky;
                if (ty < 0 || ty % G::sh != 0 || ty / G::sh >= G::oh) continue;
                for (std::int64_t kx = 0; kx < G::kw; ++kx) {
                    const std::int64_t tx = ix + G::pl - kx;
                    if (tx < 0 || tx % G::sw != 0 || tx / G::sw >= G::ow) continue;
                    const std::int64_t oy = ty / G::sh, ox = tx / G::sw;
                    const T* s = dy + ((n * G::oh + oy) * G::ow + ox) * G::c;
                    const A count = A(window_count<G>(oy, ox));
                    for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] += A(s[ci]) / count;
                }
            }
            for (std::int64_t ci = 0; ci < G::c; ++ci) row[ix * G::c + ci] = T(acc[ci]);
        }
    }
};

// Backward, CUDA form: one thread per input value gathers from the windows covering it (in the
// host form's order) their gradients divided by their counts.
template <class T, class G>
struct AvgPoolBackwardElements {
    const T* dy;
    T* dx;
    template <class I>
    STRATA_HD void operator()(I i) const {
        using A = accumulate_t<T>;
        const I ci = i % I(G::c);
        A s = A(0);
        for_covering_windows<G>(i, [&](I, I, I p) {
            const I ox = p % I(G::ow), oy = (p / I(G::ow)) % I(G::oh);
            s += A(dy[p * I(G::c) + ci]) / A(window_count<G>(oy, ox));
        });
        dx[i] = T(s);
    }
};

/// The per-example geometry of a global pooling over an image of shape `In` = (h, w, c); when
/// `In` is not rank 3, `rank_ok` is false and the extents are placeholders.
template <class In>
struct GlobalPool {
    static constexpr bool rank_ok = In::rank == 3;
    static constexpr std::int64_t h = extent_or_one<In>(0), w = extent_or_one<In>(1), c = extent_or_one<In>(2);
    static constexpr std::int64_t pixels = h * w;
};

// Global average pooling, forward, host form: one unit is one example, whose pixels are summed
// in order into a local array over the channels.
template <class T, class G>
struct GlobalAvgPoolRows {
    const T* x;
    T* y;
    STRATA_HD void operator()(std::int64_t n) const {
        using A = accumulate_t<T>;
        const T* xn = x + n * (G::pixels * G::c);
        A acc[G::c];
        for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] = A(0);
        for (std::int64_t p = 0; p < G::pixels; ++p)
            for (std::int64_t ci = 0; ci < G::c; ++ci) acc[ci] += A(xn[p * G::c + ci]);
        for (std::int64_t ci = 0; ci < G::c; ++ci) y[n * G::c + ci] = T(acc[ci] / A(G::pixels));
    }
};

// Global average pooling, forward, CUDA form: one thread per output value (n, c) sums its
// channel's pixels in the host form's order (neighbouring threads read neighbouring channels).
template <class T, class G>
struct GlobalAvgPoolElements {
    const T* x;
    T* y;
    template <class I>
    STRATA_HD void operator()(I i) const {
        using A = accumulate_t<T>;
        const I ci = i % I(G::c), n = i / I(G::c);
        const T* xn = x + n * I(G::pixels * G::c) + ci;
        A acc = A(0);
        for (I p = 0; p < I(G::pixels); ++p) acc += A(xn[p * I(G::c)]);
        y[i] = T(acc / A(G::pixels));
    }
};

// Global average pooling, backward, host form: one unit is one input row (n, iy); each value
// gets its channel's gradient divided by the pixel count.
template <class T, class G>
struct GlobalAvgPoolBackwardRows {
    const T* dy;
    T* dx;
    STRATA_HD void operator()(std::int64_t r) const {
        using A = accumulate_t<T>;
        const std::int64_t n = r / G::h;
        T g[G::c];
        for (std::int64_t ci = 0; ci < G::c; ++ci) g[ci] = T(A(dy[n * G::c + ci]) / A(G::pixels));
        T* row = dx + r * (G::w * G::c);
        for (std::int64_t ix = 0; ix < G::w; ++ix)
            for (std::int64_t ci = 0; ci < G::c; ++ci) row[ix * G::c + ci] = g[ci];
    }
};

// Global average pooling, backward, CUDA form: one thread per input value.
template <class T, class G>
struct GlobalAvgPoolBackwardElements {
    const T* dy;
    T* dx;
    template <class I>
    STRATA_HD void operator()(I i) const {
        using A = accumulate_t<T>;
        const I ci = i % I(G::c), n = i / I(G::pixels * G::c);
        dx[i] = T(A(dy[n * I(G::c) + ci]) / A(G::pixels));
    }
};

template <class Spec, class In, class T, class P>
class AveragePooling2DImpl;
template <class In, class T, class P>
class GlobalAveragePooling2DImpl;

}  // namespace detail

/// Average pooling over PoolH×PoolW windows with strides StrideH, StrideW (Keras's
/// `AveragePooling2D(pool_size=(ph, pw), strides=(sh, sw), padding=...)`).
///
/// Requires: the input is an image, rank 3 per example (height, width, channels); with
/// `Padding::Valid` it is at least PoolH×PoolW. Otherwise the model does not compile, with
/// `LayerShapeError<AveragePooling2DRect<...>, Expected, Found>` in the message.
/// Ensures: output [n, oh, ow, c] (see `Padding`: with Valid, out = floor((in − pool) / stride)
/// + 1), the mean of each window over its positions inside the image (a "same" window at the
/// border averages fewer values, as in Keras); no parameters. A window's gradient is shared
/// equally among its positions.
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<7, 9, 3>, AveragePooling2DRect<3, 2, 2, 2, Padding::Same>>;
/// static_assert(std::is_same_v<Net::output_shape, strata::StaticShape<4, 5, 3>>);
/// \endcode
template <std::int64_t PoolH, std::int64_t PoolW, std::int64_t StrideH, std::int64_t StrideW, Padding Pad>
struct AveragePooling2DRect {
    static_assert(PoolH >= 1 && PoolW >= 1, "strata::nn::AveragePooling2DRect<PoolH, PoolW>: window extents must be >= 1");
    static_assert(StrideH >= 1 && StrideW >= 1, "strata::nn::AveragePooling2DRect<..., StrideH, StrideW>: strides must be >= 1");
    static constexpr const char* name = "AveragePooling2D";
    static constexpr const char* keras_name = "average_pooling2d";
    static constexpr std::int64_t pool_h = PoolH, pool_w = PoolW, stride_h = StrideH, stride_w = StrideW;
    static constexpr Padding padding = Pad;
    template <class In, class T, class P>
    using bind = detail::AveragePooling2DImpl<AveragePooling2DRect, In, T, P>;
};

/// Average pooling over Pool×Pool windows with stride `Stride` (default `Pool`: windows tile the
/// image): Keras's `AveragePooling2D(Pool, strides=Stride, padding=...)`. Everything else is as
/// in `AveragePooling2DRect`.
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<11, 11, 64>, AveragePooling2D<2>>;            // -> (5, 5, 64)
/// using Overlapping = Sequential<Input<13, 13, 8>, AveragePooling2D<3, 2>>;   // -> (6, 6, 8)
/// \endcode
template <std::int64_t Pool, std::int64_t Stride, Padding Pad>
struct AveragePooling2D {
    static_assert(Pool >= 1, "strata::nn::AveragePooling2D<Pool>: Pool must be >= 1");
    static_assert(Stride >= 1, "strata::nn::AveragePooling2D<Pool, Stride>: Stride must be >= 1");
    static constexpr const char* name = "AveragePooling2D";
    static constexpr const char* keras_name = "average_pooling2d";
    static constexpr std::int64_t pool_h = Pool, pool_w = Pool, stride_h = Stride, stride_w = Stride;
    static constexpr Padding padding = Pad;
    template <class In, class T, class P>
    using bind = detail::AveragePooling2DImpl<AveragePooling2D, In, T, P>;
};

/// The mean of each channel over the whole image: [n, h, w, c] -> [n, c] (Keras's
/// `GlobalAveragePooling2D()`, channels last). The usual head of a residual network, in place of
/// Flatten before the classifier.
///
/// Requires: the input is an image, rank 3 per example; otherwise the model does not compile,
/// with `LayerShapeError<GlobalAveragePooling2D, AnyShapeOfRank<3>, Found>` in the message.
/// Ensures: output [n, c]; no parameters; each input value's gradient is its channel's output
/// gradient divided by h·w.
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<8, 8, 16>, GlobalAveragePooling2D, Dense<10, Softmax>>;
/// static_assert(Net::num_params == 16 * 10 + 10);
/// \endcode
struct GlobalAveragePooling2D {
    static constexpr const char* name = "GlobalAveragePooling2D";
    static constexpr const char* keras_name = "global_average_pooling2d";
    template <class In, class T, class P>
    using bind = detail::GlobalAveragePooling2DImpl<In, T, P>;
};

namespace detail {

/// The bound average pooling (see strata/nn/layer.hpp). It keeps no state: backward needs
/// neither the input nor the output, only the output gradient.
template <class Spec, class In, class T, class P>
class AveragePooling2DImpl {
    using G = Window2D<In, Spec::pool_h, Spec::pool_w, Spec::stride_h, Spec::stride_w, Spec::padding>;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<3>, In, G::rank_ok>::value,
                  "strata::nn::AveragePooling2D: the input must be an image, rank 3 per example (height, width, channels)");
    static_assert(LayerShapeError<Spec, AtLeastSpatial<Spec::pool_h, Spec::pool_w>, In, !G::rank_ok || G::fits>::value,
                  "strata::nn::AveragePooling2D: with Padding::Valid the image must be at least as large as the window; "
                  "use a smaller window or Padding::Same");

public:
    using input_shape = In;
    /// (When the shape check fails, the input shape passes through: one mistake, one error.)
    using output_shape = std::conditional_t<G::rank_ok && G::fits, StaticShape<G::oh, G::ow, G::c>, In>;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        if constexpr (elementwise_place<P>)
            for_each_index<P>(y.size(), AvgPoolElements<T, G>{x.data(), y.data()}, x.size());
        else
            for_each_index<P>(x.dim(0) * G::oh, AvgPoolRows<T, G>{x.data(), y.data()});
    }

    void backward(const T*, T*, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        if (dx.empty()) return;
        if constexpr (elementwise_place<P>)
            for_each_index<P>(dx.size(), AvgPoolBackwardElements<T, G>{dy.data(), dx.data()}, dy.size());
        else
            for_each_index<P>(x.dim(0) * G::h, AvgPoolBackwardRows<T, G>{dy.data(), dx.data()});
    }
};

/// The bound global average pooling (see strata/nn/layer.hpp); no state.
template <class In, class T, class P>
class GlobalAveragePooling2DImpl {
    using G = GlobalPool<In>;
    static_assert(LayerShapeError<GlobalAveragePooling2D, AnyShapeOfRank<3>, In, G::rank_ok>::value,
                  "strata::nn::GlobalAveragePooling2D: the input must be an image, rank 3 per example (height, width, "
                  "channels)");

public:
    using input_shape = In;
    using output_shape = std::conditional_t<G::rank_ok, StaticShape<G::c>, In>;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        if constexpr (elementwise_place<P>)
            for_each_index<P>(y.size(), GlobalAvgPoolElements<T, G>{x.data(), y.data()}, x.size());
        else
            for_each_index<P>(x.dim(0), GlobalAvgPoolRows<T, G>{x.data(), y.data()});
    }

    void backward(const T*, T*, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        if (dx.empty()) return;
        if constexpr (elementwise_place<P>)
            for_each_index<P>(dx.size(), GlobalAvgPoolBackwardElements<T, G>{dy.data(), dx.data()});
        else
            for_each_index<P>(x.dim(0) * G::h, GlobalAvgPoolBackwardRows<T, G>{dy.data(), dx.data()});
    }
};

}  // namespace detail

}  // namespace strata::nn
