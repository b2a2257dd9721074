// Model parallelism in one process (issue 21): a Pipeline (GPipe or 1F1B over P stages, M
// micro-batches) and the hybrid (R pipelines) must train exactly like one device on the same
// global batches; the split is chosen at compile time or at run time (split::AnyBalanced);
// failures end promptly and say where.
#include <doctest/doctest.h>

#include "test_images.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;
namespace split = strata::distribute::split;

using strata_test::lcg;
using strata_test::max_relative_difference;

namespace {

// conv2d, max_pooling2d, flatten, dense, dropout, dense_1: 6 layers.
using Cnn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<7, Tanh>, Dropout<25>,
                       Dense<3, Softmax>>;

using strata_test::images;

template <class Strategy, class T>
std::vector<T> train_with(Strategy& s, strata::optim::Optimizer opt, std::size_t global_batch) {
    strata::Model<Cnn, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(images(global_batch * 3, 5).batch(global_batch), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

template <class T>
std::vector<T> reference(strata::optim::Optimizer opt, std::size_t global) {
    dist::OneDevice<> one;
    return train_with<dist::OneDevice<>, T>(one, opt, global);
}

// Every M in {1, 2, 4, 8} and R in {1, 2}, on global batches of 12 and 10 (10 is not a
// multiple of 4 or 8: uneven micro-batches; 8 micro-batches of a replica's 5 examples: 5).
template <class Schedule, class Split, class T>
void check_pipeline(strata::optim::Optimizer opt, double tolerance) {
    using S = dist::Pipeline<strata::place::Host, Schedule, Split>;
    for (std::size_t global : {12u, 10u}) {
        const auto ref = reference<T>(opt, global);
        for (int m : {1, 2, 4, 8})
            for (int r : {1, 2}) {
                CAPTURE(global);
                CAPTURE(m);
                CAPTURE(r);
                S pipeline({.micro_batches = m, .replicas = r});
                CHECK(pipeline.num_replicas_in_sync() == r);
                CHECK(max_relative_difference(train_with<S, T>(pipeline, opt, global), ref) <= tolerance);
            }
    }
}

}  // namespace

TEST_CASE("the constexpr partitioner: At names the boundaries, Balanced minimises the largest stage") {
    static_assert(split::At<3>::bounds<Cnn>() == std::array<std::size_t, 3>{0, 3, 6});
    static_assert(split::At<1, 4>::bounds<Cnn>() == std::array<std::size_t, 4>{0, 1, 4, 6});
    // Parameters: conv2d 57, dense 91, dense_1 24; the rest 0.
    static_assert(split::layer_costs<Cnn, split::ByParams>() == std::array<double, 6>{57, 0, 0, 91, 0, 24});
    // FLOPs per example: conv2d 2·57·16 positions, pooling 12 outputs, flatten 12, dense 2·91,
    // dropout 7, dense_1 2·24.
    static_assert(split::layer_costs<Cnn, split::ByFlops>() == std::array<double, 6>{1824, 12, 12, 182, 7, 48});
    // Two stages by parameters: a cut before max_pooling2d, flatten or dense leaves 57 | 115, one
    // before dropout or dense_1 148 | 24 or worse; of the equal ones the earliest wins.
    constexpr auto two = split::Balanced<2>::bounds<Cnn>();
    CHECK(two[1] == 1);
    // Three stages by parameters: 57 | 91 | 24.
    constexpr auto three = split::Balanced<3>::bounds<Cnn>();
    CHECK(three[0] == 0);
    CHECK(three[3] == 6);
    const double largest3 = [&] {
        const auto c = split::layer_costs<Cnn, split::ByParams>();
        double worst = 0;
        for (std::size_t s = 0; s < 3; ++s) {
            double v = 0;
            for (std::size_t l = three[s]; l < three[s + 1]; ++l) v += c[l];
            worst = std::max(worst, v);
        }
        return worst;
    }();
    CHECK(largest3 == 91);
    // By FLOPs the convolution dominates: it gets a stage of its own.
    constexpr auto flops = split::Balanced<2, split::ByFlops>::bounds<Cnn>();
    CHECK(flops[1] == 1);
    // As many stages as layers: one layer each.
    constexpr auto six = split::Balanced<6>::bounds<Cnn>();
    for (std::size_t s = 0; s <= 6; ++s) CHECK(six[s] == s);
}

TEST_CASE("Pipeline (GPipe, 2 stages cut before dense) equals OneDevice (float64, SGD momentum)") {
    check_pipeline<dist::GPipe, split::At<3>, double>(strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9}, 1e-12);
}
TEST_CASE("Pipeline (1F1B, 2 stages cut before dense) equals OneDevice (float64, SGD momentum)") {
    check_pipeline<dist::OneFOneB, split::At<3>, double>(strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9}, 1e-12);
}
TEST_CASE("Pipeline (GPipe and 1F1B, 3 stages, balanced by parameters) equals OneDevice (float64, RMSprop)") {
    check_pipeline<dist::GPipe, split::Balanced<3>, double>(strata::optim::RMSprop{.learning_rate = 0.01}, 1e-12);
    check_pipeline<dist::OneFOneB, split::Balanced<3>, double>(strata::optim::RMSprop{.learning_rate = 0.01}, 1e-12);
}
TEST_CASE("Pipeline (GPipe and 1F1B, 4 stages, a stage of flatten alone) equals OneDevice (float64, Adam)") {
    check_pipeline<dist::GPipe, split::At<2, 3, 5>, double>(strata::optim::Adam{.learning_rate = 0.01}, 1e-12);
    check_pipeline<dist::OneFOneB, split::At<2, 3, 5>, double>(strata::optim::Adam{.learning_rate = 0.01}, 1e-12);
}
TEST_CASE("Pipeline (1F1B, 2 stages balanced by FLOPs) equals OneDevice (float32, SGD)") {
    check_pipeline<dist::OneFOneB, split::Balanced<2, split::ByFlops>, float>(strata::optim::SGD{.learning_rate = 0.1}, 1e-6);
}

