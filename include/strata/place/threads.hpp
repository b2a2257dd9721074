#pragma once
/// \file strata/place/threads.hpp
/// Host thread budget. One owner decides how many cores the host ops and the BLAS may use, so
/// replica threads and BLAS threads never oversubscribe the machine.

#include <thread>

#include "strata/config.hpp"
#if STRATA_HAS_OPENMP
#include <omp.h>
#endif

#if defined(STRATA_BLAS_OPENBLAS)
extern "C" void openblas_set_num_threads(int);
extern "C" int openblas_get_num_threads(void);
#endif

namespace strata {

/// Number of hardware threads of this machine (at least 1).
inline int hardware_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

/// Sets how many threads the host ops of the calling thread use (OpenMP's per-thread team size;
/// each replica thread has its own). `n <= 0` means all hardware threads.
///
/// strata parallelises its GEMMs itself (one single-threaded BLAS call per thread of the team),
/// so with OpenBLAS it keeps OpenBLAS's own pool at one thread: two thread pools on the same
/// cores spin against each other.
inline void set_num_threads(int n) {
    if (n <= 0) n = hardware_threads();
#if STRATA_HAS_OPENMP
    omp_set_num_threads(n);
#endif
#if defined(STRATA_BLAS_OPENBLAS)
    openblas_set_num_threads(1);
#endif
}

/// Threads the calling thread's host ops run with.
inline int num_threads() {
#if STRATA_HAS_OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

}  // namespace strata
