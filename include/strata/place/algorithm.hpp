#pragma once
/// \file strata/place/algorithm.hpp
/// The data-parallel loops every op is written with, each shaped for its place.
///
/// | algorithm                               | Host                                   | Cuda (nvcc units)                     |
/// |-----------------------------------------|----------------------------------------|---------------------------------------|
/// | for_each_n<P>(n, f): f(i), i in [0, n)  | one `omp parallel for`, static blocks  | thrust::for_each_n on the stream      |
/// | fill_n, copy_n, transform, tabulate     | the same loop, element by element      | Thrust's algorithm of the same name   |
/// | transform_reduce<P>(x, n, f, init, op)  | per-thread blocks, combined in order   | thrust::transform_reduce (CUB)        |
/// | max_element<P>(x, n): first largest     | per-thread blocks, combined in order   | thrust::max_element (CUB)             |
///
/// A reduction's result does not depend on the thread count when its op is associative and
/// commutative (max, min, integer sums); strata's float sums use fixed blocks of their own
/// (tensor/reduce.hpp) instead.
///
/// Host loops are plain OpenMP (all threads of the calling thread's OpenMP team size, see
/// strata::set_num_threads; serial in a unit without OpenMP): what Thrust's OpenMP system runs
/// for these algorithms, without its headers. A host-only unit includes no Thrust at all, which
/// took a quarter off the umbrella header's compile time (docs/benchmarks.md, "Compile time"). On
/// Cuda every algorithm is Thrust's, with `Cuda::policy()` (this thread's stream, no
/// synchronisation after the launch).
///
/// A functor that runs on every place marks its call operator STRATA_HD. A user place (a type
/// with a `place_tag`, see place.hpp) has no algorithms: its layers write their own loops.

#include <cstdint>
#include <type_traits>

#include "strata/config.hpp"
#include "strata/detail/dependent_false.hpp"
#include "strata/place/place.hpp"
#include "strata/place/threads.hpp"

#if STRATA_HAS_CUDA
#include <thrust/copy.h>
#include <thrust/extrema.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/tabulate.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>
#endif

#if STRATA_HAS_OPENMP
#define STRATA_OMP_PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#else
#define STRATA_OMP_PARALLEL_FOR
#endif

namespace strata::place {

namespace detail {
template <class P>
inline constexpr bool is_host_v = std::is_same_v<P, Host>;
template <class P>
inline constexpr bool is_cuda_v = std::is_same_v<P, Cuda>;

/// Block b of n items split into `parts` contiguous blocks, the first n % parts one item longer
/// (the partition of `omp for schedule(static)`, so a reduction's blocks are the loops').
struct Block {
    std::int64_t first, last;
};
inline Block block_of(std::int64_t n, std::int64_t parts, std::int64_t b) {
    const std::int64_t q = n / parts, r = n % parts;
    const std::int64_t first = b * q + (b < r ? b : r);
    return {first, first + q + (b < r ? 1 : 0)};
}
/// The order max_element ranks by: NaN above every number (as NumPy's argmax), numbers by `<`.
struct RanksBelow {
    template <class T>
    STRATA_HD bool operator()(const T& a, const T& b) const {
        return !(a != a) && ((b != b) || a < b);
    }
};
/// How many blocks a host reduction over n > 0 items uses: one per thread (strata::num_threads),
/// at most one per item, at most 256 (the reductions' partials live on the stack).
inline std::int64_t host_parts(std::int64_t n) {
    const std::int64_t threads = num_threads();
    const std::int64_t parts = n < threads ? n : threads;
    return parts < 256 ? parts : 256;
}
}  // namespace detail

#define STRATA_PLACE_NO_ALGORITHMS(what)                                                                   \
    static_assert(strata::detail::dependent_false<P>,                                                      \
                  "strata::place::" what ": no algorithms for this place (Host and, in nvcc units, Cuda " \
                  "have them; a user place's layers write their own loops)")

/// f(i) for every i in [0, n), in parallel (no order between calls).
template <class P, class Index, class F>
void for_each_n(Index n, F f) {
    if (n <= 0) return;
    if constexpr (detail::is_host_v<P>) {
        STRATA_OMP_PARALLEL_FOR
        for (Index i = 0; i < n; ++i) f(i);
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        thrust::for_each_n(P::policy(), thrust::counting_iterator<Index>(0), n, f);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("for_each_n");
    }
}

/// x[i] = value for i in [0, n).
template <class P, class T>
void fill_n(T* x, std::int64_t n, T value) {
    if (n <= 0) return;
    if constexpr (detail::is_host_v<P>) {
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t i = 0; i < n; ++i) x[i] = value;
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        thrust::fill_n(P::policy(), x, n, value);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("fill_n");
    }
}

