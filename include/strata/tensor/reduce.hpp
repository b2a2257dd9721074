#pragma once
/// \file strata/tensor/reduce.hpp
/// Reductions (sum, mean, max, min, argmax) over a whole tensor or along one axis, and softmax.
///
/// Accuracy: float data is accumulated in double, so the sum of 2^24 copies of 1.5f is exact
/// and a sum of 10^7 floats is within ~1e-9 relative of the float64 sum. The grouping of the
/// partial sums depends only on the shape (never on the thread count), so results are
/// reproducible run to run.
///
/// ## Where the per-place choice lives (the one dispatch point)
/// An op written once over Thrust is only as parallel as its functor's decomposition: a functor
/// that gives each index a serial inner loop (64 column blocks, one thread per output) keeps
/// two host cores busy and starves a GPU (issue 18: the bias gradients' column sums were 95% of
/// a training step on an H100). So every axis reduction goes through `detail::reduce_axis_impl`,
/// which chooses by place, and nowhere else:
///
/// | op                                  | place::Host (unchanged, bit for bit)       | place::Cuda (nvcc only)                        |
/// |-------------------------------------|--------------------------------------------|------------------------------------------------|
/// | sum/mean along an axis, column sums | 64 row blocks + combine, or one index each | `detail::cuda_reduce`: tiles × row chunks, tree |
/// | max/min along an axis               | one index each, serial over the axis       | `detail::cuda_reduce` (same kernel)            |
/// | whole-tensor sum                    | 16384-element blocks, 8 accumulators       | thrust::transform_reduce (CUB device reduce)   |
/// | whole-tensor max/min/argmax         | place::transform_reduce / max_element      | the same, Thrust's (CUB device reduce)         |
/// | softmax / argmax of rows            | one row per index                          | one row per index (rows = batch; not reshaped) |
///
/// The host decompositions run through `detail::host_shaped_for_each`, which does not compile
/// for a place that is not host-accessible: a new op that reuses them for Cuda fails to build
/// instead of running 64 GPU threads. The Cuda kernels' launch shape is
/// `detail::cuda_reduce_shape`, a constexpr function of the tensor's shape only (never of the
/// GPU), so the grouping of partial sums, and therefore the result, is the same on every GPU
/// and the host tests check the shape (enough threads for a GPU of 132 SMs) without a GPU.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "strata/detail/dependent_false.hpp"
#include "strata/tensor/ops.hpp"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace strata {

/// The type reductions accumulate `T` in: double for floating point (the 16-bit floats of
/// core/half.hpp included: their sums must not truncate to an integer), int64 for integers.
template <class T>
using accumulate_t = std::conditional_t<std::is_floating_point_v<T> || detail::is_half_v<T>, double, std::int64_t>;

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
struct Identity { template <class T> STRATA_HD T operator()(T x) const { return x; } };
/// The larger / smaller of two, NaN when either is (so associative and commutative with NaNs
/// too: a whole-tensor max or min is the same for any grouping, and NaN when any element is).
struct MaxOf {
    template <class T>
    STRATA_HD T operator()(T a, T b) const { return a != a ? a : b != b ? b : a < b ? b : a; }
};
struct MinOf {
    template <class T>
    STRATA_HD T operator()(T a, T b) const { return a != a ? a : b != b ? b : b < a ? b : a; }
};

enum class Reduction { Sum, Mean, Max, Min };

/// Runs `f(i)` for i in [0, n) on the place's loop (place::for_each_n): the host's decompositions, whose
/// functors loop serially inside each index. Only for host-accessible places (see the file's
/// comment): a GPU needs the work shaped for thousands of threads.
template <class P, class F>
void host_shaped_for_each(std::int64_t n, const F& f) {
    static_assert(place::host_accessible_v<P>,
                  "strata: a host-shaped reduction (a serial loop per index) used on a GPU place; give the op a "
                  "GPU form in its per-place dispatch (tensor/reduce.hpp describes it)");
    place::for_each_n<P>(n, f);
}

