#pragma once
/// \file strata/nn/gelu_simd.hpp
/// The exact GELU and its derivative in float on the host, eight values at a time (AVX2 and FMA,
/// the attention softmax's exponentials too: softmax_row_simd, at the end;
/// where the compiler targets them: -march=native on such a CPU, or -mavx2 -mfma), for Dense's
/// and TokenDense's rows. glibc's erfcf is a call per value that GCC does not vectorise; it was
/// about a fifth of the ViT's training step on the host (docs/tools.md).
///
/// Φ(x) = erfc(z) / 2 for x < 0 and 1 − erfc(z) / 2 otherwise, z = |x| / √2, with
/// erfc(z) ≈ t · exp(−z² + P(t)), t = 1 / (1 + z/2), P of degree 9: the Chebyshev fit of Press
/// et al., "Numerical Recipes in C" (2nd ed., 1992), §6.2 (`erfcc`), whose relative error is
/// below 1.2·10⁻⁷ for every z ≥ 0 (1.04·10⁻⁷ measured here on [0, 10] against erfc in double).
/// z² is taken exactly (x² as a rounded product plus its FMA error, halved), so that the far
/// tail keeps its digits: e^(hi + lo) is one reduction by ln 2 (Cody and Waite's two-part
/// constant), a degree-7 polynomial on |r| ≤ 0.35 (error below 6·10⁻⁹) and a scale by 2ⁿ in
/// two halves (so that results down to the subnormals come out). The derivative is
/// Φ(x) + x · φ(x) with φ(x) = e^(−x²/2) / √(2π), the same way. Measured against long double
/// over 3 million points of [−15, 15]: within 7.4 units in the last place of float on [−12, 12]
/// (14 near −13, where Φ nears float's least normal number), 1.4·10⁻⁶ relative wherever the
/// result is a normal float (the per-value erfcf form: 1.3·10⁻⁵, from rounding x/√2); the
/// derivative within 2.2·10⁻⁷ (tests/test_transformer.cpp checks both).
///
/// Every value goes through the same eight-lane sequence (a tail is padded to eight), so a
/// value's result does not depend on where it sits in a row or in a batch: N replicas on the
/// shards of a batch give one device's bits. Where the instructions are not targeted (and in
/// nvcc's units: `strata::nn::detail::gelu_simd` is false there) the layers keep the per-value
/// std::erfc form. ActivationLayer<GELU> takes the eight lanes too; the per-value `GELU::apply`
/// (and a GPU) keeps std::erfc.

#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
#define STRATA_GELU_SIMD 1
#include <immintrin.h>
#else
#define STRATA_GELU_SIMD 0
#endif

