// The precision policies on place::Cuda against the host oracle (issue 44): the same model,
// seed and batches under MixedBFloat16 and MixedFloat16 give the host's weights within float
// rounding (the rounding to 16 bits is the same integer arithmetic on both places); TF32 runs
// the GEMMs on tensor cores, so it is compared with float32 by the bound TF32's 10 fraction bits
// allow. Compiled by nvcc wherever it is found; skipped (exit 77) where no GPU is.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <strata/strata.hpp>

#include "cuda_model_data.hpp"

using namespace strata::nn;
namespace dist = strata::distribute;
namespace prec = strata::precision;

namespace {
using Cnn = strata_test::CudaCnn;

template <class Prec, class S>
std::vector<float> trained(S& strategy, strata::optim::Optimizer opt, std::int64_t* skipped = nullptr) {
    strata::Model<Cnn, S, Prec> model(strategy, 5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(strata_test::cuda_model_data(64).batch(16), {.epochs = 2, .verbose = 0});
    if (skipped) *skipped = model.loss_scale().skipped_steps;
    return model.get_weights();
}

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::abs(double(b[i])));
    }
    return diff / scale;
}
}  // namespace

TEST_CASE("mixed policies on Cuda match the host's") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05, .momentum = 0.9};
    dist::OneDevice<strata::place::Cuda> gpu;
    dist::OneDevice<> host;
    const auto bf_gpu = trained<prec::MixedBFloat16>(gpu, opt), bf_host = trained<prec::MixedBFloat16>(host, opt);
    CHECK(max_relative(bf_gpu, bf_host) < 1e-4);
    std::int64_t skipped_gpu = -1, skipped_host = -2;
    strata::optim::SGD scaled{.learning_rate = 0.05, .momentum = 0.9};
    scaled.loss_scale.initial_scale = 0x1p30;  // some skipped steps first
    const auto f16_gpu = trained<prec::MixedFloat16>(gpu, scaled, &skipped_gpu);
    const auto f16_host = trained<prec::MixedFloat16>(host, scaled, &skipped_host);
    CHECK(skipped_gpu == skipped_host);
    CHECK(skipped_gpu > 0);
    CHECK(max_relative(f16_gpu, f16_host) < 1e-3);
}

TEST_CASE("TF32 on Cuda: tensor-core GEMMs, within TF32's rounding of float32") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05};
    dist::OneDevice<strata::place::Cuda> gpu;
    const auto tf32 = trained<prec::TF32>(gpu, opt), f32 = trained<prec::Float32>(gpu, opt);
    const double d = max_relative(tf32, f32);
    MESSAGE("TF32 against float32 on the GPU after 8 steps: ", d);
    CHECK(d < 1e-2);
    CHECK(d > 0);  // TF32 rounds the GEMMs' operands: a run that stayed on FP32 would give float32's weights exactly
}
