// Training on one device: fit/evaluate/predict, build, reproducibility, save/load, errors,
// and the allocation-free training step (every operator new and aligned_alloc of this binary is
// counted).
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <new>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
#include <strata/distribute/pipeline.hpp>

#include "training_util.hpp"

#include "allocation_counter.hpp"  // every operator new and aligned_alloc of this program, counted
using strata_test::allocations;
using strata_test::lcg;

using namespace strata::nn;
namespace fs = std::filesystem;
using strata_test::blobs;
using strata_test::Small;
using strata_test::temp_path;

TEST_CASE("a small model trains to near-zero loss and predicts") {
    strata::Model<Small> model(7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.02});
    auto train = blobs(512, 1).shuffle(512, 3).batch(32);
    auto before = model.evaluate(blobs(512, 1).batch(128));
    auto h = model.fit(train, {.epochs = 40, .verbose = 0});
    auto after = model.evaluate(blobs(512, 1).batch(128));
    CHECK(h["loss"].size() == 40);
    CHECK(h["loss"].back() < h["loss"].front());
    CHECK(after.loss < 0.1 * before.loss);
    CHECK(after.accuracy > 0.97);
    // Held-out data from the same rule.
    CHECK(model.evaluate(blobs(256, 99).batch(64)).accuracy > 0.9);
    auto p = model.predict(blobs(10, 5).batch(4));
    CHECK(p.shape() == strata::Shape{10, 3});
    for (std::int64_t r = 0; r < 10; ++r) CHECK(p.at(r, 0) + p.at(r, 1) + p.at(r, 2) == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("Model::build: a bad batch size is an error; building first changes no result") {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    strata::Model<Cnn> built(5), plain(5);
    for (auto* m : {&built, &plain})
        m->compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 0.01});
    const auto msg = strata_test::error_of<strata::ValueError>([&] { built.build(-3); });
    CHECK(msg.find("build: the batch size must be positive, got -3") != std::string::npos);
    CHECK(!strata_test::error_of<strata::ValueError>([&] { built.build(0); }).empty());
    // Reserve for a larger batch than the steps use, in training and inference, then train and
    // evaluate both models: build only allocates, so every bit must agree.
    built.build(48);
    built.build(100, false);
    const auto xs = lcg(24 * 64, 17);
    std::vector<float> x(xs.begin(), xs.end());
    std::vector<std::int32_t> y(24);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
    const auto ds = strata::data::Dataset<>::from_arrays(x, {8, 8, 1}, y).batch(16);
    const auto hb = built.fit(ds, {.epochs = 3, .verbose = 0});
    const auto hp = plain.fit(ds, {.epochs = 3, .verbose = 0});
    CHECK(built.get_weights() == plain.get_weights());
    CHECK(hb["loss"] == hp["loss"]);
    CHECK(built.evaluate(ds).loss == plain.evaluate(ds).loss);
    CHECK(hb["loss"].back() != hb["loss"].front());  // it did train
}

TEST_CASE("linear regression with MSE and SGD learns y = 2x + 1") {
    using Lin = Sequential<Input<1>, Dense<1>>;
    strata::Model<Lin, strata::distribute::Default, double> model(1);
    model.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{.learning_rate = 0.1}, {});
    auto xs = lcg(256, 11);
    std::vector<float> x(xs.begin(), xs.end());
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = 2 * x[i] + 1;
    auto ds = strata::data::Dataset<float>::from_arrays(x, {1}, y).batch(32);
    model.fit(ds, {.epochs = 100, .verbose = 0});
    const auto w = model.get_weights();
    CHECK(w[0] == doctest::Approx(2.0).epsilon(1e-4));
    CHECK(w[1] == doctest::Approx(1.0).epsilon(1e-4));
    CHECK(model.evaluate(ds).loss < 1e-8);
}

TEST_CASE("same seed, same weights: training is bitwise reproducible") {
    auto train_once = [] {
        strata::Model<Small> model(123);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 0.01});
        model.fit(blobs(300, 2).shuffle(100, 9).batch(25), {.epochs = 3, .verbose = 0});
        return model.get_weights();
    };
    const auto a = train_once(), b = train_once();
    CHECK(a == b);
    strata::Model<Small> other(124);
    CHECK(other.get_weights() != strata::Model<Small>(123).get_weights());
}