/// The launch shape of the Cuda axis reduction of x seen as [outer, len, inner] (reduce `len`).
/// A block of `block_threads` threads is `width` adjacent outputs (coalesced columns) × `lanes`
/// row lanes; each block reduces one tile of columns over one chunk of `rows_per_chunk` rows of
/// one `outer` slice, lanes striding over the chunk's rows, then a tree in shared memory. With
/// more than one chunk, a second pass (the same kernel, one chunk) adds the chunks' partial
/// results in `accumulate_t<T>`. A function of the shape only, so results do not depend on
/// the GPU; constexpr, so the host tests check it.
struct CudaReduceShape {
    static constexpr std::int64_t block_threads = 256;
    /// Blocks a pass aims for when the shape allows: 8 resident blocks of 256 threads on each
    /// SM of a 132-SM H100 is 1056; a fixed figure keeps the grouping device-independent.
    static constexpr std::int64_t target_blocks = 1024;
    static constexpr std::int64_t max_chunks = 1024;
    std::int64_t width = 1, lanes = block_threads, tiles = 1, chunks = 1, rows_per_chunk = 0, outer = 1;
    STRATA_HD constexpr std::int64_t blocks() const { return tiles * chunks * outer; }
    STRATA_HD constexpr std::int64_t threads() const { return blocks() * block_threads; }
    STRATA_HD constexpr bool two_pass() const { return chunks > 1; }
};
constexpr CudaReduceShape cuda_reduce_shape(std::int64_t outer, std::int64_t len, std::int64_t inner,
                                            bool single_chunk = false) {
    CudaReduceShape s;
    s.width = inner >= 32 ? 32 : inner >= 8 ? 8 : 1;
    s.lanes = CudaReduceShape::block_threads / s.width;
    s.tiles = (inner + s.width - 1) / s.width;
    s.outer = outer;
    if (single_chunk) {
        s.chunks = 1;
        s.rows_per_chunk = len > 0 ? len : 1;
        return s;
    }
    const std::int64_t per_chunk_blocks = s.tiles * outer > 0 ? s.tiles * outer : 1;
    std::int64_t want = (CudaReduceShape::target_blocks + per_chunk_blocks - 1) / per_chunk_blocks;
    if (want > CudaReduceShape::max_chunks) want = CudaReduceShape::max_chunks;
    if (want < 1) want = 1;
    const std::int64_t rows = (len + want - 1) / want;
    s.rows_per_chunk = rows > s.lanes ? rows : s.lanes;  // at least one row per lane
    s.chunks = len > 0 ? (len + s.rows_per_chunk - 1) / s.rows_per_chunk : 1;
    return s;
}

/// The launch shape of the second pass, which adds the `chunks` partial results of each of `cols`
/// outputs (laid out [chunks, cols]). With few outputs (the bias gradients: 32 to 1024 columns
/// over up to 1024 chunks) the first pass's tiles would be a block or two whose lanes each add
/// a hundred partials one after the other (20 µs a call on an H200, issue 18); there every output
/// gets a block of `block_threads` lanes (width 1), so a lane adds at most
/// ceil(max_chunks / block_threads) = 4 partials before the tree. Many outputs: the first pass's
/// tiles, whose chunks are then few (target_blocks / tiles).
constexpr CudaReduceShape cuda_finish_shape(std::int64_t chunks, std::int64_t cols) {
    if (cols > CudaReduceShape::target_blocks) return cuda_reduce_shape(1, chunks, cols, true);
    CudaReduceShape s;
    s.width = 1;
    s.lanes = CudaReduceShape::block_threads;
    s.tiles = cols;
    s.outer = 1;
    s.chunks = 1;
    s.rows_per_chunk = chunks > 0 ? chunks : 1;
    return s;
}

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

