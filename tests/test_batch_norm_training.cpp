// Batch normalization in training (issue 45): through Model and every strategy. Synchronized,
// N replicas of Mirrored (with and without gradient buckets in flight) and CentralStorage equal
// one device on the same global batches, moving statistics included (float64); unsynchronized
// they do not (the negative control); the moving statistics follow Keras' formula; they are
// saved, loaded and counted; a pipeline normalizes each micro-batch by its own statistics, and
// the hybrid's replicas, synchronized, each micro-batch over all of them.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "test_images.hpp"
#include "test_util.hpp"
#include "training_util.hpp"

#include <strata/distribute/pipeline.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;
using strata_test::images;
using strata_test::max_relative_difference;

namespace {

template <class Norm>
using Net = Sequential<Input<6, 6, 2>, Conv2D<4, 3, Linear, 1, Padding::Same, false>, Norm, ActivationLayer<ReLU>, MaxPooling2D<2>,
                       Flatten, Dense<5, Tanh>, Norm, Dense<3, Softmax>>;
using SyncNet = Net<SyncBatchNormalization<0.9>>;
using PlainNet = Net<BatchNormalization<BatchNormOptions{.momentum = 0.9}>>;

template <class N, class Strategy>
std::vector<double> train_with(Strategy& s, int steps, std::size_t global_batch, strata::optim::Optimizer opt) {
    strata::Model<N, Strategy, double> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(images(global_batch * std::size_t(steps), 5).batch(global_batch), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

// The largest difference among the moving statistics (the variables that are not trained).
double moving_difference(const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (const auto& p : SyncNet::parameters())
        if (!p.trainable)
            for (std::int64_t i = p.offset; i < p.offset + p.shape.size(); ++i)
                m = std::max(m, std::abs(a[std::size_t(i)] - b[std::size_t(i)]));
    return m;
}

}  // namespace

TEST_CASE("SyncBatchNormalization: Mirrored and CentralStorage equal OneDevice on the same global batches (float64)") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    for (std::size_t global : {12u, 10u}) {  // 10 does not divide by 3 or 4
        dist::OneDevice<> one;
        const auto reference = train_with<SyncNet>(one, 3, global, opt);
        for (int n = 2; n <= 4; ++n) {
            CAPTURE(n);
            CAPTURE(global);
            dist::Mirrored<> mirrored(n);
            CHECK(max_relative_difference(train_with<SyncNet>(mirrored, 3, global, opt), reference) <= 1e-10);
            // Small buckets: all-reduces in flight on the communication thread while backward syncs.
            dist::Mirrored<> bucketed(n, {.bucket_bytes = 64});
            CHECK(max_relative_difference(train_with<SyncNet>(bucketed, 3, global, opt), reference) <= 1e-10);
            dist::CentralStorage<> central(n);
            CHECK(max_relative_difference(train_with<SyncNet>(central, 3, global, opt), reference) <= 1e-10);
        }
    }
}

TEST_CASE("SyncBatchNormalization: a global batch smaller than the replicas (empty shares join the sums)") {
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.01};
    dist::OneDevice<> one;
    const auto reference = train_with<SyncNet>(one, 3, 3, opt);
    dist::Mirrored<> mirrored(4);  // one replica has no example in every step
    CHECK(max_relative_difference(train_with<SyncNet>(mirrored, 3, 3, opt), reference) <= 1e-10);
    dist::Mirrored<> bucketed(4, {.bucket_bytes = 64});
    CHECK(max_relative_difference(train_with<SyncNet>(bucketed, 3, 3, opt), reference) <= 1e-10);
}

TEST_CASE("BatchNormalization without synchronization: replicas differ from one device (negative control)") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.1};
    dist::OneDevice<> one;
    const auto reference = train_with<PlainNet>(one, 3, 10, opt);
    dist::Mirrored<> mirrored(2);
    const auto got = train_with<PlainNet>(mirrored, 3, 10, opt);
    CHECK(max_relative_difference(got, reference) > 1e-4);
    CHECK(moving_difference(got, reference) > 1e-6);
    // ... and one replica is one device
    dist::Mirrored<> single(1);
    CHECK(max_relative_difference(train_with<PlainNet>(single, 3, 10, opt), reference) <= 1e-12);
}