TEST_CASE("GPipe and 1F1B give the same bits; evaluate and predict match one device") {
    using G = dist::Pipeline<strata::place::Host, dist::GPipe, split::At<3>>;
    using F = dist::Pipeline<strata::place::Host, dist::OneFOneB, split::At<3>>;
    G g({.micro_batches = 3});
    F f({.micro_batches = 3});
    const auto opt = strata::optim::Adam{};
    CHECK(train_with<G, float>(g, opt, 10) == train_with<F, float>(f, opt, 10));

    G p({.micro_batches = 4});
    strata::Model<Cnn, G> pm(p, 3);
    strata::Model<Cnn> single(3);
    pm.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    single.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    const auto data = images(23, 9);
    const auto a = pm.evaluate(data.batch(7)), b = single.evaluate(data.batch(7));
    CHECK(a.examples == 23);
    CHECK(a.loss == doctest::Approx(b.loss).epsilon(1e-6));
    CHECK(a.accuracy == b.accuracy);
    const auto pa = pm.predict(data.batch(7)), pb = single.predict(data.batch(7));
    REQUIRE(pa.shape() == pb.shape());
    for (std::int64_t i = 0; i < pa.size(); ++i) CHECK(pa.data()[i] == doctest::Approx(pb.data()[i]).epsilon(1e-6));
}

TEST_CASE("AnySchedule: the schedule chosen at run time runs that schedule, bit for bit; a missing or contrary choice is refused") {
    using A = dist::Pipeline<strata::place::Host, dist::AnySchedule, split::At<2, 3, 5>>;  // P = 4
    using F = dist::Pipeline<strata::place::Host, dist::OneFOneB, split::At<2, 3, 5>>;
    const auto opt = strata::optim::RMSprop{};
    for (auto kind : {dist::ScheduleKind::GPipe, dist::ScheduleKind::OneFOneB}) {
        const bool one_f_one_b = kind == dist::ScheduleKind::OneFOneB;
        CAPTURE(one_f_one_b);
        A any({.micro_batches = 3, .schedule = kind});
        CHECK(any.one_f_one_b() == one_f_one_b);
        CHECK(std::string(any.schedule_name()) == (one_f_one_b ? "1F1B" : "GPipe"));
        strata::Model<Cnn, A, double> model(any, 11);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        model.fit(images(36, 5).batch(12), {.epochs = 2, .verbose = 0});
        // The activations each stage held show which schedule ran: 1F1B min(m, P - s), GPipe m.
        const auto& st = model.gradient_path().pipeline_stats();
        for (std::size_t s = 0; s < 4; ++s)
            CHECK(st.stages[s].max_in_flight == (one_f_one_b ? std::min<std::int64_t>(3, 4 - std::int64_t(s)) : 3));
        F f({.micro_batches = 3});
        CHECK(model.get_weights() == train_with<F, double>(f, opt, 12));  // the schedules give the same bits
    }
    CHECK(strata_test::error_of<strata::ValueError>([] { A a({.micro_batches = 2}); }).find("PipelineOptions::schedule must name the schedule") !=
          std::string::npos);
    CHECK(strata_test::error_of<strata::ValueError>([] { F f({.schedule = dist::ScheduleKind::GPipe}); }).find("names the other schedule") !=
          std::string::npos);
}

