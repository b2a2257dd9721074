#pragma once
/// \file strata/nn/initializers.hpp
/// Keras's default initializers: Glorot (Xavier) uniform kernels and zero biases.
/// Glorot & Bengio, "Understanding the difficulty of training deep feedforward neural
/// networks", AISTATS 2010: U(-l, l) with l = sqrt(6 / (fan_in + fan_out)).

#include <cmath>
#include <cstdint>

#include "strata/tensor/tensor_all.hpp"

namespace strata::nn {

/// Fills `n` elements at `w` (on place P) from U(-l, l), l = sqrt(6 / (fan_in + fan_out)),
/// reproducibly from (seed, stream).
template <class T, class P>
void glorot_uniform(T* w, std::int64_t n, std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed, std::uint64_t stream) {
    const T limit = T(std::sqrt(6.0 / double(fan_in + fan_out)));
    random_uniform(TensorView<T, P>(w, Shape{n}), -limit, limit, seed, stream);
}

/// Sets `n` elements at `b` to zero.
template <class T, class P>
void zeros(T* b, std::int64_t n) {
    fill(TensorView<T, P>(b, Shape{n}), T(0));
}

#if STRATA_INSTANCES
// The host's initializers, compiled once in the compiled part.
STRATA_TEMPLATE void glorot_uniform<float, place::Host>(float*, std::int64_t, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t);
STRATA_TEMPLATE void glorot_uniform<double, place::Host>(double*, std::int64_t, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t);
STRATA_TEMPLATE void zeros<float, place::Host>(float*, std::int64_t);
STRATA_TEMPLATE void zeros<double, place::Host>(double*, std::int64_t);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE void glorot_uniform<float, place::Cuda>(float*, std::int64_t, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t);
STRATA_CUDA_TEMPLATE void glorot_uniform<double, place::Cuda>(double*, std::int64_t, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t);
STRATA_CUDA_TEMPLATE void zeros<float, place::Cuda>(float*, std::int64_t);
STRATA_CUDA_TEMPLATE void zeros<double, place::Cuda>(double*, std::int64_t);
#endif

}  // namespace strata::nn
