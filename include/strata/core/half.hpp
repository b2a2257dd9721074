#pragma once
/// \file strata/core/half.hpp
/// The 16-bit floating-point element types `bfloat16` and `float16`, and `round_to<C>(x)`, the
/// value of a float rounded to one of them (what a mixed-precision policy uses to emulate
/// 16-bit compute in float storage).
///
/// | type       | sign | exponent | fraction | largest finite | smallest normal | smallest subnormal | epsilon |
/// |------------|------|----------|----------|----------------|-----------------|--------------------|---------|
/// | `bfloat16` | 1    | 8        | 7        | ≈ 3.39e38      | 2^-126          | 2^-133             | 2^-7    |
/// | `float16`  | 1    | 5        | 10       | 65504          | 2^-14           | 2^-24              | 2^-10   |
///
/// `bfloat16` is the upper half of an IEEE binary32 (float): same exponent, so the same range,
/// with 8 significant bits. `float16` is IEEE 754 binary16. Both have ±0, subnormals, ±inf and
/// NaNs. Conversions from float round to nearest, ties to even (the IEEE default); a value whose
/// rounding exceeds the largest finite one becomes ±inf (float16: |x| >= 65520; bfloat16: |x|
/// above 0x1.fefp127, so FLT_MAX itself), and a NaN stays a NaN (made quiet, sign and leading
/// payload bits kept). Conversions to float are exact.
///
/// The types are plain 16-bit wrappers (`bits`), trivially copyable, usable in host code and in
/// CUDA device code (no cuda_bf16.h: a host build needs no CUDA). Write them qualified
/// (`strata::bfloat16`): OpenBLAS's cblas.h declares a global `bfloat16` (a uint16_t), which a
/// `using strata::bfloat16;` at global scope would clash with. Their arithmetic goes through
/// float and rounds the result back, which for + - * / is correctly rounded (float carries more
/// than twice the 16-bit types' significant bits, so the double rounding is innocuous).
///
/// \code
/// strata::bfloat16 b(3.14159f);            // 3.140625f, the nearest bfloat16
/// float r = strata::round_to<strata::float16>(1e-7f);  // 1.1920929e-07f (2 * 2^-24)
/// \endcode

#include <cstdint>
#include <limits>
#include <type_traits>

#include "strata/config.hpp"

namespace strata {

namespace detail {
// __builtin_bit_cast (GCC >= 11, Clang, nvcc's front end) rather than std::bit_cast: it is
// constexpr in host and device code alike, where std::bit_cast is a host function to nvcc.
STRATA_HD constexpr std::uint32_t bits_of(float x) { return __builtin_bit_cast(std::uint32_t, x); }
STRATA_HD constexpr float float_of(std::uint32_t u) { return __builtin_bit_cast(float, u); }

// The rounding itself, on a float's bits, for each format: the result is a float's bits whose
// value is representable in the format. Both keep the sign aside and turn a NaN into the float
// NaN the 16-bit one converts back to (quiet bit set, payload cut to the format's width).
STRATA_HD constexpr std::uint32_t round_bits_bfloat16(std::uint32_t u) {
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (u | 0x00400000u) & 0xffff0000u;
    // Adding 0x7fff plus the last kept bit carries into the kept bits exactly when the cut part
    // is above half, or half with an odd last kept bit; the largest values carry into the
    // exponent and give inf, as they should. The sign bit is never reached.
    return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}
STRATA_HD constexpr std::uint32_t round_bits_float16(std::uint32_t u) {
    const std::uint32_t s = u & 0x80000000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (u | 0x00400000u) & 0xffffe000u;
    if (a >= 0x477ff000u) return s | 0x7f800000u;  // |x| >= 65520 (or inf): rounds past 65504
    if (a < 0x38800000u) {
        // Below 2^-14 the float16 grid is the multiples of 2^-24, which is float's spacing on
        // [0.5, 1): adding 0.5 rounds |x| to that grid (to nearest, ties to even, in the FPU),
        // and subtracting it again is exact.
        return s | bits_of((float_of(a) + 0.5f) - 0.5f);
    }
    return s | ((a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u);
}
}  // namespace detail

/// bfloat16: 1 sign bit, 8 exponent bits (bias 127, float's range), 7 fraction bits.
/// Requires nothing; `bfloat16(x)` rounds x to nearest, ties to even; `float(b)` is exact.
/// A default-constructed one is uninitialised, like a float.
struct bfloat16 {
    std::uint16_t bits;