TEST_CASE("AnyBalanced: the stage count chosen at run time gives Balanced<P>'s split and its bits; a missing or contrary count is refused") {
    using Any = dist::Pipeline<strata::place::Host, dist::AnySchedule, split::AnyBalanced<split::ByFlops>>;
    const auto opt = strata::optim::Adam{.learning_rate = 0.01};
    auto check_count = [&]<int P>(std::integral_constant<int, P>) {
        CAPTURE(P);
        using Fixed = dist::Pipeline<strata::place::Host, dist::OneFOneB, split::Balanced<P, split::ByFlops>>;
        Any any({.micro_batches = 3, .schedule = dist::ScheduleKind::OneFOneB, .stages = P});
        CHECK(any.num_stages() == P);
        constexpr auto want = split::Balanced<P, split::ByFlops>::template bounds<Cnn>();
        const auto got = any.split_bounds<Cnn>();
        CHECK(std::vector<std::size_t>(want.begin(), want.end()) == got);
        strata::Model<Cnn, Any, double> model(any, 11);
        CHECK(model.gradient_path().stage_bounds() == got);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        model.fit(images(36, 5).batch(12), {.epochs = 2, .verbose = 0});
        Fixed fixed({.micro_batches = 3});
        CHECK(model.get_weights() == train_with<Fixed, double>(fixed, opt, 12));  // the same split, the same bits
        CHECK(any.split_summary<Cnn>() == strata::Model<Cnn, Fixed>::summary().substr(Cnn::summary().size()));
    };
    check_count(std::integral_constant<int, 2>{});
    check_count(std::integral_constant<int, 3>{});
    check_count(std::integral_constant<int, 6>{});  // one layer a stage
    // Against one device too (a run-time split is not only equal to a compile-time one).
    {
        Any any({.micro_batches = 4, .replicas = 2, .schedule = dist::ScheduleKind::GPipe, .stages = 4});
        CHECK(max_relative_difference(train_with<Any, double>(any, opt, 12), reference<double>(opt, 12)) <= 1e-12);
    }
    CHECK(strata_test::error_of<strata::ValueError>([] { Any a({.schedule = dist::ScheduleKind::GPipe}); })
              .find("PipelineOptions::stages must name the number of stages") != std::string::npos);
    CHECK(strata_test::error_of<strata::ValueError>([] {
              Any a({.schedule = dist::ScheduleKind::GPipe, .stages = 7});
              strata::Model<Cnn, Any> m(a, 1);
          }).find("7 stages for a Sequential of 6 layers") != std::string::npos);
    using Two = dist::Pipeline<strata::place::Host, dist::GPipe, split::Balanced<2>>;
    CHECK(strata_test::error_of<strata::ValueError>([] { Two t({.stages = 3}); }).find("the type's split has 2 stages") !=
          std::string::npos);
    CHECK_NOTHROW(Two({.stages = 2}));
}

