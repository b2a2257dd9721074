#pragma once
// The small image dataset the strategy tests train on: n examples of 6×6×2 features in [0, 1)
// from strata_test::lcg(seed), and 3 classes decided by three of the features, so that a model
// can learn something in a few steps. One definition for the tests that compare strategies on it.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <strata/data/dataset.hpp>

#include "test_util.hpp"

namespace strata_test {

inline strata::data::Dataset<> images(std::size_t n, std::uint64_t seed) {
    auto f = lcg(n * 72, seed, 0, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((f[i * 72] + f[i * 72 + 7] > 1.0) + (f[i * 72 + 40] > 0.5));
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {6, 6, 2}, std::move(y));
}

}  // namespace strata_test
