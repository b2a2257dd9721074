// Residual networks through Model: a small ResNet-like model (a stem convolution, an identity
// block, a projection block, global average pooling, a softmax classifier) learns a synthetic
// task, trains alike under OneDevice and Mirrored (with Dropout inside a block, whose masks key
// on global example positions), saves and loads its nested parameter names, and allocates
// nothing after its buffers have grown (Network::reserve reaches the blocks' inner buffers).
// The layers' own checks (finite differences, references, shapes, names, streams) are in
// test_layers.cpp; the compile-time errors in tests/compile_fail/residual_*.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "training_util.hpp"

#include "allocation_counter.hpp"  // every operator new and aligned_alloc of this program, counted
using strata_test::allocations;

using namespace strata::nn;
namespace dist = strata::distribute;
using strata_test::lcg;
using strata_test::max_relative_difference;
using strata_test::temp_path;

namespace {

using Same3x3 = Conv2D<4, 3, ReLU, 1, Padding::Same>;
using Linear4 = Conv2D<4, 3, Linear, 1, Padding::Same>;
using Down8 = Conv2D<8, 3, ReLU, 2, Padding::Same>;
using Linear8 = Conv2D<8, 3, Linear, 1, Padding::Same>;
using Net = Sequential<Input<8, 8, 2>, Same3x3, Residual<Same3x3, Linear4, ReLU>, Residual<Projection<8, 2>, Down8, Linear8, ReLU>,
                       GlobalAveragePooling2D, Dense<10, Softmax>>;
// The same with Dropout inside the identity block's branch.
using DropNet = Sequential<Input<8, 8, 2>, Same3x3, Residual<Same3x3, Dropout<20>, Linear4, ReLU>,
                           Residual<Projection<8, 2>, Down8, Linear8, ReLU>, GlobalAveragePooling2D, Dense<10, Softmax>>;

/// n images of 8×8×2 features in [0, 1); 3 classes (of the model's 10) by which quadrant of
/// channel 0 is brightest against channel 1's mean: learnable after pooling.
strata::data::Dataset<> quadrants(std::size_t n, std::uint64_t seed) {
    auto f = lcg(n * 128, seed, 0, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        double* img = f.data() + i * 128;
        const int label = int(i % 3);
        // Brighten channel 0 in the label's quadrant (0: top left, 1: top right, 2: bottom).
        for (int r = 0; r < 8; ++r)
            for (int c = 0; c < 8; ++c) {
                const bool in = label == 0 ? (r < 4 && c < 4) : label == 1 ? (r < 4 && c >= 4) : r >= 4;
                if (in) img[(r * 8 + c) * 2] += 0.6;
            }
        y[i] = label;
    }
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 2}, std::move(y));
}

