#pragma once
/// \file strata/tensor/impl/gemm.ipp
/// The definitions behind strata/tensor/gemm.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/tensor/gemm.hpp"

namespace strata::detail {

STRATA_DECL bool blas_init_once() {
    static const bool done = [] {
#if defined(STRATA_BLAS_OPENBLAS)
        openblas_set_num_threads(1);
        const char* core = openblas_get_corename();
        const std::string name = core ? core : "";
        const bool old = name == "Prescott" || name == "Core2" || name == "Nehalem" || name == "Penryn" || name == "Dunnington" ||
                         name == "Atom" || name == "Sandybridge";
#if defined(__x86_64__) && defined(__GNUC__)
        const char* better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : nullptr;
        if (old && better && !std::getenv("STRATA_QUIET_BLAS"))
            std::fprintf(stderr,
                         "strata: OpenBLAS chose its '%s' kernels on a CPU that has %s; GEMMs run several times slower. "
                         "Set OPENBLAS_CORETYPE=%s before starting the program (scripts/blas-env in strata's source tree "
                         "prints it).\n",
                         name.c_str(), std::string(better) == "SkylakeX" ? "AVX-512" : "AVX2", better);
#endif
#endif
        return true;
    }();
    return done;
}

}  // namespace strata::detail
