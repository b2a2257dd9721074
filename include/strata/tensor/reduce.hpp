#pragma once
/// \file strata/tensor/reduce.hpp
/// Reductions (sum, mean, max, min, argmax) over a whole tensor or along one axis, and softmax.
///
/// Accuracy: float data is accumulated in double, so the sum of 2^24 copies of 1.5f is exact
/// and a sum of 10^7 floats is within ~1e-9 relative of the float64 sum. The grouping of the
/// partial sums depends only on the shape (never on the thread count), so results are
/// reproducible run to run.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "strata/tensor/ops.hpp"

#include <thrust/extrema.h>
#include <thrust/functional.h>
#include <thrust/transform_reduce.h>

namespace strata {

/// The type reductions accumulate `T` in: double for floating point, int64 for integers.
template <class T>
using accumulate_t = std::conditional_t<std::is_floating_point_v<T>, double, std::int64_t>;

namespace detail {
/// A grow-only scratch buffer per thread and place: reductions need a few partial results and
/// must not allocate in a training step's steady state.
/// `Tag` keeps unrelated users apart: each (T, P, Tag) has its own buffer.
template <class T, class P, class Tag = void>
T* scratch(std::int64_t n) {
    thread_local Tensor<T, P> buffer;
    if (std::int64_t(buffer.capacity()) < n) buffer.resize(Shape{n});
    return buffer.data();
}

template <class T>
struct Widen { STRATA_HD accumulate_t<T> operator()(T x) const { return accumulate_t<T>(x); } };

enum class Reduction { Sum, Mean, Max, Min };

// Rows of a [len, inner] slab are summed in fixed blocks so that the work parallelises over
// blocks while the grouping stays independent of the thread count.
template <class T>
struct BlockColumnSums {
    const T* x;
    accumulate_t<T>* partial;
    std::int64_t len, inner, block_rows;
    STRATA_HD void operator()(std::int64_t b) const {
        accumulate_t<T>* acc = partial + b * inner;
        for (std::int64_t i = 0; i < inner; ++i) acc[i] = 0;
        const std::int64_t first = b * block_rows;
        const std::int64_t last = first + block_rows < len ? first + block_rows : len;
        for (std::int64_t r = first; r < last; ++r) {
            const T* row = x + r * inner;
            for (std::int64_t i = 0; i < inner; ++i) acc[i] += row[i];
        }
    }
};
template <class T>
struct CombineBlocks {
    const accumulate_t<T>* partial;
    T* out;
    std::int64_t blocks, inner;
    double scale;
    STRATA_HD void operator()(std::int64_t i) const {
        accumulate_t<T> s = 0;
        for (std::int64_t b = 0; b < blocks; ++b) s += partial[b * inner + i];
        out[i] = T(double(s) * scale);
    }
};
template <class T>
struct AxisReduce {
    const T* x;
    T* out;
    std::int64_t len, inner;
    Reduction op;
    STRATA_HD void operator()(std::int64_t j) const {
        const std::int64_t o = j / inner, i = j % inner;
        const T* p = x + o * len * inner + i;
        if (op == Reduction::Max || op == Reduction::Min) {
            T best = p[0];
            for (std::int64_t k = 1; k < len; ++k) {
                const T v = p[k * inner];
                best = (op == Reduction::Max) ? (v > best ? v : best) : (v < best ? v : best);
            }
            out[j] = best;
        } else {
            accumulate_t<T> s = 0;
            for (std::int64_t k = 0; k < len; ++k) s += p[k * inner];
            out[j] = op == Reduction::Mean ? T(double(s) / double(len)) : T(s);
        }
    }
};
template <class T>
struct RowArgmax {
    const T* x;
    std::int32_t* out;
    std::int64_t cols;
    STRATA_HD void operator()(std::int64_t r) const {
        const T* row = x + r * cols;
        std::int64_t best = 0;
        for (std::int64_t c = 1; c < cols; ++c)
            if (row[c] > row[best]) best = c;
        out[r] = std::int32_t(best);
    }
};
template <class T>
struct RowSoftmax {
    const T* x;
    T* out;
    std::int64_t cols;
    STRATA_HD void operator()(std::int64_t r) const {
        const T* in = x + r * cols;
        T* o = out + r * cols;
        T m = in[0];
        for (std::int64_t c = 1; c < cols; ++c) m = in[c] > m ? in[c] : m;
        accumulate_t<T> s = 0;
        for (std::int64_t c = 0; c < cols; ++c) {
            using std::exp;
            const T e = exp(in[c] - m);
            o[c] = e;
            s += e;
        }
        const T inv = T(1.0 / double(s));
        for (std::int64_t c = 0; c < cols; ++c) o[c] *= inv;
    }
};

template <class T, class P>
void reduce_axis_impl(const TensorView<T, P>& x, int axis, const TensorView<T, P>& out, Reduction op, const char* name) {
    const int r = x.rank();
    STRATA_CHECK(r >= 1, ShapeError, name, ": a rank-0 tensor has no axis ", axis);
    const int a = axis < 0 ? axis + r : axis;
    STRATA_CHECK(a >= 0 && a < r, ShapeError, name, ": axis ", axis, " is out of range for shape ", x.shape());
    const std::int64_t outer = x.shape().product(0, a), len = x.shape()[a], inner = x.shape().product(a + 1, r);
    STRATA_CHECK(out.size() == outer * inner, ShapeError, name, ": reducing axis ", a, " of ", x.shape(), " gives ",
                 outer * inner, " elements, but the output has shape ", out.shape());
    if (outer * inner == 0) return;
    STRATA_CHECK(len > 0 || op == Reduction::Sum, ShapeError, name, ": cannot take the ",
                 op == Reduction::Mean ? "mean" : "max/min", " of an empty axis of ", x.shape());
    if (outer == 1 && (op == Reduction::Sum || op == Reduction::Mean) && len >= 256) {
        // Column sums of a tall slab (bias gradients): contiguous rows in fixed blocks.
        const std::int64_t blocks = 64, block_rows = (len + blocks - 1) / blocks;
        auto* partial = scratch<accumulate_t<T>, P>(blocks * inner);
        thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), blocks,
                           BlockColumnSums<T>{x.data(), partial, len, inner, block_rows});
        thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), inner,
                           CombineBlocks<T>{partial, out.data(), blocks, inner,
                                            op == Reduction::Mean ? 1.0 / double(len) : 1.0});
        return;
    }
    thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), outer * inner,
                       AxisReduce<T>{x.data(), out.data(), len, inner, op});
}
}  // namespace detail

