#pragma once
/// \file strata/distribute/strategy.hpp
/// The strategies of one process, `Default`, `OneDevice`, `Mirrored` and `CentralStorage`, with
/// ReplicaRuntime, their user API (strategy_classes.hpp, where they are documented), and their
/// gradient paths (path/one_device.hpp, path/mirrored.hpp, path/central_storage.hpp), which a
/// Model needs to train under them. The paths include strategy_classes.hpp, not this header, so
/// neither is half of an include loop (tests/check_include_loops.py).

#include "strata/distribute/strategy_classes.hpp"

// Each strategy brings its gradient path (how its gradients meet its variables): Model includes
// none of them, so a program pays only for the strategies it includes.
#include "strata/distribute/path/central_storage.hpp"
#include "strata/distribute/path/mirrored.hpp"
#include "strata/distribute/path/one_device.hpp"

#if STRATA_INSTANCES
namespace strata::distribute::detail {
// The gradient buffers and optimizer states of the host strategies' lockstep paths are compiled
// once in the compiled part.
STRATA_TEMPLATE class LockstepBuffers<Default, float>;
STRATA_TEMPLATE class LockstepBuffers<Default, double>;
STRATA_TEMPLATE class LockstepBuffers<OneDevice<place::Host>, float>;
STRATA_TEMPLATE class LockstepBuffers<OneDevice<place::Host>, double>;
STRATA_TEMPLATE class LockstepBuffers<Mirrored<place::Host, sync::Synchronous>, float>;
STRATA_TEMPLATE class LockstepBuffers<Mirrored<place::Host, sync::Synchronous>, double>;
STRATA_TEMPLATE class LockstepBuffers<CentralStorage<place::Host, sync::Synchronous>, float>;
STRATA_TEMPLATE class LockstepBuffers<CentralStorage<place::Host, sync::Synchronous>, double>;
}  // namespace strata::distribute::detail
#endif