/// out[i] = in[i] for i in [0, n); the ranges do not overlap.
template <class P, class T>
void copy_n(const T* in, std::int64_t n, T* out) {
    if (n <= 0) return;
    if constexpr (detail::is_host_v<P>) {
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t i = 0; i < n; ++i) out[i] = in[i];
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        thrust::copy_n(P::policy(), in, n, out);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("copy_n");
    }
}

/// out[i] = f(in[i]) for i in [0, n); out may be in.
template <class P, class In, class Out, class F>
void transform(const In* in, std::int64_t n, Out* out, F f) {
    if (n <= 0) return;
    if constexpr (detail::is_host_v<P>) {
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t i = 0; i < n; ++i) out[i] = f(in[i]);
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        thrust::transform(P::policy(), in, in + n, out, f);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("transform");
    }
}

/// out[i] = f(a[i], b[i]) for i in [0, n); out may be a or b.
template <class P, class A, class B, class Out, class F>
void transform(const A* a, const B* b, std::int64_t n, Out* out, F f) {
    if (n <= 0) return;
    if constexpr (detail::is_host_v<P>) {
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        thrust::transform(P::policy(), a, a + n, b, out, f);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("transform");
    }
}

/// x[i] = f(i) for i in [0, n).
template <class P, class T, class F>
void tabulate(T* x, std::int64_t n, F f) {
    if (n <= 0) return;
    if constexpr (detail::is_host_v<P>) {
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t i = 0; i < n; ++i) x[i] = f(i);
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        thrust::tabulate(P::policy(), x, x + n, f);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("tabulate");
    }
}

/// init op f(x[0]) op f(x[1]) ... for an associative op. On the host each thread folds its
/// static block from f(x[first]) and the blocks are folded into init in order, so the result
/// depends on the thread count only through the grouping (exact for max, min, and integers).
/// Waits for the result on Cuda.
template <class P, class T, class Acc, class F, class Op>
Acc transform_reduce(const T* x, std::int64_t n, F f, Acc init, Op op) {
    if (n <= 0) return init;
    if constexpr (detail::is_host_v<P>) {
        const std::int64_t used = detail::host_parts(n);
        Acc partial[256];
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t b = 0; b < used; ++b) {
            const detail::Block blk = detail::block_of(n, used, b);
            Acc a = Acc(f(x[blk.first]));
            for (std::int64_t i = blk.first + 1; i < blk.last; ++i) a = op(a, Acc(f(x[i])));
            partial[b] = a;
        }
        for (std::int64_t b = 0; b < used; ++b) init = op(init, partial[b]);
        return init;
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        return thrust::transform_reduce(P::policy(), x, x + n, f, init, op);
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("transform_reduce");
        return init;
    }
}

/// Index of the first largest element of x[0, n) (the first NaN where there is one: NaN ranks
/// above every number, so the result is the same for any grouping); 0 for n <= 0. Waits on Cuda.
template <class P, class T>
std::int64_t max_element(const T* x, std::int64_t n) {
    if (n <= 0) return 0;
    if constexpr (detail::is_host_v<P>) {
        const std::int64_t used = detail::host_parts(n);
        std::int64_t partial[256];
        STRATA_OMP_PARALLEL_FOR
        for (std::int64_t b = 0; b < used; ++b) {
            const detail::Block blk = detail::block_of(n, used, b);
            std::int64_t best = blk.first;
            for (std::int64_t i = blk.first + 1; i < blk.last; ++i)
                if (detail::RanksBelow{}(x[best], x[i])) best = i;
            partial[b] = best;
        }
        std::int64_t best = partial[0];
        for (std::int64_t b = 1; b < used; ++b)
            if (detail::RanksBelow{}(x[best], x[partial[b]])) best = partial[b];
        return best;
#if STRATA_HAS_CUDA
    } else if constexpr (detail::is_cuda_v<P>) {
        return thrust::max_element(P::policy(), x, x + n, detail::RanksBelow{}) - x;
#endif
    } else {
        STRATA_PLACE_NO_ALGORITHMS("max_element");
        return 0;
    }
}

#undef STRATA_PLACE_NO_ALGORITHMS
#undef STRATA_OMP_PARALLEL_FOR

}  // namespace strata::place
