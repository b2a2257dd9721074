#pragma once
// The places a test binary runs its templated cases on (the Kokkos "category" idea, as a
// doctest type list): Host everywhere, plus Cuda in the nvcc-compiled binary.
#include <strata/place/place.hpp>
#if STRATA_HAS_CUDA
#define STRATA_TEST_PLACES strata::place::Host, strata::place::Cuda
#else
#define STRATA_TEST_PLACES strata::place::Host
#endif