    bfloat16() = default;
    /// The nearest bfloat16 to x (ties to even; NaN stays NaN; beyond the range, ±inf). A double
    /// converts to float first (two roundings).
    STRATA_HD constexpr explicit bfloat16(float x) : bits(std::uint16_t(detail::round_bits_bfloat16(detail::bits_of(x)) >> 16)) {}
    /// The bfloat16 with this bit pattern.
    STRATA_HD static constexpr bfloat16 from_bits(std::uint16_t b) {
        bfloat16 h{};
        h.bits = b;
        return h;
    }
    /// The exact value as a float.
    STRATA_HD constexpr float to_float() const { return detail::float_of(std::uint32_t(bits) << 16); }
    STRATA_HD constexpr explicit operator float() const { return to_float(); }
    /// Exact too (what reductions accumulate in).
    STRATA_HD constexpr explicit operator double() const { return to_float(); }
};

/// float16 (IEEE 754 binary16): 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits.
/// Largest finite 65504, smallest normal 2^-14, smallest subnormal 2^-24. `float16(x)` rounds
/// x to nearest, ties to even (|x| >= 65520 gives ±inf); `float(h)` is exact.
struct float16 {
    std::uint16_t bits;

    float16() = default;
    /// The nearest float16 to x (ties to even; NaN stays NaN; |x| >= 65520 gives ±inf). A double
    /// converts to float first (two roundings).
    STRATA_HD constexpr explicit float16(float x) : bits(encode(detail::round_bits_float16(detail::bits_of(x)))) {}
    /// The float16 with this bit pattern.
    STRATA_HD static constexpr float16 from_bits(std::uint16_t b) {
        float16 h{};
        h.bits = b;
        return h;
    }
    /// The exact value as a float.
    STRATA_HD constexpr float to_float() const {
        const std::uint32_t s = std::uint32_t(bits & 0x8000u) << 16, mag = bits & 0x7fffu;
        // Normal numbers rebias the exponent (15 to 127); inf and NaN keep an all-ones exponent;
        // subnormals are m · 2^-24, exact in float. All three are computed and one is selected,
        // so that a loop of conversions vectorises (written with branches, GCC -O3 left it
        // scalar: 3.4 ns an element on this host's AVX-512 core, 0.44 ns selected).
        const std::uint32_t normal = (mag << 13) + (112u << 23);
        const std::uint32_t special = (mag << 13) | 0x7f800000u;
        // m · 2^-24 = (2^-14 + m · 2^-24) - 2^-14, exact; the subtraction runs on every element
        // (0 - 0 where not subnormal), which lets GCC keep it out of a branch under -ftrapping-math.
        const std::uint32_t lifted = mag < 0x0400u ? (113u << 23) | (mag << 13) : (113u << 23);
        const std::uint32_t subnormal = detail::bits_of(detail::float_of(lifted) - 0x1p-14f);
        std::uint32_t r = mag < 0x0400u ? subnormal : normal;
        r = mag >= 0x7c00u ? special : r;
        return detail::float_of(s | r);
    }
    STRATA_HD constexpr explicit operator float() const { return to_float(); }
    /// Exact too (what reductions accumulate in).
    STRATA_HD constexpr explicit operator double() const { return to_float(); }

private:
    // r is already a float16 value (round_bits_float16's result): re-encoding is exact.
    STRATA_HD static constexpr std::uint16_t encode(std::uint32_t r) {
        const std::uint16_t s = std::uint16_t((r >> 16) & 0x8000u);
        const std::uint32_t a = r & 0x7fffffffu;
        if (a >= 0x7f800000u) return std::uint16_t(s | 0x7c00u | ((a >> 13) & 0x3ffu));
        if (a < 0x38800000u) return std::uint16_t(s | std::uint16_t(detail::float_of(a) * 0x1p24f));
        return std::uint16_t(s | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
    }
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16> && std::is_standard_layout_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16> && std::is_standard_layout_v<float16>);

namespace detail {
/// Whether T is one of strata's 16-bit floating-point types (cv-qualifiers ignored).
template <class T>
inline constexpr bool is_half_v = std::is_same_v<std::remove_cv_t<T>, bfloat16> || std::is_same_v<std::remove_cv_t<T>, float16>;
}  // namespace detail

/// The value of `x` rounded to the format `C` (`bfloat16`, `float16`, or `float`: x itself), as
/// a float: `round_to<C>(x) == float(C(x))`, bit for bit, NaNs included. Branch-light and
/// constexpr; STRATA_HD, so a kernel can emulate 16-bit storage of its results in float.
///
/// \code
/// static_assert(strata::round_to<strata::bfloat16>(1.0f + 0x1p-8f) == 1.0f);  // a tie, to even
/// static_assert(strata::round_to<strata::float16>(70000.0f) == INFINITY);
/// \endcode
template <class C>
STRATA_HD constexpr float round_to(float x) {
    static_assert(std::is_same_v<C, float> || detail::is_half_v<C>,
                  "strata::round_to<C>: C must be strata::bfloat16, strata::float16 or float");
    if constexpr (std::is_same_v<C, bfloat16>)
        return detail::float_of(detail::round_bits_bfloat16(detail::bits_of(x)));
    else if constexpr (std::is_same_v<C, float16>)
        return detail::float_of(detail::round_bits_float16(detail::bits_of(x)));
    else
        return x;
}

/// Neither infinite nor NaN.
STRATA_HD constexpr bool is_finite(bfloat16 h) { return (h.bits & 0x7f80u) != 0x7f80u; }
STRATA_HD constexpr bool is_finite(float16 h) { return (h.bits & 0x7c00u) != 0x7c00u; }
/// A NaN (any payload, either sign).
STRATA_HD constexpr bool is_nan(bfloat16 h) { return (h.bits & 0x7fffu) > 0x7f80u; }
STRATA_HD constexpr bool is_nan(float16 h) { return (h.bits & 0x7fffu) > 0x7c00u; }

// Arithmetic and comparisons through float: each result rounded back to the type, comparisons
// with IEEE semantics (NaN unordered, -0 == +0). Constrained to the two types so that they
// are never candidates for anything else.
#define STRATA_HALF_BINARY_OP(op)                                                                     \
    template <class H>                                                                                \
        requires detail::is_half_v<H>                                                                 \
    STRATA_HD constexpr H operator op(H a, H b) { return H(float(a) op float(b)); }                  \
    template <class H>                                                                                \
        requires detail::is_half_v<H>                                                                 \
    STRATA_HD constexpr H& operator op##=(H& a, H b) { return a = H(float(a) op float(b)); }
STRATA_HALF_BINARY_OP(+)
STRATA_HALF_BINARY_OP(-)
STRATA_HALF_BINARY_OP(*)
STRATA_HALF_BINARY_OP(/)
#undef STRATA_HALF_BINARY_OP
#define STRATA_HALF_COMPARE_OP(op)                                                                    \
    template <class H>                                                                                \
        requires detail::is_half_v<H>                                                                 \
    STRATA_HD constexpr bool operator op(H a, H b) { return float(a) op float(b); }
STRATA_HALF_COMPARE_OP(==)
STRATA_HALF_COMPARE_OP(!=)
STRATA_HALF_COMPARE_OP(<)
STRATA_HALF_COMPARE_OP(<=)
STRATA_HALF_COMPARE_OP(>)
STRATA_HALF_COMPARE_OP(>=)
#undef STRATA_HALF_COMPARE_OP
/// Negation flips the sign bit (exact, NaNs included).
template <class H>
    requires detail::is_half_v<H>
STRATA_HD constexpr H operator-(H a) { return H::from_bits(std::uint16_t(a.bits ^ 0x8000u)); }
template <class H>
    requires detail::is_half_v<H>
STRATA_HD constexpr H operator+(H a) { return a; }

namespace detail {
// The numeric_limits members both types share; each specialisation adds its own values.
template <class H>
struct half_limits_common {
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = true;
    static constexpr bool has_quiet_NaN = true;
    static constexpr bool has_signaling_NaN = true;
    static constexpr std::float_denorm_style has_denorm = std::denorm_present;
    static constexpr bool has_denorm_loss = false;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr bool is_iec559 = false;  // bfloat16 is no IEEE format; float16 overrides
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr int radix = 2;
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;
    STRATA_HD static constexpr H round_error() noexcept { return H::from_bits(H(0.5f).bits); }
};
}  // namespace detail

}  // namespace strata

/// std::numeric_limits of the 16-bit types (each value a bit pattern, so constexpr everywhere).
template <>
struct std::numeric_limits<strata::bfloat16> : strata::detail::half_limits_common<strata::bfloat16> {
    using H = strata::bfloat16;
    static constexpr int digits = 8;
    static constexpr int digits10 = 2;
    static constexpr int max_digits10 = 4;
    static constexpr int min_exponent = -125;
    static constexpr int min_exponent10 = -37;
    static constexpr int max_exponent = 128;
    static constexpr int max_exponent10 = 38;
    STRATA_HD static constexpr H min() noexcept { return H::from_bits(0x0080); }        // 2^-126
    STRATA_HD static constexpr H max() noexcept { return H::from_bits(0x7f7f); }        // (2 - 2^-7) 2^127
    STRATA_HD static constexpr H lowest() noexcept { return H::from_bits(0xff7f); }
    STRATA_HD static constexpr H epsilon() noexcept { return H::from_bits(0x3c00); }    // 2^-7
    STRATA_HD static constexpr H infinity() noexcept { return H::from_bits(0x7f80); }
    STRATA_HD static constexpr H quiet_NaN() noexcept { return H::from_bits(0x7fc0); }
    STRATA_HD static constexpr H signaling_NaN() noexcept { return H::from_bits(0x7fa0); }
    STRATA_HD static constexpr H denorm_min() noexcept { return H::from_bits(0x0001); } // 2^-133
};

template <>
struct std::numeric_limits<strata::float16> : strata::detail::half_limits_common<strata::float16> {
    using H = strata::float16;
    static constexpr bool is_iec559 = true;
    static constexpr int digits = 11;
    static constexpr int digits10 = 3;
    static constexpr int max_digits10 = 5;
    static constexpr int min_exponent = -13;
    static constexpr int min_exponent10 = -4;
    static constexpr int max_exponent = 16;
    static constexpr int max_exponent10 = 4;
    STRATA_HD static constexpr H min() noexcept { return H::from_bits(0x0400); }        // 2^-14
    STRATA_HD static constexpr H max() noexcept { return H::from_bits(0x7bff); }        // 65504
    STRATA_HD static constexpr H lowest() noexcept { return H::from_bits(0xfbff); }
    STRATA_HD static constexpr H epsilon() noexcept { return H::from_bits(0x1400); }    // 2^-10
    STRATA_HD static constexpr H infinity() noexcept { return H::from_bits(0x7c00); }
    STRATA_HD static constexpr H quiet_NaN() noexcept { return H::from_bits(0x7e00); }
    STRATA_HD static constexpr H signaling_NaN() noexcept { return H::from_bits(0x7d00); }
    STRATA_HD static constexpr H denorm_min() noexcept { return H::from_bits(0x0001); } // 2^-24
};
