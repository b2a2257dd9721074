// Tensor (intra-layer) parallelism (issue 21): a Dense layer split by columns or rows over 2 and
// 4 shards trains exactly like the unsplit layer, alone and inside a pipeline stage and the
// hybrid, and keeps Dense's variables (names, layout, initial values).
#include <doctest/doctest.h>

#include "test_images.hpp"
#include "test_util.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
#include <strata/distribute/tensor_parallel.hpp>

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
