#pragma once
/// \file strata/distribute/collective/direct.hpp
/// The direct (one-shot reduce-scatter + all-gather) all-reduce for replicas that share one
/// memory: each rank reads its slice of every buffer itself instead of waiting for it to come
/// around a ring. It is what Algorithm::Auto picks for a ReplicaGroup.

#include <strata/distribute/collective/common.hpp>

namespace strata::distribute::collective {

/// Direct all-reduce.
///
/// 1. Reduce-scatter: rank r owns slice r (chunk_begin with N parts). It sums that slice of
///    all N buffers in rank order, x_0 + x_1 + ... + x_{N-1} (divided by N for Mean), and
///    writes the result into its own buffer's slice r. Rank r writes only slice r of its own
///    buffer and the others read only their own slices, so no two ranks touch the same
///    elements. Barrier.
/// 2. All-gather: rank r copies every slice q != r from rank q's buffer. Barrier (the exit: no
///    rank returns while another may still read its slice).
///
/// Two barriers whatever N is, and each element of the result is read from every buffer once
/// and written once: in shared memory this moves the fewest bytes with the fewest
/// synchronisations. (Across a network it would need N-1 concurrent transfers per rank,
/// which is why the ring exists.) The fixed rank order makes the result bitwise reproducible,
/// and since each element is computed on one rank and copied, identical on all ranks.
template <Reducible T>
void direct_all_reduce(const Exchange<T>& ex, ReduceOp op) {
    const int n = ex.size();
    if (n == 1) return;
    const int r = ex.rank();
    T* mine = ex.mine();

    const std::size_t begin = ex.chunk_begin(r);
    const std::size_t end = ex.chunk_begin(r + 1);
    // Sum a cache-sized block in a private accumulator: our own buffer is one of the inputs,
    // so it cannot be the accumulator without changing the summation order.
    constexpr std::size_t kBlock = 1024;
    alignas(64) T acc[kBlock];
    for (std::size_t b = begin; b < end; b += kBlock) {
        const std::size_t len = end - b < kBlock ? end - b : kBlock;
        detail::sum_of(acc, ex.buffer(0) + b, ex.buffer(1) + b, len);
        for (int q = 2; q < n; ++q) detail::add_into(acc, ex.buffer(q) + b, len);
        if (op == ReduceOp::Mean)
            detail::divided(mine + b, acc, len, static_cast<T>(n));
        else
            detail::copy(mine + b, acc, len);
    }
    ex.step(1, 2);

    // Start at the right neighbour so the ranks do not all read rank 0's slice first.
    for (int k = 1; k < n; ++k) {
        const int q = ex.wrap(r + k);
        const std::size_t b = ex.chunk_begin(q);
        detail::copy(mine + b, ex.buffer(q) + b, ex.chunk_size(q));
    }
    ex.step(2, 2);
}

}  // namespace strata::distribute::collective
