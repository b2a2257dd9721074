// strata's CUDA compiled part, libstrata_cuda: the element-type code of place::Cuda that does not
// depend on the user's network (Tensor's storage, gemm, the reductions and softmax, the
// activations, the initializers, the losses, the metric counts, the optimizer states and their
// copies), for float and double, with their kernels: compiled once by nvcc with the build's CUDA
// flags, so that a program's CUDA units compile only the kernels of its networks. Each header
// that has such code lists it once, at its end, in a block `#if STRATA_CUDA_INSTANCES`
// (strata/config.hpp): with STRATA_BUILDING_CUDA_PART, defined here, that block is the explicit
// instantiations; in a program's nvcc units that define STRATA_SEPARATE_COMPILATION_CUDA it is
// their `extern template` declarations. Built on libstrata: compile it with
// -DSTRATA_SEPARATE_COMPILATION, and link libstrata with it.
#if !defined(STRATA_SEPARATE_COMPILATION)
#error "src/strata_cuda.cu is strata's CUDA compiled part: compile it with -DSTRATA_SEPARATE_COMPILATION"
#endif
#define STRATA_BUILDING_CUDA_PART 1

#include "strata/distribute/gradient_path.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/metrics/metric.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/tensor/gemm.hpp"
#include "strata/tensor/ops.hpp"
#include "strata/tensor/reduce.hpp"
#include "strata/tensor/tensor.hpp"
