#pragma once
/// \file strata/tensor/tensor_all.hpp
/// The whole tensor core: tensors, element-wise ops, reductions, GEMM, 16-bit conversions.
#include "strata/tensor/convert.hpp"
#include "strata/tensor/gemm.hpp"
#include "strata/tensor/ops.hpp"
#include "strata/tensor/reduce.hpp"
#include "strata/tensor/tensor.hpp"
#include "strata/place/threads.hpp"