TEST_CASE("Network(first, last) runs a range of the model's layers: chained ranges give the whole network's outputs and gradients") {
    using Net = strata::nn::Network<Cnn, double, strata::place::Host>;
    std::vector<double> params(std::size_t(Cnn::num_params));
    Net whole;
    whole.init(params.data(), 5);
    strata::Tensor<double, strata::place::Host> x(strata::Shape{5, 6, 6, 2});
    const auto xv = lcg(std::size_t(x.size()), 7);
    std::copy(xv.begin(), xv.end(), x.data());
    const strata::nn::Mode mode{.training = true, .step = 1, .seed = 3};
    const auto out = whole.forward(params.data(), x.view(), mode);
    for (std::int64_t i = 0; i < out.size(); ++i) whole.output_grad().data()[i] = double(i % 7) - 3.0;
    std::vector<double> grads(params.size(), 0.0);
    strata::Tensor<double, strata::place::Host> dx_whole(x.shape());
    whole.backward(params.data(), grads.data(), mode, [](std::int64_t, std::int64_t) {}, dx_whole.view());

    for (std::size_t cut : {1u, 2u, 3u, 4u, 5u}) {  // every place to cut, the fused conv | pool pair and flatten first included
        CAPTURE(cut);
        Net a(0, cut), b(cut, Cnn::num_layers);
        CHECK(b.first_layer() == cut);
        const auto off = Cnn::offsets[cut];
        const auto mid = a.forward(params.data(), x.view(), mode);
        REQUIRE(mid.shape() == Net::layer_input_shape(cut, 5));
        strata::Tensor<double, strata::place::Host> copy_in(mid.shape());
        strata::copy(mid, copy_in.view());
        const auto o = b.forward(params.data() + off, copy_in.view(), mode);
        REQUIRE(o.shape() == out.shape());
        for (std::int64_t i = 0; i < o.size(); ++i) CHECK(o.data()[i] == out.data()[i]);
        for (std::int64_t i = 0; i < o.size(); ++i) b.output_grad().data()[i] = double(i % 7) - 3.0;
        std::vector<double> g(params.size(), 0.0);
        strata::Tensor<double, strata::place::Host> dmid(mid.shape());
        b.backward(params.data() + off, g.data() + off, mode, [](std::int64_t, std::int64_t) {}, dmid.view());
        strata::copy(dmid.view(), a.output_grad());
        strata::Tensor<double, strata::place::Host> dx(x.shape());
        a.backward(params.data(), g.data(), mode, [](std::int64_t, std::int64_t) {}, dx.view());
        CHECK(g == grads);
        for (std::int64_t i = 0; i < dx.size(); ++i) CHECK(dx.data()[i] == dx_whole.data()[i]);
        // The input of a range is its first layer's.
        CHECK(strata_test::error_of<strata::ShapeError>([&] { b.forward(params.data() + off, x.view(), mode); }).find("layer " + std::to_string(cut)) !=
              std::string::npos);
    }
    CHECK(strata_test::error_of<strata::ValueError>([] { Net n(3, 3); }).find("layers [3, 3) of a Sequential of 6 layers") != std::string::npos);
    CHECK(strata_test::error_of<strata::ValueError>([] { Net n(0, 7); }).find("of a Sequential of 6 layers") != std::string::npos);
}

TEST_CASE("Pipeline errors: bad options, a stage that throws names itself, nothing hangs") {
    using G = dist::Pipeline<strata::place::Host, dist::GPipe, split::At<3>>;
    CHECK(strata_test::error_of<strata::ValueError>([] { G g({.micro_batches = 0}); }).find("micro_batches must be >= 1, got 0") !=
          std::string::npos);
    CHECK(strata_test::error_of<strata::ValueError>([] { G g({.replicas = 0}); }).find("replicas must be >= 1") != std::string::npos);
    // A label out of range is refused before any stage runs (Model checks every batch).
    G g({.micro_batches = 2});
    strata::Model<Cnn, G> model(g, 1);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    std::vector<float> x(4 * 72, 0.5f);
    const auto msg = strata_test::error_of<strata::ValueError>([&] {
        model.fit(x, std::vector<std::int32_t>{0, 1, 7, 2}, {.verbose = 0, .batch_size = 4, .shuffle = false});
    });
    CHECK(msg.find("label 7") != std::string::npos);
}

