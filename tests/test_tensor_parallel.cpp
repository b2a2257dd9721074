// Tensor (intra-layer) parallelism (issue 21): a Dense layer split by columns or rows over 2 and
// 4 shards trains exactly like the unsplit layer, alone and inside a pipeline stage and the
// hybrid, and keeps Dense's variables (names, layout, initial values). And a transformer split
// as Megatron splits it (issue 43): attention by heads, the MLP column-then-row, over 2, 3 and 4
// shards, alone, under Mirrored, and in the stages of a pipeline with and without replicas.
#include <doctest/doctest.h>

#include "tensor_parallel_nets.hpp"
#include "test_images.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
#include <strata/distribute/tensor_parallel.hpp>
#include <strata/distribute/tensor_parallel_attention.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;
namespace pd = strata::place;

using strata_test::lcg;
using strata_test::max_relative_difference;

namespace {

template <class Big>
using NetWith = Sequential<Input<6, 6, 2>, Flatten, Big, Dense<3, Softmax>>;
using Plain = NetWith<Dense<22, ReLU>>;  // 22 units: 4 column shards of 6, 6, 5, 5

using strata_test::images;

template <class Net, class Strategy = dist::Default>
std::vector<double> train(Strategy& s) {
    strata::Model<Net, Strategy, double> model(s, 7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9});
    model.fit(images(40, 3).batch(10), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

template <class Split>
void check_split() {
    using Net = NetWith<Split>;
    static_assert(Net::num_params == Plain::num_params);
    const auto a = Net::parameters(), b = Plain::parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i].name == b[i].name);
        CHECK(a[i].shape == b[i].shape);
        CHECK(a[i].offset == b[i].offset);
    }
    dist::Default d1, d2;
    const auto reference = train<Plain>(d1);
    CHECK(max_relative_difference(train<Net>(d2), reference) <= 1e-12);
}

}  // namespace

TEST_CASE("TensorParallelDense by columns (all-gather) equals Dense: 2 and 4 shards (float64)") {
    check_split<dist::TensorParallelDense<22, ReLU, 2, dist::Columns>>();
    check_split<dist::TensorParallelDense<22, ReLU, 4, dist::Columns>>();
}

TEST_CASE("TensorParallelDense by rows (reduce) equals Dense: 2 and 4 shards (float64)") {
    check_split<dist::TensorParallelDense<22, ReLU, 2, dist::Rows>>();
    check_split<dist::TensorParallelDense<22, ReLU, 4, dist::Rows>>();
}

TEST_CASE("a split Dense inside a pipeline stage and the hybrid equals OneDevice") {
    using Net = NetWith<dist::TensorParallelDense<22, ReLU, 2, dist::Columns>>;
    using Pipe = dist::Pipeline<pd::Host, dist::OneFOneB, dist::split::At<2>>;  // flatten, dense | dense_1
    dist::Default d;
    const auto reference = train<Plain>(d);
    for (int r : {1, 2}) {
        CAPTURE(r);
        Pipe p({.micro_batches = 3, .replicas = r});
        CHECK(max_relative_difference(train<Net>(p), reference) <= 1e-12);
    }
}

TEST_CASE("shards inside configured logical devices (one scope per shard thread) still equal Dense") {
    pd::reset_devices();
    pd::set_logical_device_configuration(pd::list_physical_devices(pd::DeviceKind::Cpu).front(), {{}, {}}, pd::Oversubscribe::Yes);
    {
        using Net = NetWith<dist::TensorParallelDense<22, ReLU, 2, dist::Rows>>;
        strata::Model<Net, dist::Default, double> model(1);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
        model.predict(std::vector<float>(72 * 3, 0.5f));
        dist::Default d;
        const auto reference = train<Plain>(d);
        dist::Default d2;
        CHECK(max_relative_difference(train<Net>(d2), reference) <= 1e-12);
    }
    pd::reset_devices();
}