#if STRATA_HAS_CUDA
/// The Cuda form of the axis reductions (the dispatch is in reduce_axis_impl).
namespace cuda_reduce {
/// One pass: block b reduces (slice o, column tile, row chunk) of x seen as [outer, len, inner]
/// with `shape`. A one-chunk pass writes the finished `Out` (the mean divides by `count`, the
/// number of elements reduced); a multi-chunk pass writes accumulate_t partials laid out as
/// [chunk, outer * inner], which a one-chunk pass over that [1, chunks, outer * inner] finishes.
/// `Load` reads element `i` of x as Acc (Plain: a load; a fused form may transform the element
/// and write it back, which is safe since a pass reads each element exactly once).
template <class In, class Acc>
struct Plain {
    const In* __restrict__ x;
    __device__ Acc operator()(std::int64_t i) const { return Acc(x[i]); }
};

template <class Load, class Acc, class Out>
__global__ void __launch_bounds__(CudaReduceShape::block_threads)
axis_kernel(Load x, Out* __restrict__ out, std::int64_t outer, std::int64_t len, std::int64_t inner,
            CudaReduceShape shape, Reduction op, std::int64_t count, bool finish) {
    __shared__ Acc tree[CudaReduceShape::block_threads];
    const std::int64_t tx = threadIdx.x % shape.width, lane = threadIdx.x / shape.width;
    const bool extreme = op == Reduction::Max || op == Reduction::Min;
    for (std::int64_t b = blockIdx.x; b < shape.blocks(); b += gridDim.x) {
        const std::int64_t tile = b % shape.tiles, rest = b / shape.tiles;
        const std::int64_t chunk = rest % shape.chunks, o = rest / shape.chunks;
        const std::int64_t col = tile * shape.width + tx;
        const std::int64_t first = chunk * shape.rows_per_chunk;
        const std::int64_t last = first + shape.rows_per_chunk < len ? first + shape.rows_per_chunk : len;
        Acc acc = 0;
        bool have = false;
        if (col < inner) {
            const std::int64_t base = o * len * inner + col;
            for (std::int64_t r = first + lane; r < last; r += shape.lanes) {
                const Acc v = x(base + r * inner);
                if (!extreme) {
                    acc += v;
                } else if (!have) {
                    acc = v;
                    have = true;
                } else {
                    acc = op == Reduction::Max ? (v > acc ? v : acc) : (v < acc ? v : acc);
                }
            }
        }
        // Lanes with no row hold the neutral element: 0 for sums, the lane 0 value for max/min
        // (lane 0 always has a row: every chunk has at least one row when len > 0).
        tree[threadIdx.x] = acc;
        __syncthreads();
        if (extreme && !have) tree[threadIdx.x] = tree[tx];
        __syncthreads();
        for (std::int64_t half = shape.lanes / 2; half > 0; half /= 2) {
            if (lane < half) {
                const Acc a = tree[threadIdx.x], c = tree[threadIdx.x + half * shape.width];
                tree[threadIdx.x] = !extreme ? a + c : op == Reduction::Max ? (c > a ? c : a) : (c < a ? c : a);
            }
            __syncthreads();
        }
        if (lane == 0 && col < inner) {
            const Acc r = tree[tx];
            const std::int64_t j = o * inner + col;
            if (!finish) {
                out[chunk * outer * inner + j] = Out(r);
            } else if (op == Reduction::Mean) {
                out[j] = Out(double(r) / double(count));
            } else {
                out[j] = Out(r);
            }
        }
        __syncthreads();  // the tree is reused by the next block of the grid-stride loop
    }
}

struct PartialTag {};

inline unsigned grid_for(std::int64_t blocks) {
    constexpr std::int64_t most = 65535LL * 32;  // plenty; the kernel strides over the rest
    return unsigned(blocks < most ? blocks : most);
}

/// Reduces `len` of x seen as [outer, len, inner] into out[outer * inner] on this thread's
/// stream, each element read through `load` (Plain, or a fused transform).
template <class T, class Load>
void axis_with(Load load, T* out, std::int64_t outer, std::int64_t len, std::int64_t inner, Reduction op) {
    using Acc = accumulate_t<T>;
    const cudaStream_t stream = place::Cuda::stream();
    const auto shape = cuda_reduce_shape(outer, len, inner);
    if (!shape.two_pass()) {
        axis_kernel<Load, Acc, T><<<grid_for(shape.blocks()), unsigned(CudaReduceShape::block_threads), 0, stream>>>(
            load, out, outer, len, inner, shape, op, len, true);
    } else {
        Acc* partial = scratch<Acc, place::Cuda, PartialTag>(shape.chunks * outer * inner);
        axis_kernel<Load, Acc, Acc><<<grid_for(shape.blocks()), unsigned(CudaReduceShape::block_threads), 0, stream>>>(
            load, partial, outer, len, inner, shape, op, len, false);
        place::cuda_check(cudaGetLastError(), "the axis reduction's first pass");
        // The chunks' partials: max/min combine as they are, mean's sum divides by len at the end.
        const auto second = cuda_finish_shape(shape.chunks, outer * inner);
        axis_kernel<Plain<Acc, Acc>, Acc, T><<<grid_for(second.blocks()), unsigned(CudaReduceShape::block_threads), 0, stream>>>(
            Plain<Acc, Acc>{partial}, out, 1, shape.chunks, outer * inner, second, op, len, true);
    }
    place::cuda_check(cudaGetLastError(), "the axis reduction");
}

template <class T>
void axis(const T* x, T* out, std::int64_t outer, std::int64_t len, std::int64_t inner, Reduction op) {
    axis_with(Plain<T, accumulate_t<T>>{x}, out, outer, len, inner, op);
}

/// The sum of x[0, n) in double into one double of device memory `out`, queued on this thread's
/// stream; the host does not wait (a training step reads its loss and correct count back once,
/// at its end, and a captured step cannot wait at all). Its grouping depends on n only.
template <class T>
void sum_to_device(const T* x, std::int64_t n, double* out) {
    if (n == 0) {
        place::cuda_check(cudaMemsetAsync(out, 0, sizeof(double), place::Cuda::stream()), "cudaMemsetAsync");
        return;
    }
    axis_with<double>(Plain<T, double>{x}, out, 1, n, 1, Reduction::Sum);
}
#if STRATA_CUDA_INSTANCES
// In libstrata_cuda (strata/config.hpp): the losses' and metrics' sums a step queues.
STRATA_CUDA_TEMPLATE void sum_to_device<float>(const float*, std::int64_t, double*);
STRATA_CUDA_TEMPLATE void sum_to_device<double>(const double*, std::int64_t, double*);
#endif
}  // namespace cuda_reduce
#endif

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
    if constexpr (std::is_same_v<P, place::Cuda>) {
#if STRATA_HAS_CUDA
        // The GPU's own shape (see the table at the top of this file).
        cuda_reduce::axis(x.data(), out.data(), outer, len, inner, op);
#endif
    } else if constexpr (place::host_accessible_v<P>) {
        if (outer == 1 && (op == Reduction::Sum || op == Reduction::Mean) && len >= 256) {
            // Column sums of a tall slab (bias gradients): contiguous rows in fixed blocks.
            const std::int64_t blocks = 64, block_rows = (len + blocks - 1) / blocks;
            auto* partial = scratch<accumulate_t<T>, P>(blocks * inner);
            host_shaped_for_each<P>(blocks, BlockColumnSums<T>{x.data(), partial, len, inner, block_rows});
            host_shaped_for_each<P>(inner, CombineBlocks<T>{partial, out.data(), blocks, inner,
                                                            op == Reduction::Mean ? 1.0 / double(len) : 1.0});
            return;
        }
        host_shaped_for_each<P>(outer * inner, AxisReduce<T>{x.data(), out.data(), len, inner, op});
    } else {
        static_assert(dependent_false<P>,
                      "strata: this place has no axis reduction; add its form to detail::reduce_axis_impl "
                      "(the host's decomposition would give each GPU thread a serial loop)");
    }
}