template <class Seq, class Strategy, class T>
std::vector<T> train_with(Strategy& s, strata::optim::Optimizer opt, std::size_t global_batch) {
    strata::Model<Seq, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(quadrants(global_batch * 4, 5).batch(global_batch), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

}  // namespace

TEST_CASE("a small residual network learns, and its summary shows the blocks") {
    const std::string summary = Net::summary();
    INFO(summary);
    CHECK(strata_test::has(summary, "residual (Residual)"));
    CHECK(strata_test::has(summary, "residual_1 (Residual)"));
    strata::Model<Net> model(7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    auto data = quadrants(384, 1).shuffle(384, 2).batch(32);
    const auto before = model.evaluate(quadrants(384, 1).batch(128));
    const auto h = model.fit(data, {.epochs = 8, .verbose = 0});
    const auto after = model.evaluate(quadrants(384, 1).batch(128));
    INFO("loss per epoch: " << h["loss"].front() << " ... " << h["loss"].back());
    CHECK(h["loss"].back() < 0.5 * h["loss"].front());
    CHECK(after.loss < 0.5 * before.loss);
    CHECK(after.accuracy > 0.9);
    CHECK(model.evaluate(quadrants(192, 99).batch(64)).accuracy > 0.85);  // held out
}

TEST_CASE("a residual network trains alike under OneDevice and Mirrored (Dropout inside a block too)") {
    const strata::optim::Optimizer momentum = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    const strata::optim::Optimizer adam = strata::optim::Adam{.learning_rate = 0.01};
    const strata::optim::Optimizer sgd = strata::optim::SGD{.learning_rate = 0.1};
    for (std::size_t global : {12u, 9u}) {  // 9 does not divide by 2
        CAPTURE(global);
        {
            dist::OneDevice<> one;
            dist::Mirrored<> mirrored(2);
            const auto reference = train_with<Net, dist::OneDevice<>, double>(one, momentum, global);
            CHECK(max_relative_difference(train_with<Net, dist::Mirrored<>, double>(mirrored, momentum, global), reference) <= 1e-12);
        }
        {
            dist::OneDevice<> one;
            dist::Mirrored<> mirrored(2, {.bucket_bytes = 64});  // several all-reduces per step
            const auto reference = train_with<DropNet, dist::OneDevice<>, double>(one, adam, global);
            CHECK(max_relative_difference(train_with<DropNet, dist::Mirrored<>, double>(mirrored, adam, global), reference) <= 1e-12);
        }
        dist::OneDevice<> one;
        dist::Mirrored<> mirrored(2);
        const auto reference = train_with<Net, dist::OneDevice<>, float>(one, sgd, global);
        CHECK(max_relative_difference(train_with<Net, dist::Mirrored<>, float>(mirrored, sgd, global), reference) <= 1e-5);
    }
}

TEST_CASE("a residual network saves and loads under its nested parameter names") {
    const auto path = temp_path("residual.safetensors");
    strata::Model<Net> a(3);
    a.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    a.fit(quadrants(64, 4).batch(16), {.epochs = 1, .verbose = 0});
    a.save(path);
    auto f = strata::io::SafetensorsFile::load(path);
    CHECK(f.contains("residual/conv2d/kernel"));
    CHECK(f.contains("residual/conv2d_1/bias"));
    CHECK(f.contains("residual_1/projection/kernel"));
    CHECK(f.contains("residual_1/conv2d_1/kernel"));
    strata::Model<Net> b(4);
    b.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    CHECK(b.get_weights() != a.get_weights());
    b.load(path);
    CHECK(b.get_weights() == a.get_weights());
    std::filesystem::remove(path);
}

TEST_CASE("residual blocks allocate nothing in steady state, and Network::reserve sizes their buffers") {
    SUBCASE("a Model's training step, after the first") {
        strata::Model<DropNet> model(2);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{});
        auto ds = quadrants(64, 3).batch(16);
        auto it = ds.iterate(0);
        model.train_step(*it);  // first step: buffers grow
        ++it;
        const long before = allocations.load();
        for (int i = 0; i < 3 && it != std::default_sentinel; ++i, ++it) model.train_step(*it);
        CHECK(allocations.load() - before == 0);
    }
    SUBCASE("a Network after reserve, on its first pass") {
        Network<DropNet, float, strata::place::Host> net;
        std::vector<float> params(std::size_t(DropNet::num_params)), grads(params.size());
        net.init(params.data(), 1);
        strata::Tensor<float> x(strata::Shape{16, 8, 8, 2});
        strata::fill(x.view(), 0.5f);
        net.reserve(16, true);
        const strata::nn::Mode training{.training = true, .step = 1, .seed = 2};
        const long before = allocations.load();
        net.forward(params.data(), x.view(), training);
        strata::fill(net.output_grad(), 0.1f);
        net.backward(params.data(), grads.data(), training);
        // A smaller batch reuses the same buffers.
        net.forward(params.data(), x.view().slice(0, 9), training);
        net.backward(params.data(), grads.data(), training);
        CHECK(allocations.load() - before == 0);
    }
}