TEST_CASE("save, load, continue gives the same weights as training straight through") {
    const auto path = temp_path("ckpt.safetensors");
    auto data = blobs(256, 4).batch(32);
    auto make = [] {
        auto m = std::make_unique<strata::Model<Small>>(5);
        m->compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
        return m;
    };
    auto straight = make();
    straight->fit(data, {.epochs = 4, .verbose = 0});

    auto first = make();
    first->fit(data, {.epochs = 2, .verbose = 0});
    first->save(path);
    auto resumed = make();
    resumed->load(path);
    CHECK(resumed->epoch() == 2);
    resumed->fit(data, {.epochs = 4, .verbose = 0, .initial_epoch = 2});
    CHECK(resumed->get_weights() == straight->get_weights());

    // The file is a plain safetensors file with the documented names.
    auto f = strata::io::SafetensorsFile::load(path);
    CHECK(f.contains("dense/kernel"));
    CHECK(f.contains("dense_1/bias"));
    CHECK(f.contains("optimizer/momentum/dense/kernel"));
    CHECK(f.metadata("format") == "strata-checkpoint");

    // Another model's checkpoint: the error names the tensor and both shapes.
    using Other = Sequential<Input<4>, Dense<8, Tanh>, Dense<3, Softmax>>;
    strata::Model<Other> other(1);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    CHECK_THROWS_WITH_AS(other.load(path), doctest::Contains("dense/kernel"), strata::CheckpointError);
    fs::remove(path);
}

TEST_CASE("bad input gets a clear error") {
    strata::Model<Small> model(1);
    auto data = blobs(8, 1).batch(4);
    CHECK_THROWS_WITH_AS(model.fit(data, {.verbose = 0}), doctest::Contains("compile"), strata::ValueError);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    std::vector<float> x(8, 0.5f);
    auto bad_label = strata::data::Dataset<>::from_arrays(x, {4}, std::vector<std::int32_t>{0, 7}).batch(2);
    CHECK_THROWS_WITH_AS(model.fit(bad_label, {.verbose = 0}), doctest::Contains("label 7"), strata::ValueError);
    auto bad_shape = strata::data::Dataset<>::from_arrays(std::vector<float>(10, 0.f), {5}, std::vector<std::int32_t>{0, 1}).batch(2);
    CHECK_THROWS_WITH_AS(model.fit(bad_shape, {.verbose = 0}), doctest::Contains("(None, 4)"), strata::ShapeError);
    CHECK_THROWS_AS(model.fit(blobs(8, 1), {.verbose = 0}), strata::ValueError);  // not batched
    CHECK_THROWS_AS(model.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{}, {"precision"}), strata::ValueError);
    CHECK_THROWS_AS(model.load(temp_path("does_not_exist.safetensors")), strata::IoError);
}

TEST_CASE("after the first step, a training step allocates no heap memory") {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    strata::Model<Cnn> model(2);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{});
    auto f = lcg(64 * 64, 3, 0, 1);
    std::vector<std::int32_t> y(64);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
    auto ds = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, y).batch(16);
    auto it = ds.iterate(0);
    model.train_step(*it);  // first step: buffers grow
    ++it;
    const long before = allocations.load();
    for (int i = 0; i < 3 && it != std::default_sentinel; ++i, ++it) model.train_step(*it);
    CHECK(allocations.load() - before == 0);
}

TEST_CASE("a Mirrored training step allocates no heap memory either (buckets and all)") {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    for (std::size_t bucket_bytes : {std::size_t(4) << 20, std::size_t(64)}) {
        CAPTURE(bucket_bytes);
        strata::distribute::Mirrored<> strategy(2, {.bucket_bytes = bucket_bytes});
        strata::Model<Cnn, strata::distribute::Mirrored<>> model(strategy, 2);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
        auto f = lcg(64 * 64, 3, 0, 1);
        std::vector<std::int32_t> y(64);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
        auto ds = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, y).batch(16);
        auto it = ds.iterate(0);
        model.train_step(*it);
        ++it;
        model.train_step(*it);  // the communication threads' queues have grown too
        ++it;
        const long before = allocations.load();
        for (int i = 0; i < 2 && it != std::default_sentinel; ++i, ++it) model.train_step(*it);
        CHECK(allocations.load() - before == 0);
    }
}