namespace {
namespace pd = strata::place;

// 150,794 parameters (1.15 MiB in float64): dense 16,640, dense_1 and dense_2 65,792 each,
// dense_3 2,570.
using Wide = Sequential<Input<64>, Dense<256, ReLU>, Dense<256, ReLU>, Dense<256, ReLU>, Dense<10, Softmax>>;

strata::data::Dataset<> vectors(std::size_t n, std::uint64_t seed) {
    auto f = lcg(n * 64, seed, -1, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t(std::size_t(f[i * 64] * 5 + 5) % 10);
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {64}, std::move(y));
}

// Every case starts from, and leaves, the default device configuration.
struct FreshDevices {
    FreshDevices() { pd::reset_devices(); }
    ~FreshDevices() {
        pd::set_placement_log_sink({});
        pd::set_log_device_placement(false);
        pd::reset_devices();
    }
};

pd::PhysicalDevice host() { return pd::list_physical_devices(pd::DeviceKind::Cpu).front(); }

template <class Strategy>
std::vector<double> train_wide(Strategy& s) {
    strata::Model<Wide, Strategy, double> model(s, 4);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05, .momentum = 0.9});
    model.fit(vectors(96, 2).batch(32), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}
}  // namespace

TEST_CASE("memory limits: a model too big for one logical device fails under OneDevice, trains under Pipeline over 4") {
    FreshDevices fresh;
    // Four logical host devices of 3 MiB each. Under OneDevice the variables (1.15 MiB), their
    // gradients (1.15 MiB) and SGD's momentum (1.15 MiB) need 3.45 MiB on one of them.
    pd::set_logical_device_configuration(host(), {{.memory_limit = pd::Megabytes{3}}, {.memory_limit = pd::Megabytes{3}},
                                                  {.memory_limit = pd::Megabytes{3}}, {.memory_limit = pd::Megabytes{3}}},
                                         pd::Oversubscribe::Yes);
    std::vector<double> reference;
    {
        dist::OneDevice<> unlimited;  // no device named: outside every logical device
        reference = train_wide(unlimited);
    }
    {
        dist::OneDevice<> one("/device:CPU:0");
        const auto msg = strata_test::error_of<strata::DeviceError>([&] { train_wide(one); });
        CAPTURE(msg);
        CHECK(msg.find("/device:CPU:0") != std::string::npos);
        CHECK(msg.find("out of its 3 MiB memory limit") != std::string::npos);
        CHECK(msg.find("requested") != std::string::npos);
    }
    {
        // Balanced by parameters over 4: dense | dense_1 | dense_2 | dense_3, at most 65,792
        // parameters (0.5 MiB, four times over with gradients, their scratch and momentum).
        using Four = dist::Pipeline<pd::Host, dist::OneFOneB, split::Balanced<4>>;
        static_assert(split::Balanced<4>::bounds<Wide>() == std::array<std::size_t, 5>{0, 1, 2, 3, 4});
        Four pipeline({.micro_batches = 4});
        CHECK(pipeline.scoped());
        CHECK(pipeline.device(0, 3).name == "/device:CPU:3");
        CHECK(max_relative_difference(train_wide(pipeline), reference) <= 1e-12);
        for (int d = 0; d < 4; ++d) {
            const auto info = pd::memory_info(pipeline.device(0, d));
            CHECK(info.peak > 0);
            CHECK(info.peak <= info.limit);
        }
    }
}

TEST_CASE("a stage that cannot take its layers fails with an error naming the stage, its layers and its device") {
    FreshDevices fresh;
    pd::set_logical_device_configuration(host(), {{.memory_limit = pd::Megabytes{3}}, {.memory_limit = pd::Megabytes{1}}},
                                         pd::Oversubscribe::Yes);
    using Two = dist::Pipeline<pd::Host, dist::GPipe, split::At<1>>;  // dense | dense_1, dense_2, dense_3
    Two pipeline({.micro_batches = 2});
    const auto msg = strata_test::error_of<strata::DistributedError>([&] { train_wide(pipeline); });
    CAPTURE(msg);
    CHECK(msg.find("Pipeline: stage 1 (dense_1, dense_2, dense_3) on /device:CPU:1 failed: /device:CPU:1: out of its 1 MiB "
                   "memory limit") != std::string::npos);
}

