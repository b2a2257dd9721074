// Compiled to PTX only, by tests/check_ptx_no_fma.py: the kernels that initialise weights must
// contain no fused multiply-add, or the GPU rounds them differently from the host and "the same
// initial weights on both places" (core/random.hpp) is false. No GPU needed.
#include <strata/core/random.hpp>

__global__ void uniform_float(float* out, float lo, float hi) {
    out[threadIdx.x] = strata::random::uniform_at<float>(1, 0, threadIdx.x, lo, hi);
}
__global__ void uniform_double(double* out, double lo, double hi) {
    out[threadIdx.x] = strata::random::uniform_at<double>(1, 0, threadIdx.x, lo, hi);
}
__global__ void normal_float(float* out, float mean, float stddev) {
    out[threadIdx.x] = strata::random::normal_at<float>(1, 0, threadIdx.x, mean, stddev);
}
__global__ void normal_double(double* out, double mean, double stddev) {
    out[threadIdx.x] = strata::random::normal_at<double>(1, 0, threadIdx.x, mean, stddev);
}
