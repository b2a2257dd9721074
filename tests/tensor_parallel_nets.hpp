// The two-block transformer the tensor-parallel tests split (test_tensor_parallel.cpp on threads,
// test_tensor_parallel_processes.cpp across processes), and its data.
#pragma once

#include "test_util.hpp"

#include <cstdint>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/tensor_parallel.hpp>
#include <strata/distribute/tensor_parallel_attention.hpp>

namespace strata_test::tp {

using namespace strata::nn;
namespace dist = strata::distribute;

// The images' 72 values as 6 tokens of 12 features (the same labels).
inline strata::data::Dataset<> tokens(std::size_t n, std::uint64_t seed) {
    auto f = strata_test::lcg(n * 72, seed, 0, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((f[i * 72] + f[i * 72 + 7] > 1.0) + (f[i * 72 + 40] > 0.5));
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {6, 12}, std::move(y));
}

// A pre-norm transformer encoder of two blocks on [6, 12] examples: attention 4 heads (key size
// 3, value size 2), MLP 22 GELU (hidden features split unevenly over 3 and 4 shards).
template <class Attention, class Up, class Down>
using Transformer = Sequential<Input<6, 12>, Residual<LayerNormalization<>, Attention>, Residual<LayerNormalization<>, Up, Down>,
                               Residual<LayerNormalization<>, Attention>, Residual<LayerNormalization<>, Up, Down>,
                               LayerNormalization<>, GlobalAveragePooling1D, Dense<3, Softmax>>;
template <MultiHeadAttentionOptions O = MultiHeadAttentionOptions{}>
using Unsplit = Transformer<MultiHeadAttention<4, 3, 2, O>, TokenDense<22, GELU>, TokenDense<12>>;
template <int N, MultiHeadAttentionOptions O = MultiHeadAttentionOptions{}>
using Split = Transformer<dist::TensorParallelMultiHeadAttention<4, 3, 2, N, O>, dist::TensorParallelTokenDense<22, GELU, N, dist::Columns>,
                          dist::TensorParallelTokenDense<12, Linear, N, dist::Rows>>;

}  // namespace strata_test::tp