TEST_CASE("summary and the placement log say which layer lives on which device") {
    FreshDevices fresh;
    pd::set_logical_device_configuration(host(), {{}, {}, {}}, pd::Oversubscribe::Yes);
    using Three = dist::Pipeline<pd::Host, dist::GPipe, split::At<1, 3>>;
    const std::string summary = strata::Model<Wide, Three>::summary();
    CAPTURE(summary);
    CHECK(summary.find("Pipeline: 3 stages (At split), GPipe schedule") != std::string::npos);
    CHECK(summary.find("dense_1, dense_2") != std::string::npos);
    std::vector<std::string> lines;
    pd::set_placement_log_sink([&](std::string_view l) { lines.emplace_back(l); });
    pd::set_log_device_placement(true);
    Three pipeline({.micro_batches = 2});
    strata::Model<Wide, Three> model(pipeline, 1);
    auto has = [&](const std::string& line) { return std::find(lines.begin(), lines.end(), line) != lines.end(); };
    CHECK(has("GPipe pipeline stage 0 (layers dense; its thread and work) placed on /device:CPU:0"));
    CHECK(has("GPipe pipeline stage 1 (layers dense_1 dense_2; its thread and work) placed on /device:CPU:1"));
    CHECK(has("variable dense/kernel (64, 256) (stage 0) placed on /device:CPU:0"));
    CHECK(has("variable dense_2/bias (256,) (stage 1) placed on /device:CPU:1"));
    CHECK(has("variable dense_3/kernel (256, 10) (stage 2) placed on /device:CPU:2"));
}

TEST_CASE("checkpoints: a pipeline-trained model loads into OneDevice and back, optimizer state included") {
    strata_test::TempDir dir;
    using G = dist::Pipeline<pd::Host, dist::OneFOneB, split::Balanced<3>>;
    const auto data = vectors(64, 7).batch(16);
    const auto opt = strata::optim::Adam{.learning_rate = 0.01};
    const auto loss = strata::loss::SparseCategoricalCrossentropy{};

    // One epoch under the pipeline, saved; a second epoch under OneDevice from that file equals
    // two epochs under OneDevice.
    G g({.micro_batches = 4});
    strata::Model<Wide, G, double> piped(g, 5);
    piped.compile(loss, opt);
    piped.fit(data, {.epochs = 1, .verbose = 0});
    piped.save((dir / "piped.safetensors").string());

    strata::Model<Wide, dist::Default, double> one(5), resumed(9);
    one.compile(loss, opt);
    one.fit(data, {.epochs = 2, .verbose = 0});
    resumed.compile(loss, opt);
    resumed.load((dir / "piped.safetensors").string());
    CHECK(resumed.epoch() == 1);
    resumed.fit(data, {.epochs = 2, .verbose = 0, .initial_epoch = 1});
    CHECK(max_relative_difference(resumed.get_weights(), one.get_weights()) <= 1e-12);

    // And back: OneDevice's file into a pipeline, one more epoch on both.
    one.save((dir / "one.safetensors").string());
    G g2({.micro_batches = 3});
    strata::Model<Wide, G, double> back(g2, 77);
    back.compile(loss, opt);
    back.load((dir / "one.safetensors").string());
    CHECK(back.get_weights() == one.get_weights());
    back.fit(data, {.epochs = 3, .verbose = 0, .initial_epoch = 2});
    one.fit(data, {.epochs = 3, .verbose = 0, .initial_epoch = 2});
    CHECK(max_relative_difference(back.get_weights(), one.get_weights()) <= 1e-12);
}

TEST_CASE("the bubble on the virtual clock is (P - 1) / (m + P - 1); 1F1B holds at most P - s micro-batches, GPipe m") {
    auto check = [](auto schedule) {
        using Schedule = decltype(schedule);
        using S = dist::Pipeline<strata::place::Host, Schedule, split::At<2, 3, 5>>;  // P = 4
        constexpr int P = 4;
        for (int m : {1, 3, 8}) {
            CAPTURE(Schedule::name);
            CAPTURE(m);
            S pipeline({.micro_batches = m});
            strata::Model<Cnn, S> model(pipeline, 1);
            model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
            model.fit(images(24, 2).batch(12), {.epochs = 1, .verbose = 0});
            const auto& st = model.gradient_path().pipeline_stats();
            CHECK(st.steps == 2);
            CHECK(st.virtual_seconds == doctest::Approx(2.0 * 3 * (m + P - 1)));  // (m + P - 1) slots of F + B, twice
            for (std::size_t s = 0; s < std::size_t(P); ++s) {
                CAPTURE(s);
                CHECK(st.virtual_idle_fraction(s) == doctest::Approx(double(P - 1) / double(m + P - 1)));
                CHECK(st.stages[s].max_in_flight == (Schedule::one_f_one_b ? std::min<std::int64_t>(m, P - std::int64_t(s)) : m));
                CHECK(st.stages[s].busy_seconds > 0);
                CHECK(st.idle_fraction(s) >= 0);
                CHECK(st.idle_fraction(s) < 1);
            }
        }
    };
    check(dist::GPipe{});
    check(dist::OneFOneB{});
}