namespace {
// Allocations of the first train_step after Model::build: what build promises ("the first step
// does not pay for it"), under each lockstep strategy, with the first batch's data in hand.
template <class S>
long first_step_allocations(S& strategy, bool build = true) {
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    strata::Model<Cnn, S> model(strategy, 2);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    auto f = lcg(64 * 64, 3, 0, 1);
    std::vector<std::int32_t> y(64);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
    auto ds = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, y).batch(15);
    auto it = ds.iterate(0);
    const auto& batch = *it;
    if (build) model.build(15);
    const long before = allocations.load();
    model.train_step(batch);
    return allocations.load() - before;
}
}  // namespace

TEST_CASE("after Model::build, the first training step allocates nothing, under every in-process lockstep strategy") {
    namespace dist = strata::distribute;
    SUBCASE("OneDevice") {
        dist::OneDevice<> s(1);
        CHECK(first_step_allocations(s) == 0);
        dist::OneDevice<> control(1);
        CHECK(first_step_allocations(control, false) > 0);  // without build the step pays: the check can fail
    }
    SUBCASE("Mirrored x2 and x3 (a batch of 15 splits unevenly over 2)") {
        dist::Mirrored<> two(2), three(3);
        CHECK(first_step_allocations(two) == 0);
        CHECK(first_step_allocations(three) == 0);
    }
    SUBCASE("CentralStorage x2") {
        dist::CentralStorage<> s(2);
        CHECK(first_step_allocations(s) == 0);
    }
    SUBCASE("Pipeline, 2 stages, 3 micro-batches") {
        dist::Pipeline<strata::place::Host, dist::GPipe, dist::split::At<2>> s({.micro_batches = 3});
        CHECK(first_step_allocations(s) == 0);
    }
    SUBCASE("the hybrid: 2 replicas of a 2-stage pipeline, 2 micro-batches") {
        dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<2>> s({.micro_batches = 2, .replicas = 2});
        CHECK(first_step_allocations(s) == 0);
    }
}

TEST_CASE("ParameterServer: its steps allocate nothing within an epoch (a fit's allocations do not grow with its batches)") {
    // A parameter server's train_step runs the servers' epoch machinery for one update (its
    // worker pool's run, the clock's and the admission rule's state), which allocates per call;
    // within an epoch, step after step, nothing is allocated: a second fit over 16 batches
    // allocates what one over 4 does (the epoch's set-up, the History, the iterators).
    namespace dist = strata::distribute;
    using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<3, Softmax>>;
    auto fit_allocations = [](auto sync, int batches) {
        dist::ParameterServer<strata::place::Host, decltype(sync)> s(2, 1);
        strata::Model<Cnn, decltype(s)> model(s, 2);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
        auto f = lcg(std::size_t(15 * batches) * 64, 3, 0, 1);
        std::vector<std::int32_t> y(std::size_t(15 * batches));
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 3);
        auto ds = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8, 8, 1}, y).batch(15);
        model.fit(ds, {.epochs = 1, .verbose = 0});  // the first: buffers grow to the batch
        const long before = allocations.load();
        model.fit(ds, {.epochs = 1, .verbose = 0});
        return allocations.load() - before;
    };
    // (Synchronous: its updates do not depend on timing. Asynchronous runs allocate 1 or 2 more
    // in some runs of 16 batches than of 4: the staleness histogram grows to the largest
    // staleness the run happens to see, which timing decides.)
    CHECK(fit_allocations(strata::sync::Synchronous{}, 16) == fit_allocations(strata::sync::Synchronous{}, 4));
}

TEST_CASE("a float checkpoint loads into a double model") {
    const auto path = temp_path("f32.safetensors");
    strata::Model<Small> f32(8);
    f32.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    f32.fit(blobs(64, 2).batch(16), {.epochs = 1, .verbose = 0});
    f32.save(path);
    strata::Model<Small, strata::distribute::Default, double> f64(1);
    f64.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    f64.load(path);
    const auto a = f32.get_weights();
    const auto b = f64.get_weights();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(double(a[i]) == b[i]);
    fs::remove(path);
}