namespace strata::nn::detail {

/// Whether this unit has the eight-lane float GELU.
inline constexpr bool gelu_simd = STRATA_GELU_SIMD != 0;

#if STRATA_GELU_SIMD
struct GeluLanes {
    // e^(ah + al), |al| small beside |ah| where it matters; 0 where ah + al < −104 (below half
    // the least subnormal), NaN where either is NaN.
    static __m256 exp(__m256 ah, __m256 al) {
        const __m256 a = _mm256_add_ps(ah, al);
        const __m256 low = _mm256_set1_ps(-104.0f);
        const __m256 n = _mm256_round_ps(_mm256_mul_ps(_mm256_max_ps(a, low), _mm256_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        // ln 2 = 0.693359375 − 2.12194440e−4 (the first part exact in 9 bits: n · it is exact).
        __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), ah);
        r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
        r = _mm256_add_ps(r, al);
        __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
        // 2^n as 2^n1 · 2^n2, n1 = floor(n/2): both within float's normal exponents for n ≥ −151.
        const __m256 n1 = _mm256_floor_ps(_mm256_mul_ps(n, _mm256_set1_ps(0.5f)));
        const __m256 n2 = _mm256_sub_ps(n, n1);
        auto pow2 = [](__m256 k) {
            return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
        };
        const __m256 res = _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(n2));
        return _mm256_blendv_ps(res, _mm256_setzero_ps(), _mm256_cmp_ps(a, low, _CMP_LT_OQ));
    }
    // Φ(x); with xpdf, also x · φ(x).
    static __m256 cdf(__m256 x, __m256* xpdf) {
        const __m256 hi = _mm256_mul_ps(x, x);
        const __m256 lo = _mm256_fmsub_ps(x, x, hi);  // x² = hi + lo exactly
        const __m256 half = _mm256_set1_ps(0.5f);
        const __m256 mhh = _mm256_mul_ps(hi, _mm256_set1_ps(-0.5f));  // −x²/2 = mhh + mhl exactly
        const __m256 mhl = _mm256_mul_ps(lo, _mm256_set1_ps(-0.5f));
        const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
        const __m256 z = _mm256_mul_ps(ax, _mm256_set1_ps(0.70710678118654752440f));
        const __m256 one = _mm256_set1_ps(1.0f);
        const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(z, half, one));
        __m256 p = _mm256_set1_ps(0.17087277f);
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
        const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(t, exp(mhh, _mm256_add_ps(p, mhl))), half);
        const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
        const __m256 c = _mm256_blendv_ps(_mm256_sub_ps(one, half_erfc), half_erfc, neg);
        if (xpdf) *xpdf = _mm256_mul_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.39894228040143267794f), exp(mhh, mhl)));
        return c;
    }
    // x · Φ(x): x beyond 40, 0 below −40 (so ±inf come out as GELU's limits), NaN stays NaN.
    static __m256 gelu(__m256 x) {
        const __m256 y = _mm256_mul_ps(x, cdf(x, nullptr));
        const __m256 y1 = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, _mm256_set1_ps(40.0f), _CMP_GT_OQ));
        return _mm256_blendv_ps(y1, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-40.0f), _CMP_LT_OQ));
    }
    // dy · (Φ(x) + x · φ(x)): dy beyond 40, dy · 0 below −40.
    static __m256 grad(__m256 x, __m256 dy) {
        __m256 xpdf;
        const __m256 c = cdf(x, &xpdf);
        __m256 g = _mm256_add_ps(c, xpdf);
        g = _mm256_blendv_ps(g, _mm256_set1_ps(1.0f), _mm256_cmp_ps(x, _mm256_set1_ps(40.0f), _CMP_GT_OQ));
        g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-40.0f), _CMP_LT_OQ));
        return _mm256_mul_ps(dy, g);
    }
};
#endif

/// dst[c] = GELU(src[c] + bias[c]) for c < n (src may be dst), keeping src + bias in `keep`
/// when it is not null (bias may be null). Requires gelu_simd.
inline void gelu_apply_simd(const float* src, float* dst, float* keep, const float* bias, std::int64_t n) {
#if STRATA_GELU_SIMD
    std::int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 v = _mm256_loadu_ps(src + c);
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + c));
        if (keep) _mm256_storeu_ps(keep + c, v);
        _mm256_storeu_ps(dst + c, GeluLanes::gelu(v));
    }
    if (c < n) {  // the tail through the same eight lanes
        alignas(32) float buf[8] = {};
        for (std::int64_t i = c; i < n; ++i) buf[i - c] = bias ? src[i] + bias[i] : src[i];
        const __m256 v = _mm256_load_ps(buf);
        alignas(32) float out[8];
        _mm256_store_ps(out, GeluLanes::gelu(v));
        for (std::int64_t i = c; i < n; ++i) {
            if (keep) keep[i] = buf[i - c];
            dst[i] = out[i - c];
        }
    }
#else
    (void)src, (void)dst, (void)keep, (void)bias, (void)n;
#endif
}
/// row[c] = GELU(row[c] + bias[c]) in place (gelu_apply_simd).
inline void gelu_row_simd(float* row, float* keep, const float* bias, std::int64_t n) { gelu_apply_simd(row, row, keep, bias, n); }

