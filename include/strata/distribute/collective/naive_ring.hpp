#pragma once
/// \file strata/distribute/collective/naive_ring.hpp
/// The naive ring all-reduce: the whole buffer travels around the ring twice. Slow on purpose;
/// it is kept as the baseline that shows what the bandwidth-optimal ring (ring.hpp) buys.
/// (The comparison is the starting point of Gibiansky, Baidu 2017, and of Patarasuk & Yuan
/// 2009; see ring.hpp for the full references.)

#include <strata/distribute/collective/common.hpp>

namespace strata::distribute::collective {

/// Naive ring all-reduce.
///
/// - Accumulate, step s = 1..N-1: rank s adds rank s-1's whole buffer (the partial sum
///   x_0 + ... + x_{s-1}) into its own; everyone else waits. Rank N-1 ends with the full sum
///   (divided by N for Mean).
/// - Pass the result on, step t = 0..N-2: rank t copies the whole buffer of rank t-1 mod N
///   (rank 0 copies from N-1, rank 1 from 0, ...), N-1 full-buffer copies.
///
/// Every step moves the whole buffer and only one rank works in it, so the time is
/// ~ 2(N-1) (alpha + n beta), against the ring's 2(N-1) alpha + 2(N-1)/N n beta: about N times
/// slower for large n. Summation order is x_0 + x_1 + ... + x_{N-1} for every element, and
/// every rank ends with a copy of rank N-1's result: bitwise reproducible and identical.
template <Reducible T>
void naive_ring_all_reduce(const Exchange<T>& ex, ReduceOp op) {
    const int n = ex.size();
    if (n == 1) return;
    const int r = ex.rank();
    const std::size_t len = ex.length();
    T* mine = ex.mine();
    const int steps = 2 * (n - 1);

    for (int s = 1; s < n; ++s) {
        if (r == s) {
            if (op == ReduceOp::Mean && s == n - 1)
                detail::add_into_divided(mine, ex.buffer(s - 1), len, static_cast<T>(n));
            else
                detail::add_into(mine, ex.buffer(s - 1), len);
        }
        ex.step(s, steps);
    }
    for (int t = 0; t < n - 1; ++t) {
        if (r == t) detail::copy(mine, ex.buffer(ex.wrap(t - 1)), len);
        ex.step(n + t, steps);
    }
}

#if STRATA_INSTANCES
// Compiled once in the compiled part (src/strata.cpp), for the two element types there are.
STRATA_TEMPLATE void naive_ring_all_reduce<float>(const Exchange<float>&, ReduceOp);
STRATA_TEMPLATE void naive_ring_all_reduce<double>(const Exchange<double>&, ReduceOp);
#endif

}  // namespace strata::distribute::collective
