#pragma once
/// \file strata/tensor/convert.hpp
/// Tensors of the 16-bit floats (core/half.hpp) beside float ones: conversion both ways,
/// rounding a float tensor to a 16-bit format in place (mixed precision emulated in float
/// storage), and counting the non-finite elements (what a loss scaler checks). Each is one
/// pass of the place's loops (place/algorithm.hpp): OpenMP on the host, Thrust on Cuda.

#include <cstdint>
#include <type_traits>

#include "strata/core/half.hpp"
#include "strata/tensor/ops.hpp"

namespace strata {

namespace detail {
template <class To>
struct ConvertTo {
    template <class From>
    STRATA_HD To operator()(From x) const {
        if constexpr (std::is_same_v<From, To>)
            return x;
        else
            return To(float(x));  // float to half rounds once; half to float is exact
    }
};
template <class C>
struct RoundTo {
    STRATA_HD float operator()(float x) const { return round_to<C>(x); }
};
// On the bits, so that it holds under -ffast-math as well, and in device code.
struct IsNonFinite {
    STRATA_HD std::int64_t operator()(float x) const { return (bits_of(x) & 0x7f800000u) == 0x7f800000u; }
    STRATA_HD std::int64_t operator()(double x) const {
        return (__builtin_bit_cast(std::uint64_t, x) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    }
    STRATA_HD std::int64_t operator()(bfloat16 x) const { return !is_finite(x); }
    STRATA_HD std::int64_t operator()(float16 x) const { return !is_finite(x); }
};
struct AddCounts {
    STRATA_HD std::int64_t operator()(std::int64_t a, std::int64_t b) const { return a + b; }
};
}  // namespace detail

/// `dst[i] = To(src[i])`: float to bfloat16 or float16 (round to nearest, ties to even; ±inf
/// past the range, NaN stays NaN), a 16-bit float to float (exact), or a copy when the types
/// are the same. `src` and `dst` live on the same place and have the same size (ShapeError
/// otherwise); they must not overlap.
///
/// \code
/// strata::Tensor<float> x({4, 3});
/// strata::Tensor<strata::bfloat16> h({4, 3});
/// strata::convert(x.view(), h.view());
/// \endcode
template <class From, class To, class P>
void convert(const TensorView<From, P>& src, const TensorView<To, P>& dst) {
    using F = std::remove_cv_t<From>;
    static_assert(std::is_same_v<F, To> || (std::is_same_v<F, float> && detail::is_half_v<To>) ||
                      (detail::is_half_v<F> && std::is_same_v<To, float>),
                  "strata::convert: converts float to strata::bfloat16 / strata::float16 or back (or copies one "
                  "type); convert through float for other pairs");
    detail::check_same_size("convert", src, dst);
    place::transform<P>(src.data(), src.size(), dst.data(), detail::ConvertTo<To>{});
}

/// Replaces every element of `x` by its value rounded to `C` (`bfloat16`, `float16`, or float:
/// no change), `x[i] = round_to<C>(x[i])`: the float tensor then holds exactly what a C tensor
/// would, which is how a mixed-precision policy emulates 16-bit activations in float storage.
///
/// \code
/// strata::Tensor<float> a({128, 64});
/// strata::round_to_inplace<strata::bfloat16>(a.view());
/// \endcode
template <class C, class P>
void round_to_inplace(const TensorView<float, P>& x) {
    static_assert(std::is_same_v<C, float> || detail::is_half_v<C>,
                  "strata::round_to_inplace<C>: C must be strata::bfloat16, strata::float16 or float");
    if constexpr (!std::is_same_v<C, float>) place::transform<P>(x.data(), x.size(), x.data(), detail::RoundTo<C>{});
}

/// The number of infinite or NaN elements of `x` (float, double, bfloat16 or float16): 0 means
/// every element is finite. One reduction (on Cuda, one Thrust transform_reduce; the host
/// waits for its result).
template <class T, class P>
std::int64_t count_nonfinite(const TensorView<T, P>& x) {
    using U = std::remove_cv_t<T>;
    static_assert(std::is_same_v<U, float> || std::is_same_v<U, double> || detail::is_half_v<U>,
                  "strata::count_nonfinite: T must be float, double, strata::bfloat16 or strata::float16");
    return place::transform_reduce<P>(x.data(), x.size(), detail::IsNonFinite{}, std::int64_t(0), detail::AddCounts{});
}

}  // namespace strata
