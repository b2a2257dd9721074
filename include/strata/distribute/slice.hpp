#pragma once
/// \file strata/distribute/slice.hpp
/// How a global batch (or a flat buffer) is shared among replicas: the one rule every strategy,
/// collective and distributed dataset uses.

#include <cstdint>

namespace strata::distribute {

/// Example i of a global batch of `global` examples belongs to the replica whose range holds it:
/// replica r gets `global / n` examples, plus one if r < global % n (so every example is used
/// exactly once, also when the batch does not divide).
struct Slice {
    std::int64_t first = 0, count = 0;
};
inline Slice replica_slice(std::int64_t global, int replicas, int r) {
    const std::int64_t base = global / replicas, extra = global % replicas;
    const std::int64_t first = r * base + (r < extra ? r : extra);
    return {first, base + (r < extra ? 1 : 0)};
}

}  // namespace strata::distribute