namespace {

using strata_test::tp::tokens;
using strata_test::tp::Transformer;
using strata_test::tp::Unsplit;
using strata_test::tp::Split;

template <class Net, class Strategy = dist::Default>
std::vector<double> train_tokens(Strategy& s) {
    strata::Model<Net, Strategy, double> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    model.fit(tokens(40, 3).batch(10), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

template <class A, class B>
void same_variables() {
    static_assert(A::num_params == B::num_params);
    const auto a = A::parameters(), b = B::parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        CAPTURE(a[i].name);
        CHECK(a[i].name == b[i].name);
        CHECK(a[i].shape == b[i].shape);
        CHECK(a[i].offset == b[i].offset);
    }
}

template <class Net, class Reference>
void trains_as_unsplit() {
    same_variables<Net, Reference>();
    dist::Default d1, d2;
    const auto reference = train_tokens<Reference>(d1);
    const double diff = max_relative_difference(train_tokens<Net>(d2), reference);
    INFO("largest relative weight difference " << diff);
    CHECK(diff <= 1e-12);
}

}  // namespace

TEST_CASE("Megatron's MLP (TensorParallelTokenDense by columns, then by rows) and attention split by heads equal the unsplit "
          "transformer: 2, 3 and 4 shards (float64)") {
    // The heads split 2+2, 2+1+1 and 1+1+1+1; the 22 hidden features 11+11, 8+7+7, 6+6+5+5.
    static_assert(dist::detail::shard_part(4, 3, 0).count == 2 && dist::detail::shard_part(4, 3, 2).first == 3);
    static_assert(dist::detail::shard_part(22, 4, 3).first == 17 && dist::detail::shard_part(22, 4, 3).count == 5);
    trains_as_unsplit<Split<2>, Unsplit<>>();
    trains_as_unsplit<Split<3>, Unsplit<>>();
    trains_as_unsplit<Split<4>, Unsplit<>>();
    // The MLP alone split, the attention not: the pair is a drop-in for two TokenDense layers.
    trains_as_unsplit<Transformer<MultiHeadAttention<4, 3, 2>, dist::TensorParallelTokenDense<22, GELU, 4, dist::Columns>,
                                  dist::TensorParallelTokenDense<12, Linear, 4, dist::Rows>>,
                      Unsplit<>>();
}

TEST_CASE("TensorParallelMultiHeadAttention with the causal mask and no biases, and with attention dropout, equals "
          "MultiHeadAttention (float64)") {
    constexpr MultiHeadAttentionOptions causal{.use_bias = false, .causal = true};
    trains_as_unsplit<Split<2, causal>, Unsplit<causal>>();
    // Dropout: each shard draws the unsplit layer's mask for its heads (2+1+1: offsets 0, 2, 3).
    constexpr MultiHeadAttentionOptions dropout{.dropout = 0.25};
    trains_as_unsplit<Split<3, dropout>, Unsplit<dropout>>();
    // The negative control: without dropout the same model ends elsewhere.
    dist::Default d1, d2;
    CHECK(max_relative_difference(train_tokens<Split<3, dropout>>(d1), train_tokens<Unsplit<>>(d2)) > 1e-4);
}

TEST_CASE("tensor x data x pipeline: the split transformer under Mirrored(2), and over the 2 stages of a pipeline with 1 and 2 "
          "replicas, trains as the unsplit one on one device (float64, with attention dropout)") {
    constexpr MultiHeadAttentionOptions dropout{.dropout = 0.25};
    using Net = Split<2, dropout>;
    dist::Default d;
    const auto reference = train_tokens<Unsplit<dropout>>(d);
    dist::Mirrored<> mirrored(2);
    double diff = max_relative_difference(train_tokens<Net>(mirrored), reference);
    INFO("Mirrored(2): " << diff);
    CHECK(diff <= 1e-12);
    // Stage 0: the first encoder block (attention, MLP); stage 1: the second and the head.
    using Pipe = dist::Pipeline<pd::Host, dist::OneFOneB, dist::split::At<2>>;
    for (int r : {1, 2}) {
        CAPTURE(r);
        Pipe p({.micro_batches = 2, .replicas = r});
        diff = max_relative_difference(train_tokens<Net>(p), reference);
        INFO("Pipeline x " << r << ": " << diff);
        CHECK(diff <= 1e-12);
    }
}

TEST_CASE("TensorParallelMultiHeadAttention: its shards run on their own threads (logical devices when configured), heads split "
          "evenly, the first shards one more") {
    using L = dist::TensorParallelMultiHeadAttention<5, 2, 0, 3>::bind<strata::StaticShape<4, 6>, double, pd::Host>;
    CHECK(L::heads_of(0).first == 0);
    CHECK(L::heads_of(0).count == 2);
    CHECK(L::heads_of(1).first == 2);
    CHECK(L::heads_of(1).count == 2);
    CHECK(L::heads_of(2).first == 4);
    CHECK(L::heads_of(2).count == 1);
    pd::reset_devices();
    pd::set_logical_device_configuration(pd::list_physical_devices(pd::DeviceKind::Cpu).front(), {{}, {}}, pd::Oversubscribe::Yes);
    {
        using Net = Split<2>;
        strata::Model<Net, dist::Default, double> model(1);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
        model.predict(std::vector<float>(72 * 2, 0.5f));
        dist::Default d1, d2;
        CHECK(max_relative_difference(train_tokens<Net>(d1), train_tokens<Unsplit<>>(d2)) <= 1e-12);
    }
    pd::reset_devices();
}

TEST_CASE("TensorParallelMultiHeadAttention's errors: a backward on another batch, or in another mode than its forward, is a ValueError "
          "naming the layer and what it found") {
    using L = dist::TensorParallelMultiHeadAttention<4, 3, 2, 2, MultiHeadAttentionOptions{.dropout = 0.25}>::bind<strata::StaticShape<6, 12>,
                                                                                                                  double, pd::Host>;
    L layer;
    std::vector<double> params(std::size_t(L::num_params)), grads(params.size());
    layer.init(params.data(), 3, 0);
    const auto xv = strata_test::lcg(3 * 72, 9, -1, 1);
    std::vector<double> x(xv.begin(), xv.end()), y(x.size()), dy(x.size(), 1.0), dx(x.size());
    auto view = [](std::vector<double>& v, std::int64_t n) { return strata::TensorView<double, pd::Host>(v.data(), strata::Shape{n, 6, 12}); };
    strata::nn::Mode train;
    train.training = true;
    layer.forward(params.data(), view(x, 2), view(y, 2), train);
    // Another batch size than the forward's: the message names both.
    CHECK_THROWS_WITH_AS(layer.backward(params.data(), grads.data(), view(x, 3), view(y, 3), view(dy, 3), view(dx, 3), train),
                         doctest::Contains("TensorParallelMultiHeadAttention: backward on 3 examples"), strata::ValueError);
    // Inference after a forward in training: the dropout mask would not be the forward's.
    strata::nn::Mode infer;
    CHECK_THROWS_WITH_AS(layer.backward(params.data(), grads.data(), view(x, 2), view(y, 2), view(dy, 2), view(dx, 2), infer),
                         doctest::Contains("backward in inference mode after a forward in training mode"), strata::ValueError);
    // The negative control: the matching backward runs, and gives a gradient.
    layer.backward(params.data(), grads.data(), view(x, 2), view(y, 2), view(dy, 2), view(dx, 2), train);
    CHECK(std::any_of(grads.begin(), grads.end(), [](double g) { return g != 0; }));
}
