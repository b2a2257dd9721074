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

namespace detail {
// Host and CUDA give the same bits only if they round the same operations. nvcc contracts a
// multiply feeding an add into one FMA by default (-fmad=true), which the host (x86-64 without
// -mfma, or -ffp-contract=off) does not, and CUDA's log and cos are not glibc's. So the streams
// below use only operations both places round identically: exact conversions, correctly
// rounded +, −, ×, ÷ and sqrt (IEEE 754 on both), with every product an explicit
// round-to-nearest multiply that nvcc never fuses (__fmul_rn, __dmul_rn).
template <class T>
STRATA_HD inline T mul_rn(T a, T b) {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(T) == 4) return __fmul_rn(a, b);
    else return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

}  // namespace detail

/// Uniform in [0, 1) with 24 random bits (float) or 53 (double).
template <class T>
STRATA_HD inline T uniform01(std::uint32_t a, std::uint32_t b) {
    if constexpr (sizeof(T) <= 4) {
        (void)b;
        return detail::mul_rn(T(a >> 8), T(1.0f / 16777216.0f));  // exact: a power-of-two scale
    } else {
        const std::uint64_t bits = (std::uint64_t(a) << 21) ^ (std::uint64_t(b) >> 11);
        return detail::mul_rn(T(bits & ((std::uint64_t(1) << 53) - 1)), T(1.0 / 9007199254740992.0));  // exact
    }
}

namespace detail {
/// Natural logarithm of x in (0, 1], from + − × ÷ alone: x = m·2^e with m in [√½, √2), then
/// log m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172, summed to s^25 (the next term is below
/// 2^-60 of the result). Within a few ulp of the correctly rounded log; the same bits on every
/// place.
STRATA_HD inline double portable_log(double x) {
    int e = 0;
    // frexp by hand (exact: scaling by powers of two), so no library call differs by place.
    double m = x;
    while (m < 0.5) { m = mul_rn(m, 2.0); --e; }
    if (m < 0.70710678118654752440) { m = mul_rn(m, 2.0); --e; }
    const double s = (m - 1.0) / (m + 1.0), s2 = mul_rn(s, s);
    // 1/(2k+1) for k = 0..12, as literals.
    constexpr double inv_odd[13] = {1.000000000000000000000e+0,
                                    3.333333333333333333333e-1,
                                    2.000000000000000000000e-1,
                                    1.428571428571428571429e-1,
                                    1.111111111111111111111e-1,
                                    9.090909090909090909091e-2,
                                    7.692307692307692307692e-2,
                                    6.666666666666666666667e-2,
                                    5.882352941176470588235e-2,
                                    5.263157894736842105263e-2,
                                    4.761904761904761904762e-2,
                                    4.347826086956521739130e-2,
                                    4.000000000000000000000e-2};
    double series = inv_odd[12];
    for (int k = 11; k >= 0; --k) series = inv_odd[k] + mul_rn(s2, series);
    const double log_m = mul_rn(2.0, mul_rn(s, series));
    // ln 2 split so that e·ln2_hi is exact for |e| < 2^11.
    constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    return mul_rn(double(e), ln2_hi) + (mul_rn(double(e), ln2_lo) + log_m);
}

/// cos(2πu) for u in [0, 1), from + − × alone: the symmetries of cos bring u to w in [0, 1/8]
/// (each reduction an exact subtraction), then a Taylor polynomial of cos or sin of 2πw
/// (|2πw| ≤ π/4, terms to the 18th power).
STRATA_HD inline double portable_cos_2pi(double u) {
    double sign = 1.0;
    if (u > 0.5) u = 1.0 - u;                  // cos(2π(1 − u)) = cos(2πu)
    if (u > 0.25) { u = 0.5 - u; sign = -1.0; }  // cos(2π(½ − u)) = −cos(2πu)
    bool use_sin = false;
    if (u > 0.125) { u = 0.25 - u; use_sin = true; }  // cos(2π(¼ − u)) = sin(2πu)
    const double t = mul_rn(6.283185307179586476925, u), t2 = mul_rn(t, t);
    // Taylor coefficients (−1)^k/(2k)! and (−1)^k/(2k+1)!, as literals (rounded by the compiler
    // once, the same for host and device code).
    constexpr double cos_c[10] = {1.000000000000000000000e+0,
                                  -5.000000000000000000000e-1,
                                  4.166666666666666666667e-2,
                                  -1.388888888888888888889e-3,
                                  2.480158730158730158730e-5,
                                  -2.755731922398589065256e-7,
                                  2.087675698786809897921e-9,
                                  -1.147074559772972471385e-11,
                                  4.779477332387385297438e-14,
                                  -1.561920696858622646222e-16};
    constexpr double sin_c[10] = {1.000000000000000000000e+0,
                                  -1.666666666666666666667e-1,
                                  8.333333333333333333333e-3,
                                  -1.984126984126984126984e-4,
                                  2.755731922398589065256e-6,
                                  -2.505210838544171877505e-8,
                                  1.605904383682161459939e-10,
                                  -7.647163731819816475901e-13,
                                  2.811457254345520763199e-15,
                                  -8.220635246624329716956e-18};
    const double* c = use_sin ? sin_c : cos_c;
    double p = 0.0;
    for (int k = 9; k >= 0; --k) p = c[k] + mul_rn(t2, p);
    if (use_sin) p = mul_rn(t, p);
    return mul_rn(sign, p);
}
}  // namespace detail

/// Element `index` of the uniform stream (`seed`, `stream`) mapped to [lo, hi). The same bits on
/// host and CUDA (see detail::mul_rn).
template <class T>
STRATA_HD inline T uniform_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, T lo, T hi) {
    const auto r = Philox4x32::generate(seed, index, stream);
    return lo + detail::mul_rn(T(hi - lo), uniform01<T>(r.v[0], r.v[1]));
}

/// Element `index` of the normal stream (`seed`, `stream`): Box-Muller on one Philox block,
/// computed in double with the portable log and cos above, so that host and CUDA give the same
/// bits.
template <class T>
STRATA_HD inline T normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, T mean, T stddev) {
    const auto r = Philox4x32::generate(seed, index, stream ^ 0x6E6F726D616CULL);
    // 1 - u keeps the logarithm's argument in (0, 1].
    const double u1 = 1.0 - uniform01<double>(r.v[0], r.v[1]);
    const double u2 = uniform01<double>(r.v[2], r.v[3]);
    const double radius = sqrt(detail::mul_rn(-2.0, detail::portable_log(u1)));
    return mean + detail::mul_rn(stddev, T(detail::mul_rn(radius, detail::portable_cos_2pi(u2))));
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
