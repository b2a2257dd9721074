#pragma once
/// \file strata/core/random.hpp
/// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random
/// numbers: as easy as 1, 2, 3", SC 2011). The n-th number of a stream is a pure function of
/// (seed, stream, n), so host and CUDA produce the same numbers for the same seed, in any order
/// and with any number of threads.

#include <cmath>
#include <cstdint>

#include "strata/config.hpp"

namespace strata::random {

/// One Philox4x32-10 block: 4 random 32-bit words for a 128-bit counter and a 64-bit key.
struct Philox4x32 {
    std::uint32_t v[4];

    STRATA_HD static Philox4x32 generate(std::uint64_t seed, std::uint64_t counter_lo,
                                         std::uint64_t counter_hi) {
        std::uint32_t c0 = std::uint32_t(counter_lo), c1 = std::uint32_t(counter_lo >> 32);
        std::uint32_t c2 = std::uint32_t(counter_hi), c3 = std::uint32_t(counter_hi >> 32);
        std::uint32_t k0 = std::uint32_t(seed), k1 = std::uint32_t(seed >> 32);
        for (int round = 0; round < 10; ++round) {
            const std::uint64_t p0 = std::uint64_t(0xD2511F53u) * c0;
            const std::uint64_t p1 = std::uint64_t(0xCD9E8D57u) * c2;
            const std::uint32_t hi0 = std::uint32_t(p0 >> 32), lo0 = std::uint32_t(p0);
            const std::uint32_t hi1 = std::uint32_t(p1 >> 32), lo1 = std::uint32_t(p1);
            c0 = hi1 ^ c1 ^ k0;
            c1 = lo1;
            c2 = hi0 ^ c3 ^ k1;
            c3 = lo0;
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        return {{c0, c1, c2, c3}};
    }
};

/// Uniform in [0, 1) with 24 random bits (float) or 53 (double).
template <class T>
STRATA_HD inline T uniform01(std::uint32_t a, std::uint32_t b) {
    if constexpr (sizeof(T) <= 4) {
        (void)b;
        return T(a >> 8) * T(1.0f / 16777216.0f);
    } else {
        const std::uint64_t bits = (std::uint64_t(a) << 21) ^ (std::uint64_t(b) >> 11);
        return T(bits & ((std::uint64_t(1) << 53) - 1)) * T(1.0 / 9007199254740992.0);
    }
}

/// Element `index` of the uniform stream (`seed`, `stream`) mapped to [lo, hi).
template <class T>
STRATA_HD inline T uniform_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, T lo, T hi) {
    const auto r = Philox4x32::generate(seed, index, stream);
    return lo + (hi - lo) * uniform01<T>(r.v[0], r.v[1]);
}

/// Element `index` of the normal stream (`seed`, `stream`): Box-Muller on one Philox block.
template <class T>
STRATA_HD inline T normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, T mean, T stddev) {
    const auto r = Philox4x32::generate(seed, index, stream ^ 0x6E6F726D616CULL);
    // 1 - u keeps the logarithm's argument in (0, 1].
    const double u1 = 1.0 - uniform01<double>(r.v[0], r.v[1]);
    const double u2 = uniform01<double>(r.v[2], r.v[3]);
    const double radius = sqrt(-2.0 * log(u1));
    return mean + stddev * T(radius * cos(6.283185307179586476925 * u2));
}

/// A small host-side generator for shuffles and seeds (not for tensors): a Philox stream read
/// sequentially, so its numbers are reproducible for a seed.
class Generator {
public:
    explicit Generator(std::uint64_t seed = 0, std::uint64_t stream = 0) : seed_(seed), stream_(stream) {}
    std::uint32_t next_u32() {
        if (used_ == 4) {
            block_ = Philox4x32::generate(seed_, counter_++, stream_);
            used_ = 0;
        }
        return block_.v[used_++];
    }
    std::uint64_t next_u64() { return (std::uint64_t(next_u32()) << 32) | next_u32(); }
    /// Uniform integer in [0, n), without modulo bias (Lemire's multiply-shift with rejection).
    std::uint64_t below(std::uint64_t n) {
        if (n <= 1) return 0;
        if (n <= 0xFFFFFFFFull) {
            std::uint64_t m = std::uint64_t(next_u32()) * n;
            auto low = std::uint32_t(m);
            if (low < n) {
                const auto threshold = std::uint32_t(-std::uint32_t(n) % std::uint32_t(n));
                while (low < threshold) {
                    m = std::uint64_t(next_u32()) * n;
                    low = std::uint32_t(m);
                }
            }
            return m >> 32;
        }
        const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % n);
        std::uint64_t x;
        do x = next_u64(); while (x >= limit);
        return x % n;
    }
    double uniform() { return uniform01<double>(next_u32(), next_u32()); }

private:
    std::uint64_t seed_, stream_, counter_ = 0;
    Philox4x32 block_{};
    int used_ = 4;
};

}  // namespace strata::random
