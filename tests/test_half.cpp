// The 16-bit floats (core/half.hpp) and their tensors (tensor/convert.hpp, the 16-bit GEMM).
// Rounding is checked against a reference written another way: the finite values of each format
// decoded in double with ldexp from the IEEE fields, sorted, and a double-precision search for
// the nearest (ties to the even bit pattern). The same source is compiled for Host (g++) and,
// as test_half.cu, for Host + Cuda (nvcc).
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <strata/core/half.hpp>
#include <strata/tensor/tensor_all.hpp>

#include "test_places.hpp"

// Aliases, not using-declarations: OpenBLAS's cblas.h declares a global `bfloat16` (uint16_t).
using BF16 = strata::bfloat16;
using FP16 = strata::float16;
using strata::Shape;
using strata::Tensor;
using strata::Trans;

namespace {

std::uint32_t bits(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
float from_u32(std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

// Each format's IEEE fields, for the reference.
template <class H>
struct Format;
template <>
struct Format<BF16> {
    static constexpr int exp_bits = 8, frac_bits = 7, bias = 127;
};
template <>
struct Format<FP16> {
    static constexpr int exp_bits = 5, frac_bits = 10, bias = 15;
};

/// The value of a bit pattern in double, from the fields (NaN for NaNs).
template <class H>
double reference_value(std::uint16_t b) {
    using F = Format<H>;
    const int sign = b >> 15, e = (b >> F::frac_bits) & ((1 << F::exp_bits) - 1), m = b & ((1 << F::frac_bits) - 1);
    double v;
    if (e == (1 << F::exp_bits) - 1)
        v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0)
        v = std::ldexp(double(m), 1 - F::bias - F::frac_bits);
    else
        v = std::ldexp(1.0 + std::ldexp(double(m), -F::frac_bits), e - F::bias);
    return sign ? -v : v;
}

/// Every finite non-negative value of the format, sorted, with its bit pattern.
template <class H>
struct Table {
    std::vector<double> value;
    std::vector<std::uint16_t> pattern;
    double overflow;  // the midpoint between the largest finite value and the next power: rounds to inf
    Table() {
        std::vector<std::pair<double, std::uint16_t>> all;
        for (std::uint32_t b = 0; b < 0x8000; ++b) {
            const double v = reference_value<H>(std::uint16_t(b));
            if (std::isfinite(v)) all.emplace_back(v, std::uint16_t(b));
        }
        std::sort(all.begin(), all.end());
        for (auto& [v, p] : all) {
            value.push_back(v);
            pattern.push_back(p);
        }
        const double top = value.back(), ulp = top - value[value.size() - 2];
        overflow = top + ulp / 2;
    }
    static const Table& get() {
        static const Table t;
        return t;
    }
};

/// The reference rounding of x to H, as a bit pattern (NaN inputs excluded).
template <class H>
std::uint16_t reference_round(float x) {
    const auto& t = Table<H>::get();
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const std::uint16_t inf = std::uint16_t(((1u << Format<H>::exp_bits) - 1) << Format<H>::frac_bits);
    const double a = std::fabs(double(x));
    if (a >= t.overflow) return sign | inf;  // the largest finite value has an odd pattern: a tie goes up
    const auto it = std::lower_bound(t.value.begin(), t.value.end(), a);
    const std::size_t hi = std::size_t(it - t.value.begin());
    if (hi == t.value.size()) return sign | t.pattern.back();  // above the largest, below the overflow midpoint
    if (t.value[hi] == a) return sign | t.pattern[hi];
    const std::size_t lo = hi - 1;
    const double dlo = a - t.value[lo], dhi = t.value[hi] - a;
    std::size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((t.pattern[lo] & 1) == 0 ? lo : hi);
    return sign | t.pattern[pick];
}

struct SplitMix {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
};

/// The inputs the rounding is checked on: every midpoint between consecutive finite values and
/// its float neighbours, both signs; the overflow boundary; specials; random bit patterns (every
/// exponent, subnormals, NaNs, infs) and random values inside the format's range.
template <class H>
std::vector<float> rounding_inputs(std::size_t random_count) {
    const auto& t = Table<H>::get();
    std::vector<float> in;
    auto add = [&](float x) {
        for (float v : {x, std::nextafter(x, INFINITY), std::nextafter(x, 0.0f)}) {
            in.push_back(v);
            in.push_back(-v);
        }
    };
    for (std::size_t i = 0; i + 1 < t.value.size(); ++i) {
        const double mid = (t.value[i] + t.value[i + 1]) / 2;
        REQUIRE(double(float(mid)) == mid);  // every midpoint is a float (more than 2x the bits)
        add(float(mid));
        add(float(t.value[i]));
    }
    add(float(t.overflow));
    add(float(t.value.back()));
    for (float x : {0.0f, FLT_MIN, FLT_TRUE_MIN, FLT_MAX, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1.0f, 0x1p-24f,
                    0x1p-25f, 0x1.000002p-25f, 0x1p-14f, 0x1p-126f, 0x1p-133f, 0x1p-134f})
        add(x);
    in.push_back(INFINITY);
    in.push_back(-INFINITY);
    SplitMix rng{0x44};
    for (std::size_t i = 0; i < random_count; ++i) {
        const std::uint64_t r = rng.next();
        in.push_back(from_u32(std::uint32_t(r)));  // any float, NaNs included
        // a value in the format's range: a random exponent over its normals and subnormals
        const int lo_exp = 1 - Format<H>::bias - Format<H>::frac_bits - 2, hi_exp = Format<H>::bias + 2;
        const int e = lo_exp + int((r >> 32) % std::uint64_t(hi_exp - lo_exp + 1));
        const float m = 1.0f + float((r >> 40) & 0x7fffff) * 0x1p-23f;
        in.push_back(((r >> 63) ? -1.0f : 1.0f) * std::ldexp(m, e));
    }
    return in;
}

/// How many of `inputs` `encode` rounds otherwise than the reference (NaNs: must give a quiet
/// NaN of the same sign).
template <class H, class Encode>
std::size_t rounding_errors(const std::vector<float>& inputs, Encode encode, bool report = true) {
    std::size_t errors = 0;
    const std::uint16_t quiet = Format<H>::frac_bits == 10 ? 0x0200 : 0x0040;
    for (float x : inputs) {
        const std::uint16_t got = encode(x);
        if (std::isnan(x)) {
            const bool ok = strata::is_nan(H::from_bits(got)) && (got & quiet) && ((got >> 15) == (bits(x) >> 31));
            if (report && !ok && errors < 5) MESSAGE("NaN mismatch at bits ", bits(x), ": got ", got);
            errors += !ok;
        } else {
            if (report && got != reference_round<H>(x) && errors < 5)
                MESSAGE("mismatch at ", double(x), " bits ", bits(x), ": got ", got, ", expected ", reference_round<H>(x));
            errors += got != reference_round<H>(x);
        }
    }
    return errors;
}

}  // namespace

TEST_CASE_TEMPLATE("every 16-bit pattern converts to float exactly and back bit for bit", H, BF16, FP16) {
    std::size_t nans = 0;
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
        const H h = H::from_bits(std::uint16_t(b));
        const float f = float(h);
        const double ref = reference_value<H>(std::uint16_t(b));
        CAPTURE(b);
        if (std::isnan(ref)) {
            ++nans;
            REQUIRE(std::isnan(f));
            REQUIRE(strata::is_nan(H(f)));
            REQUIRE(!strata::is_finite(h));
            REQUIRE(strata::is_nan(h));
            REQUIRE(std::isnan(strata::round_to<H>(f)));
        } else {
            REQUIRE(double(f) == ref);
            REQUIRE(std::signbit(f) == bool(b >> 15));
            REQUIRE(H(f).bits == b);
            REQUIRE(strata::is_finite(h) == std::isfinite(ref));
            REQUIRE(bits(strata::round_to<H>(f)) == bits(f));
        }
    }
    // 2 signs x (2^frac_bits - 1) NaN payloads.
    CHECK(nans == 2 * ((std::size_t(1) << Format<H>::frac_bits) - 1));
}

