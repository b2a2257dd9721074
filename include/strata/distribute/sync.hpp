#pragma once
/// \file strata/distribute/sync.hpp
/// Sync modes: how the replicas' gradients meet the variables.
///
/// - `Synchronous`: every replica's gradient of the same step is combined before the update.
/// - `KSync<K>`: K-sync SGD: wait for the first K of N workers, cancel the rest.
/// - `KBatchSync<K>`: K-batch-sync SGD: wait for the first K mini-batches, from any worker,
///   each computed on the current parameters (Dutta, Joshi, Ghosh, Dube, Nagpurkar,
///   "Slow and stale gradients can win the race", AISTATS 2018).
/// - `Asynchronous<Bound>`: apply gradients as they arrive (stale gradients); with Bound >= 0 a
///   worker may run at most Bound steps ahead of the slowest one, the fastest waits otherwise
///   (stale synchronous parallel: Ho et al.,
///   "More effective distributed ML via a stale synchronous parallel parameter server",
///   NIPS 2013). Bound = -1 means unbounded.
///
/// Which strategy can honour which mode is checked at compile time (strategy.hpp).

namespace strata::sync {

/// Fully synchronous data parallelism (the default).
struct Synchronous {
    using sync_tag = Synchronous;
    static constexpr const char* name = "Synchronous";
};

/// Wait for the first K of N workers each step; the other N − K are cancelled.
template <int K>
struct KSync {
    static_assert(K >= 1, "strata::sync::KSync<K>: K must be >= 1 (KSync<N> with N workers is Synchronous)");
    using sync_tag = KSync;
    static constexpr int k = K;
    static constexpr const char* name = "KSync";
};

/// Wait for the first K mini-batches from any workers, all computed on the current parameters.
template <int K>
struct KBatchSync {
    static_assert(K >= 1, "strata::sync::KBatchSync<K>: K must be >= 1");
    using sync_tag = KBatchSync;
    static constexpr int k = K;
    static constexpr const char* name = "KBatchSync";
};

/// Apply each gradient as it arrives; `StalenessBound` >= 0 bounds how far a worker may lag.
template <int StalenessBound = -1>
struct Asynchronous {
    static_assert(StalenessBound >= -1, "strata::sync::Asynchronous<Bound>: Bound must be >= 0, or -1 for unbounded");
    using sync_tag = Asynchronous;
    static constexpr int staleness_bound = StalenessBound;
    static constexpr const char* name = "Asynchronous";
};

/// Satisfied by the sync-mode tags.
template <class S>
concept SyncMode = requires { typename S::sync_tag; };

template <class S>
inline constexpr bool is_synchronous_v = false;
template <>
inline constexpr bool is_synchronous_v<Synchronous> = true;

}  // namespace strata::sync