namespace detail {
struct SumScratchTag {};
inline constexpr std::int64_t sum_block = 16384;
// One block of a whole-tensor sum, with eight independent accumulators so the additions do not
// wait on each other (a single running total is latency-bound: several times below memory
// bandwidth).
template <class T>
struct BlockSum {
    const T* x;
    accumulate_t<T>* partial;
    std::int64_t n;
    STRATA_HD void operator()(std::int64_t b) const {
        const std::int64_t first = b * sum_block;
        const std::int64_t last = first + sum_block < n ? first + sum_block : n;
        accumulate_t<T> a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::int64_t i = first;
        for (; i + 8 <= last; i += 8)
            for (int k = 0; k < 8; ++k) a[k] += accumulate_t<T>(x[i + k]);
        for (; i < last; ++i) a[0] += accumulate_t<T>(x[i]);
        partial[b] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    }
};
}  // namespace detail

/// Sum of all elements, accumulated in `accumulate_t<T>` (double for float).
///
/// On the host: fixed blocks of 16384 elements, each summed with eight accumulators, then the
/// block sums added in order. The grouping depends only on the size, so the result is the same
/// for any number of threads, and nothing is allocated after the first call of a given size.
template <class T, class P>
accumulate_t<T> sum(const TensorView<T, P>& x) {
    if (x.size() == 0) return 0;
    if constexpr (place::host_accessible_v<P>) {
        const std::int64_t blocks = (x.size() + detail::sum_block - 1) / detail::sum_block;
        auto* partial = detail::scratch<accumulate_t<T>, P, detail::SumScratchTag>(blocks);
        if (blocks == 1) {
            detail::BlockSum<T>{x.data(), partial, x.size()}(0);
        } else {
            thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), blocks,
                               detail::BlockSum<T>{x.data(), partial, x.size()});
        }
        accumulate_t<T> total = 0;
        for (std::int64_t b = 0; b < blocks; ++b) total += partial[b];
        return total;
    } else {
        return thrust::transform_reduce(P::policy(), x.data(), x.data() + x.size(), detail::Widen<T>{},
                                        accumulate_t<T>(0), thrust::plus<accumulate_t<T>>());
    }
}