TEST_CASE_TEMPLATE("float to 16 bits rounds to nearest, ties to even, as the float64 reference", H, BF16, FP16) {
    const auto inputs = rounding_inputs<H>(2'000'000);
    MESSAGE(inputs.size(), " inputs");
    CHECK(rounding_errors<H>(inputs, [](float x) { return H(x).bits; }) == 0);
    // round_to<H>(x) is float(H(x)), bit for bit (NaNs included).
    std::size_t differ = 0;
    for (float x : inputs) differ += bits(strata::round_to<H>(x)) != bits(float(H(x)));
    CHECK(differ == 0);
    CHECK(strata::round_to<float>(0.1f) == 0.1f);

    // Negative controls: the same check catches truncation and ties-away-from-zero.
    const int cut = 23 - Format<H>::frac_bits;
    auto truncate = [&](float x) -> std::uint16_t {
        if (std::isnan(x)) return H(x).bits;
        const std::uint32_t u = bits(x) & ~((1u << cut) - 1);
        return H(from_u32(u)).bits;  // already representable, or a float below the range
    };
    auto ties_away = [&](float x) -> std::uint16_t {
        if (std::isnan(x)) return H(x).bits;
        const std::uint32_t u = bits(x), half = 1u << (cut - 1);
        if ((u & ((1u << cut) - 1)) == half) return H(from_u32(u + half)).bits;  // a tie up in magnitude
        return H(x).bits;
    };
    const auto midpoint_inputs = rounding_inputs<H>(0);
    const std::size_t by_truncation = rounding_errors<H>(midpoint_inputs, truncate, false);
    const std::size_t by_ties_away = rounding_errors<H>(midpoint_inputs, ties_away, false);
    MESSAGE("of ", midpoint_inputs.size(), " midpoint inputs, truncation fails ", by_truncation, ", ties away from zero ",
            by_ties_away);
    CHECK(by_truncation > 0);
    CHECK(by_ties_away > 0);
}

