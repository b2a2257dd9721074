#pragma once
/// \file strata/distribute/sync.hpp
/// Sync modes: how the workers' gradients meet the variables. Definitions from Dutta, Joshi,
/// Ghosh, Dube, Nagpurkar, "Slow and stale gradients can win the race", AISTATS 2018, and Ho
/// et al., "More effective distributed ML via a stale synchronous parallel parameter server",
/// NIPS 2013 (docs/parameter_server.md).
///
/// | mode                 | an update closes after              | the others                        |
/// |----------------------|-------------------------------------|-----------------------------------|
/// | `Synchronous`        | every worker's mini-batch           | —                                 |
/// | `KSync<K>`           | the first K workers' mini-batches   | cancelled; all restart on w_{j+1} |
/// | `KBatchSync<K>`      | the first K mini-batches, any worker| a finished worker starts another  |
/// |                      | (all computed on w_j)               | batch on w_j; late ones cancelled |
/// | `KAsync<K>`          | K mini-batches of K distinct workers| not cancelled: pushed later, stale|
/// | `KBatchAsync<K>`     | any K mini-batches                  | a finished worker pulls and goes on|
/// | `Asynchronous<B>`    | every mini-batch (applied on arrival)| a worker runs at most B clocks   |
/// |                      |                                     | ahead of the slowest (−1: no bound)|
///
/// An update applies the mean of its gradients (each mini-batch's loss summed, divided by the
/// number of examples in the update). Which strategy honours which mode is stated once, in
/// distribute/combinations.hpp.

#include <limits>

#include "strata/fwd.hpp"

namespace strata::sync {

/// A knob given at run time (ParameterServerOptions::k or ::staleness_bound) instead of as a
/// template argument, as std::dynamic_extent does for extents: `KSync<sync::dynamic>`. One
/// instantiation then serves every K (a command line's --k), at the price of a run-time check.
inline constexpr int dynamic = std::numeric_limits<int>::min();

/// Fully synchronous data parallelism (the default).
struct Synchronous {
    using sync_tag = Synchronous;
    static constexpr const char* name = "Synchronous";
};

/// K-sync SGD: wait for the first K workers each update; the other workers are cancelled.
template <int K>
struct KSync {
    static_assert(K >= 1 || K == dynamic, "strata::sync::KSync<K>: K must be >= 1 (KSync<N> with N workers is Synchronous)");
    using sync_tag = KSync;
    static constexpr int k = K;
    static constexpr const char* name = "KSync";
};

/// K-batch-sync SGD: wait for the first K mini-batches from any workers, all computed on the
/// current parameters (a fast worker computes several); unfinished ones are cancelled.
template <int K>
struct KBatchSync {
    static_assert(K >= 1 || K == dynamic, "strata::sync::KBatchSync<K>: K must be >= 1");
    using sync_tag = KBatchSync;
    static constexpr int k = K;
    static constexpr const char* name = "KBatchSync";
};

/// K-async SGD: update after K gradients from K distinct workers; nobody is cancelled, so the
/// other workers' gradients arrive later, computed on older parameters (stale).
template <int K>
struct KAsync {
    static_assert(K >= 1 || K == dynamic, "strata::sync::KAsync<K>: K must be >= 1 (KAsync<1> is asynchronous SGD)");
    using sync_tag = KAsync;
    static constexpr int k = K;
    static constexpr const char* name = "KAsync";
};

/// K-batch-async SGD: update after any K gradients; a worker that finishes pushes, pulls the
/// current parameters and starts its next mini-batch at once.
template <int K>
struct KBatchAsync {
    static_assert(K >= 1 || K == dynamic, "strata::sync::KBatchAsync<K>: K must be >= 1 (KBatchAsync<1> is asynchronous SGD)");
    using sync_tag = KBatchAsync;
    static constexpr int k = K;
    static constexpr const char* name = "KBatchAsync";
};

/// Asynchronous SGD: every gradient is applied as it arrives. With `StalenessBound` B >= 0 it is
/// stale synchronous parallel: a worker that has finished c mini-batches may start its next one
/// only while c − (the slowest worker's count) <= B; otherwise it waits. B = −1: unbounded.
template <int StalenessBound>
struct Asynchronous {
    static_assert(StalenessBound >= -1 || StalenessBound == dynamic,
                  "strata::sync::Asynchronous<Bound>: Bound must be >= 0, or -1 for unbounded");
    using sync_tag = Asynchronous;
    static constexpr int staleness_bound = StalenessBound;
    static constexpr const char* name = "Asynchronous";
};

/// Satisfied by the sync-mode tags.
/// Any of the modes above, chosen at run time (ParameterServerOptions::rule, with its K or B):
/// a program that offers every mode instantiates one ParameterServer model instead of one per
/// mode. The compile-time tags stay: they check K and B where the type says them.
struct Any {
    using sync_tag = Any;
    static constexpr const char* name = "Any";
};

template <class S>
concept SyncMode = requires { typename S::sync_tag; };

/// How a parameter server admits gradients under a mode (the run-time form of the tag).
enum class Rule { Synchronous, KSync, KBatchSync, KAsync, KBatchAsync, Asynchronous };

template <class S>
struct traits;
template <>
struct traits<Synchronous> {
    static constexpr Rule rule = Rule::Synchronous;
    static constexpr int k = 0;  // every worker
    static constexpr int bound = -1;
};
template <int K>
struct traits<KSync<K>> {
    static constexpr Rule rule = Rule::KSync;
    static constexpr int k = K;
    static constexpr int bound = -1;
};
template <int K>
struct traits<KBatchSync<K>> {
    static constexpr Rule rule = Rule::KBatchSync;
    static constexpr int k = K;
    static constexpr int bound = -1;
};
template <int K>
struct traits<KAsync<K>> {
    static constexpr Rule rule = Rule::KAsync;
    static constexpr int k = K;
    static constexpr int bound = -1;
};
template <int K>
struct traits<KBatchAsync<K>> {
    static constexpr Rule rule = Rule::KBatchAsync;
    static constexpr int k = K;
    static constexpr int bound = -1;
};
template <int Bound>
struct traits<Asynchronous<Bound>> {
    static constexpr Rule rule = Rule::Asynchronous;
    static constexpr int k = 1;
    static constexpr int bound = Bound;
};

/// sync::Any: the rule, K and B are the strategy's run-time choice.
template <>
struct traits<Any> {
    static constexpr Rule rule = Rule::Synchronous;  // unused: ParameterServer::rule() says it
    static constexpr int k = dynamic;
    static constexpr int bound = dynamic;
};

template <class S>
inline constexpr bool is_synchronous_v = false;
template <>
inline constexpr bool is_synchronous_v<Synchronous> = true;

inline const char* rule_name(Rule r) {
    switch (r) {
        case Rule::Synchronous: return "sync";
        case Rule::KSync: return "ksync";
        case Rule::KBatchSync: return "kbatch_sync";
        case Rule::KAsync: return "kasync";
        case Rule::KBatchAsync: return "kbatch_async";
        case Rule::Asynchronous: return "async";
    }
    return "?";
}

}  // namespace strata::sync
