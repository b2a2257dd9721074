#pragma once
/// \file strata/distribute/combinations.hpp
/// The one place that states which strategy honours which sync mode. Every strategy's
/// static_assert quotes STRATA_VALID_COMBINATIONS, and GradientPath's primary template (the
/// combination nobody implements) fails with it.
///
/// | strategy                         | sync modes                                                       |
/// |----------------------------------|------------------------------------------------------------------|
/// | `Default`, `OneDevice<P>`        | `Synchronous` (one replica)                                      |
/// | `Mirrored<P, S>`                 | `Synchronous` (an all-reduce needs every replica at every step)  |
/// | `CentralStorage<P, S>`           | `Synchronous` (its update waits for every replica's gradient)    |
/// | `MultiWorkerMirrored<P, S>`      | `Synchronous` (an all-reduce across processes, every step)       |
/// | `Pipeline<P, Schedule, Split>`   | `Synchronous` (fixed: one schedule over all stages every step)   |
/// | `ParameterServer<P, S>`          | all: `Synchronous`, `KSync<K>`, `KBatchSync<K>`, `KAsync<K>`,    |
/// |                                  | `KBatchAsync<K>`, `Asynchronous<B>`, and `Any` (chosen at run time)|

#include "strata/distribute/sync.hpp"

/// The sentence every rejected strategy × sync-mode combination prints.
#define STRATA_VALID_COMBINATIONS                                                                           \
    "Valid combinations: Default, OneDevice<P>, Mirrored<P, sync::Synchronous>, "                            \
    "CentralStorage<P, sync::Synchronous>, MultiWorkerMirrored<P, sync::Synchronous>, "                    \
    "Pipeline<P, Schedule, Split> (synchronous), ParameterServer<P, any sync mode: Synchronous, KSync<K>, "  \
    "KBatchSync<K>, KAsync<K>, KBatchAsync<K>, Asynchronous<B>, or Any to choose at run time>; the relaxed modes need ParameterServer "    \
    "(see docs/distribution.md)"

namespace strata::distribute {

/// Sync modes a strategy that all-reduces or reduces in lockstep can honour.
template <class S>
inline constexpr bool lockstep_sync_v = sync::is_synchronous_v<S>;

/// Sync modes a parameter server can honour: all of them.
template <class S>
inline constexpr bool parameter_server_sync_v = sync::SyncMode<S>;

}  // namespace strata::distribute