TEST_CASE("the formats' boundaries") {
    using LF = std::numeric_limits<FP16>;
    using LB = std::numeric_limits<BF16>;
    CHECK(float(LF::max()) == 65504.0f);
    CHECK(float(LF::lowest()) == -65504.0f);
    CHECK(float(LF::min()) == 0x1p-14f);
    CHECK(float(LF::denorm_min()) == 0x1p-24f);
    CHECK(float(LF::epsilon()) == 0x1p-10f);
    CHECK(std::isinf(float(LF::infinity())));
    CHECK(std::isnan(float(LF::quiet_NaN())));
    CHECK(LF::digits == 11);
    CHECK(float(LB::max()) == 0x1.fep127f);
    CHECK(float(LB::min()) == FLT_MIN);
    CHECK(float(LB::denorm_min()) == 0x1p-133f);
    CHECK(float(LB::epsilon()) == 0x1p-7f);
    CHECK(LB::digits == 8);
    CHECK(std::isinf(float(LB::infinity())));
    CHECK(std::isnan(float(LB::quiet_NaN())));

    CHECK(float(FP16(65519.99f)) == 65504.0f);
    CHECK(std::isinf(float(FP16(65520.0f))));
    CHECK(std::isinf(float(FP16(-65520.0f))));
    CHECK(float(FP16(-65520.0f)) < 0);
    CHECK(std::isinf(float(BF16(FLT_MAX))));
    CHECK(float(BF16(0x1.fefffep127f)) == 0x1.fep127f);
    CHECK(std::isnan(float(BF16(from_u32(0x7f800001u)))));  // a payload in the cut bits: still NaN
    CHECK(std::isnan(float(FP16(from_u32(0x7f800001u)))));
    CHECK(FP16(-0.0f).bits == 0x8000);
    CHECK(BF16(-0.0f).bits == 0x8000);
    CHECK(FP16(-1e-10f).bits == 0x8000);
    // Arithmetic through float, rounded back; comparisons with IEEE semantics.
    CHECK(float(FP16(1.0f) + FP16(0x1p-11f)) == 1.0f);  // a tie, to even
    CHECK(float(BF16(3.0f) * BF16(0.5f)) == 1.5f);
    CHECK(float(-BF16(2.0f)) == -2.0f);
    CHECK(FP16(0.0f) == FP16(-0.0f));
    CHECK(!(LF::quiet_NaN() == LF::quiet_NaN()));
    CHECK(BF16(1.0f) < BF16(2.0f));
    static_assert(strata::detail::is_half_v<const BF16> && !strata::detail::is_half_v<float>);
    static_assert(std::is_same_v<strata::accumulate_t<BF16>, double> && std::is_same_v<strata::accumulate_t<FP16>, double>);
    static_assert(strata::round_to<BF16>(1.0f + 0x1p-8f) == 1.0f);
}

