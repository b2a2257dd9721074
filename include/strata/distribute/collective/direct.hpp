#pragma once
/// \file strata/distribute/collective/direct.hpp
/// The direct (one-shot reduce-scatter + all-gather) all-reduce for replicas that share one
/// memory: each rank reads its slice of every buffer itself instead of waiting for it to come
/// around a ring. It is what Algorithm::Auto picks for a ReplicaGroup.

#include <strata/distribute/collective/common.hpp>

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace strata::distribute::collective {

/// Step 1 of the direct all-reduce: rank r sums slice r (chunk_begin with N parts) of every
/// buffer into its own, in the order r+1, r+2, ..., r-1 (mod N), dividing by `divisor` in the
/// last addition when it is not 1. Rank r writes only slice r of its own buffer and the others
/// read only their own slices, so no two ranks touch the same elements; no barrier.
///
/// `after_block(b, len)`, when given, runs on each finished block [b, b + len) while it is in
/// cache (the one-shot all-reduce writes it into the other buffers there).
template <Reducible T, class AfterBlock = std::nullptr_t>
void direct_reduce_slice(const Exchange<T>& ex, T divisor = T(1), AfterBlock&& after_block = nullptr) {
    const int n = ex.size();
    const int r = ex.rank();
    T* mine = ex.mine();
    const std::size_t begin = ex.chunk_begin(r);
    const std::size_t end = ex.chunk_begin(r + 1);
    // Our own term comes first in the order, so our buffer is the accumulator. Blocks keep
    // the slice being accumulated in L1 while the N-1 other buffers stream past it.
    constexpr std::size_t kBlock = 2048;
    for (std::size_t b = begin; b < end; b += kBlock) {
        const std::size_t len = end - b < kBlock ? end - b : kBlock;
        for (int k = 1; k < n; ++k) {
            const T* other = ex.buffer(ex.wrap(r + k)) + b;
            if (divisor != T(1) && k == n - 1)
                detail::add_into_divided(mine + b, other, len, divisor);
            else
                detail::add_into(mine + b, other, len);
        }
        if constexpr (!std::is_same_v<std::decay_t<AfterBlock>, std::nullptr_t>) after_block(b, len);
    }
}

/// Step 2 of the direct all-reduce, after a barrier: rank r copies every slice q != r from
/// rank q's buffer.
template <Reducible T>
void direct_gather_slices(const Exchange<T>& ex) {
    const int n = ex.size();
    const int r = ex.rank();
    // Start at the right neighbour so the ranks do not all read rank 0's slice first.
    for (int k = 1; k < n; ++k) {
        const int q = ex.wrap(r + k);
        const std::size_t b = ex.chunk_begin(q);
        detail::copy(ex.mine() + b, ex.buffer(q) + b, ex.chunk_size(q));
    }
}

/// Direct (one-shot) all-reduce.
///
/// Rank r owns slice r (chunk_begin with N parts). Block by block, it adds that slice of the
/// other N-1 buffers into its own, in the order r+1, r+2, ..., r-1 (mod N), dividing by N in
/// the last addition for Mean, and writes the finished block into the other N-1 buffers while
/// it is still in cache. No other rank reads or writes slice r of any buffer, so one barrier
/// (the exit: no rank returns while another may still write into its buffer) is the only
/// synchronisation.
///
/// Each rank reads its slice of every buffer once and writes it once, and the writes go to
/// lines the reduction has just read (no write-allocate traffic): per rank, S bytes read and S
/// written for an S-byte buffer, the least any all-reduce in shared memory can move, with one
/// barrier whatever N is. (The two-phase form, reduce-scatter then all-gather, moves 1.5 S or
/// more and needs two barriers; across a network this one would need N-1 concurrent
/// transfers per rank, which is why the ring exists.) Slice c is summed x_c + x_{c+1} + ... +
/// x_{c-1}, the order ring_all_reduce uses for chunk c, so Direct and Ring give bitwise
/// identical results; each element is computed on one rank and copied, so all ranks get the
/// same bits, run after run.
template <Reducible T>
void direct_all_reduce(const Exchange<T>& ex, ReduceOp op) {
    const int n = ex.size();
    if (n == 1) return;
    const int r = ex.rank();
    const T* mine = ex.mine();
    direct_reduce_slice(ex, op == ReduceOp::Mean ? static_cast<T>(n) : T(1), [&](std::size_t b, std::size_t len) {
        for (int k = 1; k < n; ++k) std::memcpy(ex.buffer(ex.wrap(r + k)) + b, mine + b, len * sizeof(T));
    });
    ex.step(1, 1);
}

#if STRATA_INSTANCES
// Compiled once in the compiled part (src/strata.cpp), for the two element types there are.
STRATA_TEMPLATE void direct_all_reduce<float>(const Exchange<float>&, ReduceOp);
STRATA_TEMPLATE void direct_all_reduce<double>(const Exchange<double>&, ReduceOp);
STRATA_TEMPLATE void direct_gather_slices<float>(const Exchange<float>&);
STRATA_TEMPLATE void direct_gather_slices<double>(const Exchange<double>&);
#endif

}  // namespace strata::distribute::collective
