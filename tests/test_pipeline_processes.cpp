// Pipeline stages on separate processes (pipeline_mpi.hpp), run by `mpirun -np 2` and `-np 4`
// (tests/meson.build): rank q runs stage q % P of replica q / P. On the same global batches a
// pipeline across processes trains like OneDevice (float64 to 1e-12), both schedules, M = 1, 2,
// 4; with 4 processes also the hybrid (2 replicas × 2 stages). fit returns the same History on
// every rank, and a checkpoint saved across processes is OneDevice's (names and values).
#include <doctest/doctest.h>

#include "padded_sequences.hpp"
#include "test_util.hpp"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
#include <strata/distribute/pipeline_mpi.hpp>

using namespace strata::nn;
namespace sd = strata::distribute;
namespace coll = strata::distribute::collective;

namespace {

// dense, dropout, dense_1, dense_2: 4 layers, so 4 stages of one layer each (dropout's has no
// variables), or 2 balanced by parameters.
using Net = Sequential<Input<8>, Dense<12, Tanh>, Dropout<25>, Dense<6, ReLU>, Dense<3, Softmax>>;

strata::data::Dataset<> data(std::size_t n) {
    auto f64 = strata_test::lcg(n * 8, 23, 0, 1);
    std::vector<float> x(f64.begin(), f64.end());
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((x[i * 8] + x[i * 8 + 3] > 1.0f) + (x[i * 8 + 5] > 0.5f));
    return strata::data::Dataset<>::from_arrays(std::move(x), {8}, std::move(y));
}

const strata::optim::Optimizer adam = strata::optim::Adam{.learning_rate = 0.01};

struct Run {
    std::vector<double> weights;
    std::vector<double> loss, accuracy;
    strata::Evaluation eval;
};

template <class Strategy>
Run train(Strategy& s, std::size_t global) {
    strata::Model<Net, Strategy, double> model(s, 5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    auto h = model.fit(data(global * 4).batch(global), {.epochs = 2, .verbose = 0});
    return {model.get_weights(), h.history.at("loss"), h.history.at("accuracy"), model.evaluate(data(40).batch(16))};
}

int world() { return coll::mpi::world_size(); }

template <class Schedule, class Split>
void check_across(int replicas) {
    using S = sd::Pipeline<strata::place::Host, Schedule, Split>;
    for (std::size_t global : {12u, 10u}) {
        sd::OneDevice<> one;
        const Run ref = train(one, global);
        for (int m : {1, 2, 4}) {
            CAPTURE(global);
            CAPTURE(m);
            S pipeline({.micro_batches = m, .replicas = replicas, .timeout = std::chrono::seconds(20),
                        .processes = sd::pipeline_processes()});
            CHECK(pipeline.across_processes());
            const Run got = train(pipeline, global);
            CHECK(strata_test::max_relative_difference(got.weights, ref.weights) <= 1e-12);
            // The last stages' figures, on every rank.
            CHECK(strata_test::max_relative_difference(got.loss, ref.loss) <= 1e-12);
            CHECK(got.accuracy == ref.accuracy);
            CHECK(got.eval.loss == doctest::Approx(ref.eval.loss).epsilon(1e-12));
            CHECK(got.eval.accuracy == ref.eval.accuracy);
            CHECK(got.eval.examples == 40);
        }
    }
}

}  // namespace

TEST_CASE("a pipeline across processes equals OneDevice (GPipe and 1F1B, one stage per process)") {
    if (world() == 2) {
        check_across<sd::GPipe, sd::split::Balanced<2>>(1);
        check_across<sd::OneFOneB, sd::split::Balanced<2>>(1);
    } else if (world() == 4) {
        check_across<sd::GPipe, sd::split::Balanced<4>>(1);
        check_across<sd::OneFOneB, sd::split::Balanced<4>>(1);
    }
}

TEST_CASE("the hybrid across processes (2 replicas × 2 stages) equals OneDevice") {
    if (world() != 4) return;
    check_across<sd::GPipe, sd::split::Balanced<2>>(2);
    check_across<sd::OneFOneB, sd::split::Balanced<2>>(2);
}

namespace {
// The padded language model of padded_sequences.hpp on weighted sequences (micro-batches count
// different numbers of tokens): its later stages make the mask from the ids on their own ranks,
// and the loss is the mean over the global batch's tokens that count.
using strata_test::MaskedLm;
template <class Strategy>
Run train_masked(Strategy& s) {
    strata::Model<MaskedLm, Strategy, double> model(s, 5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    auto h = model.fit(strata_test::padded_sequences(46, true).batch(12), {.epochs = 2, .verbose = 0});
    return {model.get_weights(), h.history.at("loss"), h.history.at("accuracy"), model.evaluate(strata_test::padded_sequences(20, true).batch(8))};
}
}  // namespace

TEST_CASE("mask_zero with a per-token output across processes: the later stages make the mask from the ids; equals OneDevice") {
    using Two = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::At<3>>;
    if (world() != 2 && world() != 4) return;
    sd::OneDevice<> one;
    const Run ref = train_masked(one);
    Two pipeline({.micro_batches = 3, .replicas = world() / 2, .timeout = std::chrono::seconds(20),
                  .processes = sd::pipeline_processes()});
    const Run got = train_masked(pipeline);
    CHECK(strata_test::max_relative_difference(got.weights, ref.weights) <= 1e-12);
    CHECK(strata_test::max_relative_difference(got.loss, ref.loss) <= 1e-12);
    CHECK(strata_test::max_relative_difference(got.accuracy, ref.accuracy) <= 1e-12);
    CHECK(got.eval.loss == doctest::Approx(ref.eval.loss).epsilon(1e-12));
    CHECK(got.eval.accuracy == doctest::Approx(ref.eval.accuracy).epsilon(1e-12));
}

namespace {
// Batch normalization between two Dense layers: split in two stages, each with one normalization.
template <class Norm>
using NormNet = Sequential<Input<8>, Dense<12, Tanh>, Norm, Dense<6, ReLU>, Norm, Dense<3, Softmax>>;
using SyncNormNet = NormNet<SyncBatchNormalization<0.9>>;
using PlainNormNet = NormNet<BatchNormalization<BatchNormOptions{.momentum = 0.9}>>;

template <class N, class Strategy>
std::vector<double> train_norm(Strategy& s, std::size_t global) {
    strata::Model<N, Strategy, double> model(s, 7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9});
    model.fit(data(global * 3).batch(global), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}
}  // namespace

TEST_CASE("synchronized batch normalization in the hybrid across processes: each micro-batch over every replica's") {
    if (world() != 4) return;
    using G = sd::Pipeline<strata::place::Host, sd::GPipe, sd::split::At<2>>;
    using F = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::At<2>>;
    for (std::size_t global : {12u, 10u}) {
        CAPTURE(global);
        // One micro-batch a replica: the statistics are the whole global batch's, as one device's.
        sd::OneDevice<> one;
        const auto reference = train_norm<SyncNormNet>(one, global);
        G hybrid({.micro_batches = 1, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
        CHECK(strata_test::max_relative_difference(train_norm<SyncNormNet>(hybrid, global), reference) <= 1e-10);
        // The negative control: unsynchronized, each replica normalizes its own share.
        G plain({.micro_batches = 1, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
        CHECK(strata_test::max_relative_difference(train_norm<PlainNormNet>(plain, global), reference) > 1e-6);
    }
    // Two micro-batches a replica: micro-batch k over both replicas' k-th; GPipe and 1F1B meet the
    // same sums in the same order on every copy of a stage, so they give the same bits.
    G gpipe({.micro_batches = 2, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
    const auto a = train_norm<SyncNormNet>(gpipe, 12);
    F interleaved({.micro_batches = 2, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
    CHECK(train_norm<SyncNormNet>(interleaved, 12) == a);
    G plain({.micro_batches = 2, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
    CHECK(strata_test::max_relative_difference(train_norm<PlainNormNet>(plain, 12), a) > 1e-6);
    // A share too small for the micro-batches is refused on every rank, before any sum.
    G small({.micro_batches = 4, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
    const auto msg = strata_test::error_of([&] { train_norm<SyncNormNet>(small, 6); });
    CHECK(strata_test::has(msg, "a batch of 6 over 2 replicas gives 3"));
}

TEST_CASE("global_clipnorm across processes: the norm of the whole model's gradient, summed over the stages' ranks") {
    // Small enough to clip every step; each stage's process sums its part's squares with the
    // other stages of its replica before it applies.
    const strata::optim::Optimizer clipped = strata::optim::Adam{.learning_rate = 0.01, .global_clipnorm = 0.05};
    auto run = [&](auto& s) {
        strata::Model<Net, std::remove_reference_t<decltype(s)>, double> model(s, 5);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, clipped);
        model.fit(data(48).batch(12), {.epochs = 2, .verbose = 0});
        return model.get_weights();
    };
    sd::OneDevice<> one;
    const auto reference = run(one);
    {
        strata::Model<Net, sd::OneDevice<>, double> unclipped(one, 5);
        unclipped.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
        unclipped.fit(data(48).batch(12), {.epochs = 2, .verbose = 0});
        CHECK(strata_test::max_relative_difference(unclipped.get_weights(), reference) > 1e-3);  // it clips
    }
    using Two = sd::Pipeline<strata::place::Host, sd::GPipe, sd::split::Balanced<2>>;
    using Four = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::Balanced<4>>;
    if (world() == 2) {
        Two p({.micro_batches = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
        CHECK(strata_test::max_relative_difference(run(p), reference) <= 1e-12);
    } else if (world() == 4) {
        Four p({.micro_batches = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
        CHECK(strata_test::max_relative_difference(run(p), reference) <= 1e-12);
        Two hybrid({.micro_batches = 2, .replicas = 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
        CHECK(strata_test::max_relative_difference(run(hybrid), reference) <= 1e-12);
    }
}

TEST_CASE("a job of the wrong size is refused on every rank, naming the count expected") {
    using S = sd::Pipeline<strata::place::Host, sd::GPipe, sd::split::Balanced<3>>;
    const std::string e = strata_test::error_of([] { S p({.processes = sd::pipeline_processes()}); });
    CHECK(strata_test::has(e, "3 stages need 3 processes (mpirun -np 3"));
    CHECK(strata_test::has(e, "the job has " + std::to_string(world())));
    using H = sd::Pipeline<strata::place::Host, sd::GPipe, sd::split::Balanced<2>>;
    const std::string h = strata_test::error_of([] { H p({.replicas = 3, .processes = sd::pipeline_processes()}); });
    CHECK(strata_test::has(h, "3 replica(s) × 2 stages need 6 processes"));
    // Without processes, a pipeline under mpirun would train separate copies: refused.
    const std::string one = strata_test::error_of([] { H p(sd::PipelineOptions{}); });
    CHECK(strata_test::has(one, "pipeline_processes()"));
}

TEST_CASE("ranks that build another model or compile another optimizer are refused on every rank") {
    using S = sd::Pipeline<strata::place::Host, sd::GPipe, sd::split::Balanced<2>>;
    using Other = Sequential<Input<8>, Dense<12, Tanh>, Dropout<25>, Dense<7, ReLU>, Dense<3, Softmax>>;
    S pipeline({.replicas = world() / 2, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
    const bool odd = coll::mpi::world_rank() % 2 == 1;
    const std::string model = strata_test::error_of<strata::ValueError>([&] {
        if (odd) strata::Model<Other, S, double> m(pipeline, 5);
        else strata::Model<Net, S, double> m(pipeline, 5);
    });
    CHECK(strata_test::has(model, "the ranks disagree on the model"));
    strata::Model<Net, S, double> m(pipeline, 5);
    const std::string opt = strata_test::error_of<strata::ValueError>([&] {
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = odd ? 0.2 : 0.1});
    });
    CHECK(strata_test::has(opt, "the ranks disagree on compile's settings: optimizer: "));
}

TEST_CASE("a checkpoint saved across processes is OneDevice's: it loads there, and OneDevice's loads here") {
    using S = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::Balanced<2>>;
    const int replicas = world() / 2;
    const auto file = std::filesystem::temp_directory_path() / ("strata_test_pipeline_processes_np" + std::to_string(world()) + ".safetensors");
    S pipeline({.micro_batches = 2, .replicas = replicas, .timeout = std::chrono::seconds(20), .processes = sd::pipeline_processes()});
    strata::Model<Net, S, double> piped(pipeline, 5);
    piped.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    piped.fit(data(48).batch(12), {.epochs = 1, .verbose = 0});
    piped.save(file.string());  // every rank: the stages are gathered, rank 0 writes
    sd::OneDevice<> one;
    strata::Model<Net, sd::OneDevice<>, double> single(one, 5);  // the seed keys the dropout masks
    single.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    single.load(file.string());  // strict: every name and shape is OneDevice's
    CHECK(single.get_weights() == piped.get_weights());
    CHECK(single.gradient_path().iterations() == piped.gradient_path().iterations());
    // Both go on training from the same state; then OneDevice's state goes back the other way.
    single.fit(data(48).batch(12), {.epochs = 1, .verbose = 0});
    piped.fit(data(48).batch(12), {.epochs = 1, .verbose = 0});
    CHECK(strata_test::max_relative_difference(piped.get_weights(), single.get_weights()) <= 1e-12);
    pipeline.processes().barrier();
    if (coll::mpi::world_rank() == 0) single.save(file.string());
    pipeline.processes().barrier();
    piped.load(file.string());  // every rank reads it and keeps its stage's part
    CHECK(piped.get_weights() == single.get_weights());
    pipeline.processes().barrier();
    if (coll::mpi::world_rank() == 0) std::filesystem::remove(file);
}
