// A causal language model whose per-token output keeps Embedding's token mask (id 0 pads), and
// its data, shared by the tests that check a masked output under each strategy across threads
// and processes (test_multi_worker.cpp, test_parameter_server.cpp, test_pipeline_processes.cpp).
#pragma once

#include "test_util.hpp"

#include <cstdint>
#include <vector>

#include <strata/strata.hpp>

namespace strata_test {

using MaskedLm = strata::nn::Sequential<
    strata::nn::Input<8>, strata::nn::Embedding<8, 8, strata::nn::EmbeddingOptions{.mask_zero = true}>, strata::nn::PositionEmbedding<>,
    strata::nn::Residual<strata::nn::LayerNormalization<>,
                         strata::nn::MultiHeadAttention<2, 4, 0, strata::nn::MultiHeadAttentionOptions{.causal = true}>>,
    strata::nn::TokenDense<8, strata::nn::Softmax>>;

// n sequences counting through 1..7 that alternate 1-2 and 7-8 real tokens (so that shards,
// mini-batches and micro-batches count different numbers of tokens), padded with 0 (target 0);
// each example weighed 0.25, 1 or 3 in turn when `weighted`.
inline strata::data::Dataset<> padded_sequences(std::size_t n, bool weighted) {
    const auto u = lcg(n * 2, 21, 0, 1);
    std::vector<float> x(n * 8, 0.0f), w;
    std::vector<std::int32_t> y(n * 8, 0);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t len = i % 2 == 0 ? 1 + std::size_t(u[i * 2] * 2) % 2 : 7 + std::size_t(u[i * 2] * 2) % 2;
        std::int32_t id = 1 + std::int32_t(u[i * 2 + 1] * 7) % 7;
        for (std::size_t t = 0; t < len; ++t) {
            x[i * 8 + t] = float(id);
            id = id % 7 + 1;
            y[i * 8 + t] = id;
        }
        w.push_back(i % 3 == 0 ? 0.25f : i % 3 == 1 ? 1.0f : 3.0f);
    }
    if (!weighted) return strata::data::Dataset<>::from_arrays(std::move(x), {8}, std::move(y), 8);
    return strata::data::Dataset<>::from_arrays(std::move(x), {8}, std::move(y), 8, std::move(w));
}

}  // namespace strata_test