TEST_CASE("BatchNormalization in Model: moving statistics follow Keras' formula and are not trained") {
    using N = Sequential<Input<3>, BatchNormalization<BatchNormOptions{.momentum = 0.8}>, Dense<2, Softmax>>;
    dist::OneDevice<> one;
    strata::Model<N, dist::OneDevice<>, double> model(one, 3);
    // A large learning rate and weight decay would move the statistics if they were trained.
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 5.0, .momentum = 0.9});
    std::vector<float> x = {1, 2, 3, 3, 2, 1, 0, 0, 6, 4, 4, 2};
    std::vector<std::int32_t> y = {0, 1, 0, 1};
    const auto ds = strata::data::Dataset<>::from_arrays(x, {3}, y);
    model.fit(ds.batch(4), {.epochs = 1, .verbose = 0});  // one step on all four
    const auto w = model.get_weights();
    // Keras' order: gamma, beta, moving_mean, moving_variance; moving = 0.8 moving + 0.2 batch (biased variance)
    for (int c = 0; c < 3; ++c) {
        double mean = 0, var = 0;
        for (int i = 0; i < 4; ++i) mean += x[std::size_t(i * 3 + c)] / 4.0;
        for (int i = 0; i < 4; ++i) var += (x[std::size_t(i * 3 + c)] - mean) * (x[std::size_t(i * 3 + c)] - mean) / 4.0;
        CHECK(w[std::size_t(6 + c)] == doctest::Approx(0.2 * mean).epsilon(1e-12));
        CHECK(w[std::size_t(9 + c)] == doctest::Approx(0.8 + 0.2 * var).epsilon(1e-12));
    }
    const auto names = N::parameters();
    CHECK(names[2].name == "batch_normalization/moving_mean");
    CHECK(names[3].name == "batch_normalization/moving_variance");
    // evaluate uses the moving statistics: a second model with the same weights, evaluated on
    // a batch of one, gives the same predictions as on the whole batch (batch statistics would not)
    const auto all = model.predict(ds.batch(4));
    const auto single = model.predict(ds.batch(1));
    CHECK(max_relative_difference(strata::to_vector(all.view()), strata::to_vector(single.view())) <= 1e-12);
}

TEST_CASE("BatchNormalization: save and load carry the moving statistics; a checkpoint without them is refused naming the tensor") {
    dist::OneDevice<> one;
    strata::Model<PlainNet, dist::OneDevice<>, double> model(one, 4);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    model.fit(images(40, 6).batch(10), {.epochs = 1, .verbose = 0});
    const std::string path = strata_test::temp_path("bn.safetensors");
    model.save(path);
    strata::Model<PlainNet, dist::OneDevice<>, double> back(one, 99);
    back.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    back.load(path);
    CHECK(back.get_weights() == model.get_weights());
    // The same network without the moving statistics' variables: its file lacks them.
    using Stripped = Sequential<Input<6, 6, 2>, Conv2D<4, 3, Linear, 1, Padding::Same, false>,
                                BatchNormalization<BatchNormOptions{.momentum = 0.9}>, ActivationLayer<ReLU>, MaxPooling2D<2>,
                                Flatten, Dense<5, Tanh>, Dense<3, Softmax>>;
    strata::Model<Stripped, dist::OneDevice<>, double> other(one, 4);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    const std::string path2 = strata_test::temp_path("bn_stripped.safetensors");
    other.save(path2);
    try {
        back.load(path2);
        FAIL("a checkpoint without batch_normalization_1's variables was loaded");
    } catch (const strata::Error& e) {
        CHECK(std::string(e.what()).find("batch_normalization_1/") != std::string::npos);
    }
    std::filesystem::remove(path);
    std::filesystem::remove(path2);
}