namespace {
template <class H, class P>
void check_tensor_ops() {
    // Odd size, values over the format's range and beyond, with specials at known places.
    const std::int64_t n = 10007;
    std::vector<float> v(static_cast<std::size_t>(n));
    SplitMix rng{7};
    for (auto& x : v) {
        const std::uint64_t r = rng.next();
        x = std::ldexp(1.0f + float(r & 0xffffff) * 0x1p-24f, int((r >> 32) % 60) - 30) * ((r >> 63) ? -1.0f : 1.0f);
    }
    v[3] = INFINITY;
    v[500] = -INFINITY;
    v[777] = NAN;
    v[9000] = 1e30f;  // finite in float; FP16: inf
    const auto x = strata::copy_to<P>(strata::from_vector(v, Shape{n}).view());

    // count_nonfinite
    CHECK(strata::count_nonfinite(x.view()) == 3);
    CHECK(strata::count_nonfinite(x.view().slice(4, 400)) == 0);
    CHECK(strata::count_nonfinite(strata::TensorView<const float, P>(x.data(), Shape{0})) == 0);

    // convert float -> H -> float and round_to_inplace, against loops on the host
    Tensor<H, P> h(Shape{n});
    strata::convert(x.view(), h.view());
    Tensor<float, P> back(Shape{n});
    strata::convert(strata::TensorView<const H, P>(h.data(), h.shape()), back.view());
    auto r = x.clone();
    strata::round_to_inplace<H>(r.view());
    const auto hv = strata::to_vector(h.view());
    const auto bv = strata::to_vector(back.view()), rv = strata::to_vector(r.view());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        bad += hv[i].bits != H(v[i]).bits;
        bad += bits(bv[i]) != bits(float(H(v[i])));
        bad += bits(rv[i]) != bits(strata::round_to<H>(v[i]));
    }
    CHECK(bad == 0);
    CHECK(strata::count_nonfinite(h.view()) == (std::is_same_v<H, FP16> ? 4 : 3) + std::int64_t(std::count_if(
        v.begin(), v.end(), [](float y) { return std::isfinite(y) && y != 1e30f && !strata::is_finite(H(y)); })));
    auto r_float = x.clone();
    strata::round_to_inplace<float>(r_float.view());
    CHECK(std::memcmp(strata::to_vector(r_float.view()).data(), v.data(), v.size() * 4) == 0);  // unchanged

    // sum of a 16-bit tensor accumulates in double: 1.5 stays 1.5 (an integer accumulator
    // would add 1 each time)
    Tensor<H, P> ones(Shape{100001});
    strata::fill(ones.view(), H(1.5f));
    CHECK(strata::sum(ones.view()) == 150001.5);
    {
        std::vector<H> w(static_cast<std::size_t>(n));
        double ref = 0;
        for (std::size_t i = 0; i < w.size(); ++i) {
            w[i] = H(std::ldexp(float(i % 97) - 48.0f, -int(i % 5)));
            ref += double(float(w[i]));
        }
        const auto t = strata::copy_to<P>(strata::from_vector(w, Shape{n}).view());
        CHECK(strata::sum(t.view()) == ref);  // small integers over 2^4: exact in double
    }
}

