#pragma once
// The small CNN and data set the CUDA model tests train on place::Cuda and on the host oracle
// (test_model_cuda.cu, test_multi_worker.cu).
#include <cstdint>
#include <vector>

#include <strata/strata.hpp>

namespace strata_test {

using CudaCnn = strata::nn::Sequential<strata::nn::Input<8, 8, 1>, strata::nn::Conv2D<4, 3, strata::nn::ReLU>,
                                       strata::nn::MaxPooling2D<2>, strata::nn::Flatten, strata::nn::Dense<8, strata::nn::Tanh>,
                                       strata::nn::Dense<3, strata::nn::Softmax>>;

/// n 8x8 images from an LCG, labelled by a rule of three pixels.
inline strata::data::Dataset<> cuda_model_data(std::size_t n) {
    std::vector<float> x(n * 64);
    std::vector<std::int32_t> y(n);
    std::uint64_t s = 12345;
    for (auto& v : x) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v = float(s >> 40) / float(1 << 24);
    }
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((x[i * 64] + x[i * 64 + 9] > 1.0f) + (x[i * 64 + 30] > 0.5f));
    return strata::data::Dataset<>::from_arrays(x, {8, 8, 1}, y);
}

}  // namespace strata_test