#if STRATA_INSTANCES
// The host's axis reductions (bias gradients, metrics), compiled once in the compiled part.
STRATA_TEMPLATE void reduce_axis_impl<float, place::Host>(const TensorView<float, place::Host>&, int,
                                                          const TensorView<float, place::Host>&, Reduction, const char*);
STRATA_TEMPLATE void reduce_axis_impl<double, place::Host>(const TensorView<double, place::Host>&, int,
                                                           const TensorView<double, place::Host>&, Reduction, const char*);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE void reduce_axis_impl<float, place::Cuda>(const TensorView<float, place::Cuda>&, int, const TensorView<float, place::Cuda>&, Reduction, const char*);
STRATA_CUDA_TEMPLATE void reduce_axis_impl<double, place::Cuda>(const TensorView<double, place::Cuda>&, int, const TensorView<double, place::Cuda>&, Reduction, const char*);
#endif
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
            place::for_each_n<P>(blocks,
                               detail::BlockSum<T>{x.data(), partial, x.size()});
        }
        accumulate_t<T> total = 0;
        for (std::int64_t b = 0; b < blocks; ++b) total += partial[b];
        return total;
    } else {
        return place::transform_reduce<P>(x.data(), x.size(), detail::Widen<T>{}, accumulate_t<T>(0),
                                          detail::Plus{});
    }
}