template <class H, class P>
void check_half_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t seed) {
    SplitMix rng{seed};
    auto uniform = [&] { return float(double(rng.next() >> 11) * 0x1p-53 * 4.0 - 2.0); };
    const Shape sa = ta == Trans::No ? Shape{m, k} : Shape{k, m};
    const Shape sb = tb == Trans::No ? Shape{k, n} : Shape{n, k};
    std::vector<H> av(std::size_t(sa.size())), bv(std::size_t(sb.size()));
    for (auto& a : av) a = H(uniform());
    for (auto& b : bv) b = H(uniform());
    std::vector<float> cv(std::size_t(m * n));
    for (auto& c : cv) c = uniform();
    const float alpha = 1.5f, beta = -0.75f;
    auto A = [&](std::int64_t i, std::int64_t l) { return double(float(ta == Trans::No ? av[std::size_t(i * k + l)] : av[std::size_t(l * m + i)])); };
    auto B = [&](std::int64_t l, std::int64_t j) { return double(float(tb == Trans::No ? bv[std::size_t(l * n + j)] : bv[std::size_t(j * k + l)])); };
    const auto a = strata::copy_to<P>(strata::from_vector(av, sa).view());
    const auto b = strata::copy_to<P>(strata::from_vector(bv, sb).view());
    auto c = strata::copy_to<P>(strata::from_vector(cv, Shape{m, n}).view());
    strata::gemm(ta, tb, alpha, a.view(), b.view(), beta, c.view());
    const auto got = strata::to_vector(c.view());
    // Products of two 16-bit values are exact in float: the error is float accumulation only,
    // at most (k + 2) units of 2^-24 of the sum of magnitudes.
    std::size_t bad = 0;
    double worst = 0;
    for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (std::int64_t l = 0; l < k; ++l) {
                ref += A(i, l) * B(l, j);
                mag += std::fabs(A(i, l) * B(l, j));
            }
            const double c0 = cv[std::size_t(i * n + j)];
            ref = double(alpha) * ref + double(beta) * c0;
            mag = double(alpha) * mag + std::fabs(double(beta) * c0);
            const double err = std::fabs(double(got[std::size_t(i * n + j)]) - ref);
            worst = std::max(worst, err / (mag > 0 ? mag : 1));
            bad += err > double(k + 2) * 0x1p-24 * mag;
        }
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(int(ta));
    CAPTURE(int(tb));
    CHECK(bad == 0);
    CHECK(worst < 1e-5);
}
}  // namespace

TEST_CASE_TEMPLATE("convert, round_to_inplace, count_nonfinite and sum of 16-bit tensors match loops", P, STRATA_TEST_PLACES) {
    check_tensor_ops<BF16, P>();
    check_tensor_ops<FP16, P>();
}

TEST_CASE_TEMPLATE("16-bit GEMM with float accumulation matches float64 on the rounded inputs", P, STRATA_TEST_PLACES) {
    const std::int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 29}, {33, 17, 65}, {64, 3, 257}, {5, 40, 0}};
    std::uint64_t seed = 1;
    for (auto ta : {Trans::No, Trans::Yes})
        for (auto tb : {Trans::No, Trans::Yes})
            for (const auto& s : sizes) {
                check_half_gemm<BF16, P>(ta, tb, s[0], s[1], s[2], seed++);
                check_half_gemm<FP16, P>(ta, tb, s[0], s[1], s[2], seed++);
            }
    Tensor<BF16, P> a(Shape{3, 4}), b(Shape{5, 2});
    Tensor<float, P> c(Shape{3, 2});
    CHECK_THROWS_AS(strata::gemm(Trans::No, Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view()), strata::ShapeError);
}

TEST_CASE("gemm_tf32 on the host is the float gemm") {
    std::vector<float> av(7 * 9), bv(9 * 5);
    SplitMix rng{3};
    for (auto& x : av) x = float(rng.next() >> 40) * 0x1p-24f - 0.5f;
    for (auto& x : bv) x = float(rng.next() >> 40) * 0x1p-24f - 0.5f;
    const auto a = strata::from_vector(av, Shape{7, 9}), b = strata::from_vector(bv, Shape{9, 5});
    Tensor<float> c1(Shape{7, 5}), c2(Shape{7, 5});
    strata::gemm(Trans::No, Trans::No, 1.0f, a.view(), b.view(), 0.0f, c1.view());
    strata::gemm_tf32(Trans::No, Trans::No, 1.0f, a.view(), b.view(), 0.0f, c2.view());
    CHECK(strata::to_vector(c1.view()) == strata::to_vector(c2.view()));
}