/// Mean of all elements; ValueError for an empty tensor.
template <class T, class P>
double mean(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "mean: the tensor of shape ", x.shape(), " is empty");
    return double(sum(x)) / double(x.size());
}

/// Largest element; ValueError for an empty tensor.
template <class T, class P>
T max(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "max: the tensor of shape ", x.shape(), " is empty");
    return thrust::reduce(P::policy(), x.data(), x.data() + x.size(), std::numeric_limits<T>::lowest(), thrust::maximum<T>());
}

/// Smallest element; ValueError for an empty tensor.
template <class T, class P>
T min(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "min: the tensor of shape ", x.shape(), " is empty");
    return thrust::reduce(P::policy(), x.data(), x.data() + x.size(), std::numeric_limits<T>::max(), thrust::minimum<T>());
}

/// Flat index of the first largest element; ValueError for an empty tensor.
template <class T, class P>
std::int64_t argmax(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "argmax: the tensor of shape ", x.shape(), " is empty");
    return thrust::max_element(P::policy(), x.data(), x.data() + x.size()) - x.data();
}

/// Sums along `axis` (negative counts from the end); `out` holds the remaining extents in order.
template <class T, class P>
void sum(const TensorView<T, P>& x, int axis, const TensorView<T, P>& out) { detail::reduce_axis_impl(x, axis, out, detail::Reduction::Sum, "sum"); }
/// Means along `axis`.
template <class T, class P>
void mean(const TensorView<T, P>& x, int axis, const TensorView<T, P>& out) { detail::reduce_axis_impl(x, axis, out, detail::Reduction::Mean, "mean"); }
/// Maxima along `axis`.
template <class T, class P>
void max(const TensorView<T, P>& x, int axis, const TensorView<T, P>& out) { detail::reduce_axis_impl(x, axis, out, detail::Reduction::Max, "max"); }
/// Minima along `axis`.
template <class T, class P>
void min(const TensorView<T, P>& x, int axis, const TensorView<T, P>& out) { detail::reduce_axis_impl(x, axis, out, detail::Reduction::Min, "min"); }

/// Index of the first maximum of each row of `x` seen as [rows, last extent].
template <class T, class P>
void argmax_rows(const TensorView<T, P>& x, const TensorView<std::int32_t, P>& out) {
    STRATA_CHECK(x.rank() >= 1 && x.dim(-1) > 0, ShapeError, "argmax_rows: cannot take the argmax of rows of ", x.shape());
    const std::int64_t cols = x.dim(-1), rows = x.size() / cols;
    STRATA_CHECK(out.size() == rows, ShapeError, "argmax_rows: ", rows, " rows of ", x.shape(), " need ", rows,
                 " outputs, but the output has shape ", out.shape());
    if (rows) thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), rows, detail::RowArgmax<T>{x.data(), out.data(), cols});
}

/// Softmax along the last axis, numerically stable (the row maximum is subtracted first).
/// `out` may be `x`.
template <class T, class P>
void softmax(const TensorView<T, P>& x, const TensorView<T, P>& out) {
    static_assert(std::is_floating_point_v<T>, "strata::softmax: T must be float or double");
    detail::check_same_size("softmax", x, out);
    STRATA_CHECK(x.rank() >= 1 && x.dim(-1) > 0, ShapeError, "softmax: cannot normalise the last axis of ", x.shape());
    const std::int64_t cols = x.dim(-1), rows = x.size() / cols;
    if (rows) thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), rows, detail::RowSoftmax<T>{x.data(), out.data(), cols});
}

}  // namespace strata