namespace {
// A layer that passes its input through, after sleeping `Ms` milliseconds in its forward: a
// stage that is slow to answer.
template <int Ms>
struct Sleepy {
    static constexpr const char* name = "Sleepy";
    static constexpr const char* keras_name = "sleepy";
    template <class In, class T, class P>
    struct bind {
        using input_shape = In;
        using output_shape = In;
        static constexpr std::int64_t num_params = 0;
        static std::vector<ParamInfo> param_info() { return {}; }
        void init(T*, std::uint64_t, std::uint64_t) const {}
        void forward(const T*, const strata::TensorView<T, P>& x, const strata::TensorView<T, P>& y, const Mode&) {
            std::this_thread::sleep_for(std::chrono::milliseconds(Ms));
            strata::copy(x, y);
        }
        void backward(const T*, T*, const strata::TensorView<T, P>&, const strata::TensorView<T, P>&,
                      const strata::TensorView<T, P>& dy, const strata::TensorView<T, P>& dx, const Mode&) {
            if (!dx.empty()) strata::copy(dy, dx);
        }
    };
};
}  // namespace

TEST_CASE("a stage that does not answer in time: the step fails with the waiting stage's deadline, no hang") {
    using Net = Sequential<Input<4>, Dense<3, ReLU>, Sleepy<400>, Dense<2, Softmax>>;
    using S = dist::Pipeline<strata::place::Host, dist::OneFOneB, split::At<2>>;  // dense, sleepy | dense_1
    S pipeline({.micro_batches = 2, .timeout = std::chrono::milliseconds(100)});
    strata::Model<Net, S> model(pipeline, 1);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    const auto t0 = std::chrono::steady_clock::now();
    const auto msg = strata_test::error_of<strata::DistributedError>([&] {
        model.fit(std::vector<float>(8 * 4, 0.5f), std::vector<std::int32_t>(8, 1), {.verbose = 0, .batch_size = 8});
    });
    CAPTURE(msg);
    CHECK(msg.find("Pipeline: stage 1 (dense_1) on /device:CPU:0/stage:1 failed: Pipeline: stage 1 (/device:CPU:0/stage:1) waited "
                   "more than 100 ms for the activations of micro-batch 0 from stage 0 (/device:CPU:0/stage:0)") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    // The pipeline is usable again once the stage is fast enough.
    S patient({.micro_batches = 2, .timeout = std::chrono::seconds(30)});
    strata::Model<Net, S> again(patient, 1);
    again.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    CHECK(again.fit(std::vector<float>(8 * 4, 0.5f), std::vector<std::int32_t>(8, 1), {.verbose = 0, .batch_size = 8}).epoch.size() == 1);
}

TEST_CASE("the hybrid on 4 logical devices: replica r's stage s on device r*P + s, exact against OneDevice") {
    FreshDevices fresh;
    pd::set_logical_device_configuration(host(), {{}, {}, {}, {}}, pd::Oversubscribe::Yes);
    std::vector<std::string> lines;
    pd::set_placement_log_sink([&](std::string_view l) { lines.emplace_back(l); });
    std::vector<double> reference;
    {
        dist::OneDevice<> one;
        reference = train_wide(one);
    }
    pd::set_log_device_placement(true);
    using Hybrid = dist::Pipeline<pd::Host, dist::OneFOneB, split::At<2>>;
    Hybrid hybrid({.micro_batches = 3, .replicas = 2});
    CHECK(hybrid.scoped());
    CHECK(hybrid.device(1, 0).name == "/device:CPU:2");
    CHECK(max_relative_difference(train_wide(hybrid), reference) <= 1e-12);
    auto has = [&](const std::string& line) { return std::find(lines.begin(), lines.end(), line) != lines.end(); };
    CHECK(has("1F1B pipeline stage 1 of replica 1 (layers dense_2 dense_3; its thread and work) placed on /device:CPU:3"));
    CHECK(has("variable dense_3/bias (10,) (stage 1, copy 1) placed on /device:CPU:3"));
}