TEST_CASE("BatchNormalization in a pipeline: each micro-batch by its own statistics; one micro-batch is one device") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.1};
    dist::OneDevice<> one;
    const auto reference = train_with<PlainNet>(one, 3, 8, opt);
    using S = dist::Pipeline<strata::place::Host, dist::GPipe, dist::split::At<4>>;
    S whole({.micro_batches = 1});
    CHECK(max_relative_difference(train_with<PlainNet>(whole, 3, 8, opt), reference) <= 1e-10);
    S split({.micro_batches = 2});
    const auto got = train_with<PlainNet>(split, 3, 8, opt);
    CHECK(max_relative_difference(got, reference) > 1e-6);  // micro-batch statistics differ from the batch's
}

namespace {
// `images(n, 5)` reordered within each batch of `batch` examples, so that a one-replica pipeline's
// micro-batch k holds every replica's micro-batch k of the original batch (replica r's share is
// split_batch's, its micro-batches split again): the examples each synchronized sum covers.
strata::data::Dataset<> regrouped_images(std::size_t n, std::size_t batch, int replicas, int micro) {
    auto f = strata_test::lcg(n * 72, 5, 0, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((f[i * 72] + f[i * 72 + 7] > 1.0) + (f[i * 72 + 40] > 0.5));
    std::vector<float> xs;
    std::vector<std::int32_t> ys;
    for (std::size_t b0 = 0; b0 < n; b0 += batch) {
        for (int k = 0; k < micro; ++k)
            for (int r = 0; r < replicas; ++r) {
                const auto share = dist::replica_slice(std::int64_t(batch), replicas, r);
                const auto part = dist::replica_slice(share.count, micro, k);
                for (std::int64_t e = 0; e < part.count; ++e) {
                    const std::size_t i = b0 + std::size_t(share.first + part.first + e);
                    xs.insert(xs.end(), f.begin() + std::ptrdiff_t(i * 72), f.begin() + std::ptrdiff_t((i + 1) * 72));
                    ys.push_back(y[i]);
                }
            }
    }
    return strata::data::Dataset<>::from_arrays(std::move(xs), {6, 6, 2}, std::move(ys));
}

template <class N, class Strategy>
std::vector<double> train_on(Strategy& s, const strata::data::Dataset<>& ds, std::size_t global_batch, strata::optim::Optimizer opt) {
    strata::Model<N, Strategy, double> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(ds.batch(global_batch), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}
}  // namespace

TEST_CASE("SyncBatchNormalization in the hybrid: replicas sum each micro-batch's statistics (float64)") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    using G = dist::Pipeline<strata::place::Host, dist::GPipe, dist::split::At<4>>;
    using F = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<4>>;
    SUBCASE("one micro-batch a replica: the whole global batch's statistics, one device's update") {
        for (std::size_t global : {12u, 10u}) {
            dist::OneDevice<> one;
            const auto reference = train_with<SyncNet>(one, 3, global, opt);
            for (int r = 2; r <= 3; ++r) {
                CAPTURE(global);
                CAPTURE(r);
                G hybrid({.micro_batches = 1, .replicas = r});
                CHECK(max_relative_difference(train_with<SyncNet>(hybrid, 3, global, opt), reference) <= 1e-10);
                // The negative control: unsynchronized, each replica normalizes its own share.
                G plain({.micro_batches = 1, .replicas = r});
                CHECK(max_relative_difference(train_with<PlainNet>(plain, 3, global, opt), reference) > 1e-6);
            }
        }
    }
    SUBCASE("several micro-batches: micro-batch k over every replica, as one replica would see it regrouped") {
        for (int micro : {2, 3}) {
            CAPTURE(micro);
            const int replicas = 2;
            const std::size_t global = 12;
            G one_replica({.micro_batches = micro, .replicas = 1});
            const auto reference = train_on<PlainNet>(one_replica, regrouped_images(36, global, replicas, micro), global, opt);
            G hybrid({.micro_batches = micro, .replicas = replicas});
            const auto got = train_on<SyncNet>(hybrid, strata_test::images(36, 5), global, opt);
            CHECK(max_relative_difference(got, reference) <= 1e-10);
            CHECK(moving_difference(got, reference) <= 1e-12);
            // 1F1B interleaves forwards and backwards: every replica's stage still meets the same sums.
            F interleaved({.micro_batches = micro, .replicas = replicas});
            CHECK(train_on<SyncNet>(interleaved, strata_test::images(36, 5), global, opt) == got);
        }
    }
    SUBCASE("a share too small to fill every micro-batch is refused, naming the numbers") {
        G hybrid({.micro_batches = 4, .replicas = 2});
        const auto msg = strata_test::error_of<strata::ValueError>([&] { train_with<SyncNet>(hybrid, 1, 6, opt); });
        CHECK(msg.find("fill its 4 micro-batches") != std::string::npos);
        CHECK(msg.find("a batch of 6 over 2 replicas gives 3") != std::string::npos);
    }
}

TEST_CASE("global_clipnorm in a pipeline and the hybrid: the norm of the whole model's gradient, summed over the stages") {
    // Each stage updates its own layers, but the scale is the whole gradient's: the stages'
    // sums of squares are summed over the stages of each replica before any stage applies.
    // Small enough to clip every step (the moving statistics are not part of the norm).
    const strata::optim::Optimizer clipped = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9, .global_clipnorm = 0.05};
    const strata::optim::Optimizer plain = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    using S = dist::Pipeline<strata::place::Host, dist::GPipe, dist::split::At<4>>;
    using F = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<2, 6>>;
    for (std::size_t global : {12u, 10u}) {
        CAPTURE(global);
        dist::OneDevice<> one;
        const auto reference = train_with<SyncNet>(one, 3, global, clipped);
        dist::OneDevice<> one_unclipped;
        CHECK(max_relative_difference(train_with<SyncNet>(one_unclipped, 3, global, plain), reference) > 1e-3);  // it clips
        S two_stages({.micro_batches = 1});  // one micro-batch: the batch's statistics, one device's
        CHECK(max_relative_difference(train_with<SyncNet>(two_stages, 3, global, clipped), reference) <= 1e-10);
        F three_stages({.micro_batches = 1});
        CHECK(max_relative_difference(train_with<SyncNet>(three_stages, 3, global, clipped), reference) <= 1e-10);
        S hybrid({.micro_batches = 1, .replicas = 2});  // the stages' gradients summed over the copies, then the norm
        CHECK(max_relative_difference(train_with<SyncNet>(hybrid, 3, global, clipped), reference) <= 1e-10);
    }
}

