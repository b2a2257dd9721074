// src/strata_cuda.cu, libstrata_cuda's source, compiled by the host compiler (as if it were
// src/strata.cpp): it holds the CUDA place's kernels, which only nvcc compiles.
// expect: STRATA_BUILDING_CUDA_PART: src/strata_cuda.cu is compiled by nvcc with STRATA_SEPARATE_COMPILATION
#define STRATA_SEPARATE_COMPILATION 1
#include "../../src/strata_cuda.cu"
