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
/// Pull and push. In shared memory a send to the right neighbour can be the neighbour reading
/// after a barrier (pull) or the sender writing into the neighbour's buffer (push). The ring
/// pulls, except for all-gather step 0: the last reduce-scatter step pushes the chunk it has
/// just completed into the right neighbour's buffer, block by block while the block is in
/// cache. That saves a step (a barrier) and a pass over the chunk: for N = 2 each rank then
/// reads S bytes and writes S, the least an all-reduce can move. The push is safe: rank r
/// writes chunk r+1 of rank r+1's buffer, which during that step nobody else touches (rank r+1
/// works on its chunk r+2, and rank r+2 reads rank r+1's chunk r+3; for N = 2 that reader is
/// rank r itself, which reads each block before it overwrites it).
///
/// Summation order per element is fixed (chunk c: x_c + x_{c+1} + ... + x_{c-1}, left to
/// right), and each final value is computed once and copied, so results are bitwise
/// reproducible and bitwise identical on all ranks. The barrier after the last step is the
/// collective's exit: no rank returns (and lets its caller overwrite its buffer) while a
/// neighbour may still read or write it.
///
/// Cost (alpha-beta): (2N-3) alpha + 2 (N-1)/N n beta, independent of N for large n.
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
    T* right = ex.buffer(ex.wrap(r + 1));
    const int steps = 2 * n - 3;
    const T divisor = static_cast<T>(n);

    for (int s = 0; s < n - 2; ++s) {
        const int c = ex.wrap(r - 1 - s);
        const std::size_t b = ex.chunk_begin(c);
        detail::add_into(mine + b, theirs + b, ex.chunk_size(c));
        ex.step(s + 1, steps);
    }
    {
        // The last reduce-scatter step completes chunk r+1 and pushes it to the right.
        const int c = ex.wrap(r + 1);
        const std::size_t begin = ex.chunk_begin(c), end = ex.chunk_begin(c + 1);
        constexpr std::size_t kBlock = 2048;
        for (std::size_t b = begin; b < end; b += kBlock) {
            const std::size_t len = end - b < kBlock ? end - b : kBlock;
            if (op == ReduceOp::Mean)
                detail::add_into_divided(mine + b, theirs + b, len, divisor);
            else
                detail::add_into(mine + b, theirs + b, len);
            std::memcpy(right + b, mine + b, len * sizeof(T));
        }
        ex.step(n - 1, steps);
    }
    // All-gather steps 1 .. N-2 (pull): chunk r-s is what the left neighbour received at the
    // step before (at step 1, what it pushed to us is chunk r; it now holds chunk r-1).
    for (int s = 1; s < n - 1; ++s) {
        const int c = ex.wrap(r - s);
        const std::size_t b = ex.chunk_begin(c);
        detail::copy(mine + b, theirs + b, ex.chunk_size(c));
        ex.step(n - 1 + s, steps);
    }
}

#if STRATA_INSTANCES
// Compiled once in the compiled part (src/strata.cpp), for the two element types there are.
STRATA_TEMPLATE void ring_all_reduce<float>(const Exchange<float>&, ReduceOp);
STRATA_TEMPLATE void ring_all_reduce<double>(const Exchange<double>&, ReduceOp);
#endif

}  // namespace strata::distribute::collective