namespace {
// Synchronized batch normalization inside residual blocks (identity and projection shortcuts).
using ResBn = Sequential<Input<6, 6, 2>, Conv2D<4, 3, Linear, 1, Padding::Same, false>, SyncBatchNormalization<0.9>,
                         ActivationLayer<ReLU>,
                         Residual<Conv2D<4, 3, Linear, 1, Padding::Same, false>, SyncBatchNormalization<0.9>, ActivationLayer<ReLU>,
                                  Conv2D<4, 3, Linear, 1, Padding::Same, false>, SyncBatchNormalization<0.9>, ReLU>,
                         Residual<Projection<8, 2>, Conv2D<8, 3, Linear, 2, Padding::Same, false>, SyncBatchNormalization<0.9>,
                                  ActivationLayer<ReLU>, Conv2D<8, 3, Linear, 1, Padding::Same, false>, SyncBatchNormalization<0.9>, ReLU>,
                         GlobalAveragePooling2D, Dense<3, Softmax>>;
}  // namespace

TEST_CASE("SyncBatchNormalization inside residual blocks: replicas equal one device, empty shares included") {
    static_assert(ResBn::synchronizes_replicas);
    // 5 moving-statistics pairs: the stem's and two in each block
    CHECK(ResBn::num_non_trainable() == 2 * (4 + 4 + 4 + 8 + 8));
    const strata::optim::Optimizer opt = strata::optim::AdamW{.learning_rate = 0.01, .global_clipnorm = 1.0};
    for (std::size_t global : {10u, 3u}) {  // 3 over 4 replicas: one share is empty
        dist::OneDevice<> one;
        const auto reference = train_with<ResBn>(one, 3, global, opt);
        for (int n : {2, 4}) {
            CAPTURE(global);
            CAPTURE(n);
            dist::Mirrored<> bucketed(n, {.bucket_bytes = 64});
            CHECK(max_relative_difference(train_with<ResBn>(bucketed, 3, global, opt), reference) <= 1e-10);
            dist::CentralStorage<> central(n);
            CHECK(max_relative_difference(train_with<ResBn>(central, 3, global, opt), reference) <= 1e-10);
        }
    }
}