/// dx[i] = dy[i] · GELU'(pre[i]) for i < n (dx may be dy). Requires gelu_simd.
inline void gelu_grad_apply_simd(const float* pre, const float* dy, float* dx, std::int64_t n) {
#if STRATA_GELU_SIMD
    std::int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dx + i, GeluLanes::grad(_mm256_loadu_ps(pre + i), _mm256_loadu_ps(dy + i)));
    if (i < n) {
        alignas(32) float x[8] = {}, d[8] = {}, out[8];
        for (std::int64_t k = i; k < n; ++k) x[k - i] = pre[k], d[k - i] = dy[k];
        _mm256_store_ps(out, GeluLanes::grad(_mm256_load_ps(x), _mm256_load_ps(d)));
        for (std::int64_t k = i; k < n; ++k) dx[k] = out[k - i];
    }
#else
    (void)pre, (void)dy, (void)dx, (void)n;
#endif
}
/// dy[i] = dy[i] · GELU'(pre[i]) in place (gelu_grad_apply_simd).
inline void gelu_grad_simd(const float* pre, float* dy, std::int64_t n) { gelu_grad_apply_simd(pre, dy, dy, n); }

/// One row of the attention's softmax in float, in place: the first `valid` scores become
/// e^(s − max) / Σ e^(s − max), the rest of the S entries 0 (the causal mask). The exponentials
/// through the eight lanes' exp (above: within 2 units in the last place for arguments ≤ 0),
/// summed in double in eight lanes and then in a fixed order, so a row's bits depend only on its
/// scores. A row's last valid % 8 scores go through the same lanes under a mask (masked loads and
/// stores, the padding's score −inf: e^(−inf) is 0), not through a buffer copied a value at a
/// time: that copy (a store-forwarding stall per row) and the scalar loops around it
/// (`step_profile --model vit --threads 1`: an attention block's forward 6.6-6.9 ms before,
/// 6.3-6.5 after).
/// Requires gelu_simd.
inline void softmax_row_simd(float* row, std::int64_t valid, std::int64_t S) {
#if STRATA_GELU_SIMD
    const std::int64_t full = valid - valid % 8;
    const int rem = int(valid - full);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 ninf = _mm256_set1_ps(-__builtin_huge_valf());
    // The tail's scores, −inf in the lanes past `valid` (none when rem is 0).
    const __m256 last = _mm256_blendv_ps(ninf, _mm256_maskload_ps(row + full, tail), _mm256_castsi256_ps(tail));
    __m256 mv = last;
    for (std::int64_t j = 0; j < full; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(row + j));
    // The maximum of the eight lanes, in every lane (max is exact: the order does not matter).
    mv = _mm256_max_ps(mv, _mm256_permute2f128_ps(mv, mv, 1));
    mv = _mm256_max_ps(mv, _mm256_shuffle_ps(mv, mv, _MM_SHUFFLE(1, 0, 3, 2)));
    mv = _mm256_max_ps(mv, _mm256_shuffle_ps(mv, mv, _MM_SHUFFLE(2, 3, 0, 1)));
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (std::int64_t j = 0; j < full; j += 8) {
        const __m256 e = GeluLanes::exp(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv), _mm256_setzero_ps());
        _mm256_storeu_ps(row + j, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    __m256 elast = _mm256_setzero_ps();
    if (rem) {
        elast = GeluLanes::exp(_mm256_sub_ps(last, mv), _mm256_setzero_ps());
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(elast)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(elast, 1)));
    }
    alignas(32) double part[4];
    _mm256_store_pd(part, _mm256_add_pd(s0, s1));
    const double sum = ((part[0] + part[1]) + part[2]) + part[3];
    const __m256 inv = _mm256_set1_ps(float(1.0 / sum));
    for (std::int64_t j = 0; j < full; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
    if (rem) _mm256_maskstore_ps(row + full, tail, _mm256_mul_ps(elast, inv));
    for (std::int64_t k = valid; k < S; ++k) row[k] = 0.0f;
#else
    (void)row, (void)valid, (void)S;
#endif
}

}  // namespace strata::nn::detail
