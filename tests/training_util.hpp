#pragma once
// What the training and callbacks tests share: a small classification problem, the model that
// learns it, and a per-process temporary file name.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <strata/strata.hpp>

#include "test_util.hpp"

namespace strata_test {

/// A small classification problem: 4 features, 3 classes decided by the sign of two linear forms.
inline strata::data::Dataset<> blobs(std::size_t n, std::uint64_t seed) {
    auto f = lcg(n * 4, seed);
    std::vector<float> x(f.begin(), f.end());
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double a = f[i * 4] + 0.5 * f[i * 4 + 1], b = f[i * 4 + 2] - f[i * 4 + 3];
        y[i] = a > 0 ? (b > 0 ? 2 : 1) : 0;
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {4}, std::move(y));
}

/// The model that learns `blobs`.
using Small = strata::nn::Sequential<strata::nn::Input<4>, strata::nn::Dense<16, strata::nn::Tanh>,
                                     strata::nn::Dense<3, strata::nn::Softmax>>;

/// A path under the system temp dir, unique to this process.
inline std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("strata_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

}  // namespace strata_test