TEST_CASE("batch normalization inside residual blocks: the optimizer moves exactly the moving statistics as averages") {
    // A learning rate of 0: no trainable variable may change, every moving statistic must.
    using N = ResBn;
    dist::OneDevice<> one;
    strata::Model<N, dist::OneDevice<>, double> model(one, 5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::AdamW{.learning_rate = 0.0, .weight_decay = 0.5});
    const auto before = model.get_weights();
    model.fit(images(8, 3).batch(8), {.epochs = 1, .verbose = 0});
    const auto after = model.get_weights();
    std::int64_t moved = 0, still = 0;
    for (const auto& p : N::parameters())
        for (std::int64_t i = p.offset; i < p.offset + p.shape.size(); ++i) {
            const bool changed = after[std::size_t(i)] != before[std::size_t(i)];
            if (p.trainable) {
                CHECK_MESSAGE(!changed, p.name, " changed with a learning rate of 0");
                still += !changed;
            } else {
                moved += changed;
            }
        }
    CHECK(moved == N::num_non_trainable());
    CHECK(still == N::num_params - N::num_non_trainable());
}

TEST_CASE("batch normalization evaluated before it was trained: the model says so; trained, loaded or given weights it does not") {
    dist::OneDevice<> one;
    strata::Model<PlainNet, dist::OneDevice<>, double> model(one, 4);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    CHECK(model.statistics_untrained());
    // Two layers of 4 + 5 channels: 2 x 9 statistics.
    const std::string says = decltype(model)::untrained_statistics_message("evaluate");
    CHECK(says.find("evaluate: the model has not been trained or loaded: its 18 batch normalization statistics") !=
          std::string::npos);
    // evaluate still answers (with the initial statistics: no division by a zero variance).
    const auto before = model.evaluate(images(20, 6).batch(10));
    CHECK(std::isfinite(before.loss));
    CHECK(model.statistics_untrained());  // evaluating trains nothing
    model.train_step(*images(10, 6).batch(10).iterate(0));
    CHECK_FALSE(model.statistics_untrained());

    strata::Model<PlainNet, dist::OneDevice<>, double> given(one, 5);
    given.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    given.set_weights(model.get_weights());
    CHECK_FALSE(given.statistics_untrained());
    const std::string path = strata_test::temp_path("bn_untrained.safetensors");
    model.save(path);
    strata::Model<PlainNet, dist::OneDevice<>, double> loaded(one, 6);
    loaded.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    loaded.load(path);
    CHECK_FALSE(loaded.statistics_untrained());
    std::filesystem::remove(path);

    // A network without batch normalization has no such statistics (the negative control).
    using NoNorm = Sequential<Input<6, 6, 2>, Flatten, Dense<3, Softmax>>;
    strata::Model<NoNorm, dist::OneDevice<>, double> plain(one, 4);
    plain.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    CHECK_FALSE(plain.statistics_untrained());
}