/// Mean of all elements; ValueError for an empty tensor.
template <class T, class P>
double mean(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "mean: the tensor of shape ", x.shape(), " is empty");
    return double(sum(x)) / double(x.size());
}

/// Largest element (NaN when any element is NaN, as NumPy's max); ValueError for an empty tensor.
template <class T, class P>
T max(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "max: the tensor of shape ", x.shape(), " is empty");
    return place::transform_reduce<P>(x.data(), x.size(), detail::Identity{}, std::numeric_limits<T>::lowest(),
                                      detail::MaxOf{});
}

/// Smallest element (NaN when any element is NaN); ValueError for an empty tensor.
template <class T, class P>
T min(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "min: the tensor of shape ", x.shape(), " is empty");
    return place::transform_reduce<P>(x.data(), x.size(), detail::Identity{}, std::numeric_limits<T>::max(),
                                      detail::MinOf{});
}

/// Flat index of the first largest element, or of the first NaN where there is one (NumPy's
/// argmax); ValueError for an empty tensor.
template <class T, class P>
std::int64_t argmax(const TensorView<T, P>& x) {
    STRATA_CHECK(x.size() > 0, ValueError, "argmax: the tensor of shape ", x.shape(), " is empty");
    return place::max_element<P>(x.data(), x.size());
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
    if (rows) place::for_each_n<P>(rows, detail::RowArgmax<T>{x.data(), out.data(), cols});
}

/// Softmax along the last axis, numerically stable (the row maximum is subtracted first).
/// `out` may be `x`.
template <class T, class P>
void softmax(const TensorView<T, P>& x, const TensorView<T, P>& out) {
    static_assert(std::is_floating_point_v<T>, "strata::softmax: T must be float or double");
    detail::check_same_size("softmax", x, out);
    STRATA_CHECK(x.rank() >= 1 && x.dim(-1) > 0, ShapeError, "softmax: cannot normalise the last axis of ", x.shape());
    const std::int64_t cols = x.dim(-1), rows = x.size() / cols;
    if (rows) place::for_each_n<P>(rows, detail::RowSoftmax<T>{x.data(), out.data(), cols});
}

#if STRATA_INSTANCES
// The host's whole-tensor sums and softmax, compiled once in the compiled part.
STRATA_TEMPLATE double sum<float, place::Host>(const TensorView<float, place::Host>&);
STRATA_TEMPLATE double sum<double, place::Host>(const TensorView<double, place::Host>&);
STRATA_TEMPLATE void softmax<float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&);
STRATA_TEMPLATE void softmax<double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE double sum<float, place::Cuda>(const TensorView<float, place::Cuda>&);
STRATA_CUDA_TEMPLATE double sum<double, place::Cuda>(const TensorView<double, place::Cuda>&);
STRATA_CUDA_TEMPLATE void softmax<float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&);
STRATA_CUDA_TEMPLATE void softmax<double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&);
#endif

}  // namespace strata
