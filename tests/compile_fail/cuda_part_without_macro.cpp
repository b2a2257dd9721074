// src/strata_cuda.cu compiled without STRATA_SEPARATE_COMPILATION: libstrata_cuda is built on
// libstrata and must be compiled in its mode.
// expect: src/strata_cuda.cu is strata's CUDA compiled part: compile it with -DSTRATA_SEPARATE_COMPILATION
#include "../../src/strata_cuda.cu"
