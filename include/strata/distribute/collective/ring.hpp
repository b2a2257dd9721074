#pragma once
/// \file strata/distribute/collective/ring.hpp
/// The bandwidth-optimal ring all-reduce, on buffers in one shared memory.
///
/// Sources: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
/// workstations", J. Parallel Distrib. Comput. 69(2), 2009; A. Gibiansky, "Bringing HPC
/// techniques to deep learning" (Baidu Research, 2017), the ring all-reduce in baidu-allreduce.

#include <strata/distribute/collective/common.hpp>

namespace strata::distribute::collective {

/// Ring all-reduce: reduce-scatter then all-gather, N-1 steps each over N chunks.
///
/// The buffer is cut into N chunks (chunk_begin). Rank r's left neighbour is l = r-1 mod N.
/// "Sending a chunk to the right" becomes, in shared memory, "the right neighbour reads it
/// after the barrier that ends the step".
///
/// - Reduce-scatter, step s = 0..N-2: rank r adds chunk c = r-1-s (mod N) of l's buffer into
///   its own chunk c. Within a step, r writes its chunk r-1-s while its right neighbour reads
///   r's chunk r-s, and r reads l's chunk r-1-s while l writes its chunk r-2-s: all distinct,
///   so one barrier per step is enough. Chunk c is summed along c, c+1, ..., c-1, so after
///   N-1 steps rank r holds the complete chunk r+1 (divided by N for Mean, in the last step).
/// - All-gather, step s = 0..N-2: rank r copies chunk r-s (mod N) from l. At s = 0 that is l's
///   complete chunk l+1 = r; at s > 0 it is the chunk l copied at step s-1. Again r writes
///   chunk r-s while its right neighbour reads chunk r+1-s: distinct.
///
/// Summation order per element is fixed (chunk c: x_c + x_{c+1} + ... + x_{c-1}, left to
/// right), and each final value is computed once and copied, so results are bitwise
/// reproducible and bitwise identical on all ranks. The barrier after the last step is the
/// collective's exit: no rank returns (and lets its caller overwrite its buffer) while a
/// neighbour may still read it.
///
/// Cost (alpha-beta): 2(N-1) alpha + 2 (N-1)/N n beta, independent of N for large n.
///
/// Requires: called by every rank of the exchange with the same op (ReplicaGroup ensures it).
template <Reducible T>
void ring_all_reduce(const Exchange<T>& ex, ReduceOp op) {
    const int n = ex.size();
    if (n == 1) return;
    const int r = ex.rank();
    const int left = ex.wrap(r - 1);
    T* mine = ex.mine();
    const T* theirs = ex.buffer(left);
    const int steps = 2 * (n - 1);
    const T divisor = static_cast<T>(n);

    for (int s = 0; s < n - 1; ++s) {
        const int c = ex.wrap(r - 1 - s);
        const std::size_t b = ex.chunk_begin(c);
        const std::size_t len = ex.chunk_size(c);
        if (op == ReduceOp::Mean && s == n - 2)
            detail::add_into_divided(mine + b, theirs + b, len, divisor);
        else
            detail::add_into(mine + b, theirs + b, len);
        ex.step(s + 1, steps);
    }
    for (int s = 0; s < n - 1; ++s) {
        const int c = ex.wrap(r - s);
        const std::size_t b = ex.chunk_begin(c);
        detail::copy(mine + b, theirs + b, ex.chunk_size(c));
        ex.step(n + s, steps);
    }
}

}  // namespace strata::distribute::collective
