// Training on place::Cuda against the host oracle: the same model, seed and batches must give
// the same weights (within float rounding) after a few steps, and evaluate/predict must agree.
// Compiled by nvcc wherever it is found; skipped (exit 77) where no GPU is.
#include <doctest/doctest.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
#include <strata/distribute/pipeline.hpp>

#include "cuda_model_data.hpp"

using namespace strata::nn;
namespace dist = strata::distribute;

namespace {
using Cnn = strata_test::CudaCnn;
strata::data::Dataset<> data(std::size_t n) { return strata_test::cuda_model_data(n); }

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(a[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return diff / scale;
}

// The first GPU as two logical GPUs of 1 GiB each.
void two_logical_gpus() {
    const auto gpus = strata::place::list_physical_devices(strata::place::DeviceKind::Gpu);
    REQUIRE(!gpus.empty());
    strata::place::reset_devices();
    strata::place::set_logical_device_configuration(gpus[0], {{.memory_limit = strata::place::Megabytes{1024}},
                                                              {.memory_limit = strata::place::Megabytes{1024}}});
}

// The weights after 2 epochs of SGD with momentum on 60 examples in batches of 15, under `strategy`.
template <class S>
std::vector<double> train_sgd(S& strategy) {
    strata::Model<Cnn, S, double> model(strategy, 5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9});
    model.fit(data(60).batch(15), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}
}  // namespace

TEST_CASE("a model trained on Cuda matches the host") {
    dist::OneDevice<strata::place::Cuda> gpu;
    strata::Model<Cnn, dist::OneDevice<strata::place::Cuda>, double> on_gpu(gpu, 3);
    strata::Model<Cnn, dist::Default, double> on_host(3);
    on_gpu.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    on_host.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    CHECK(on_gpu.get_weights() == on_host.get_weights());  // Philox init: identical on both places
    auto ds = data(64).batch(16);
    on_gpu.fit(ds, {.epochs = 2, .verbose = 0});
    on_host.fit(ds, {.epochs = 2, .verbose = 0});
    CHECK(max_relative(on_gpu.get_weights(), on_host.get_weights()) < 1e-9);
    const auto eg = on_gpu.evaluate(ds), eh = on_host.evaluate(ds);
    CHECK(eg.loss == doctest::Approx(eh.loss).epsilon(1e-9));
    CHECK(eg.accuracy == doctest::Approx(eh.accuracy));
}

TEST_CASE("a training step replayed as a CUDA graph gives the figures of its kernels launched one by one") {
    // 70 examples in batches of 16: four full batches and one of 6, every epoch, so the graph is
    // captured for 16, the batch of 6 runs eagerly (a new key), and 16 is captured again; Adam's
    // update (its step count changes every step) stays outside the graph. float and double.
    auto run = [](bool graphs, auto zero) {
        using T = decltype(zero);
        strata::place::set_cuda_graphs(graphs);
        dist::OneDevice<strata::place::Cuda> gpu;
        strata::Model<Cnn, dist::OneDevice<strata::place::Cuda>, T> m(gpu, 7);
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01}, {"accuracy"});
        std::vector<double> loss, accuracy;
        std::vector<std::int64_t> replays{0};  // after each epoch
        const auto ds = data(70).batch(16);
        for (int e = 0; e < 4; ++e) {
            const auto h = m.fit(ds, {.epochs = e + 1, .verbose = 0, .initial_epoch = e});
            loss.push_back(h.history.at("loss").back());
            accuracy.push_back(h.history.at("accuracy").back());
            replays.push_back(m.cuda_graph_replays());
        }
        strata::place::set_cuda_graphs(true);
        return std::tuple{m.get_weights(), loss, accuracy, replays, m.cuda_graph_note()};
    };
    auto same = [](const auto& with, const auto& without) {
        const auto& [w1, loss1, acc1, replays1, note1] = with;
        const auto& [w0, loss0, acc0, replays0, note0] = without;
        INFO("the last eager step with graphs on: ", note1);
        CHECK(replays0.back() == 0);
        CHECK(note0 == "graphs are off (place::set_cuda_graphs(false))");
        // Per epoch 4 steps of batch 16 and one of 6 (its key differs: never a replay). The first
        // epoch runs one step of 16 eagerly, captures the second and replays the rest; an epoch
        // may capture again when a GPU buffer moved at its start (seen on an H200: the third of
        // four fits replayed 2 steps), and by the last every step of 16 is a replay.
        CHECK(replays1[1] >= 1);
        CHECK(replays1[4] - replays1[3] == 4);
        CHECK(replays1[4] >= 8);
        CHECK(w1 == w0);  // the same kernels in the same order: bit for bit
        CHECK(loss1 == loss0);
        CHECK(acc1 == acc0);
    };
    same(run(true, 0.0f), run(false, 0.0f));
    same(run(true, 0.0), run(false, 0.0));
    // A network with a random layer (Dropout's kernels take the step) never replays a graph.
    using WithDropout = Sequential<Input<8, 8, 1>, Flatten, Dense<16, ReLU>, Dropout<20>, Dense<3, Softmax>>;
    dist::OneDevice<strata::place::Cuda> gpu;
    strata::Model<WithDropout, dist::OneDevice<strata::place::Cuda>> m(gpu, 7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    m.fit(data(64).batch(16), {.epochs = 2, .verbose = 0});
    CHECK(m.cuda_graph_replays() == 0);
}

TEST_CASE("a residual network trained on Cuda matches the host, and its steps replay as CUDA graphs") {
    // An identity block, a projection block, average and global average pooling; then the same
    // with Dropout in a block (its masks are the same on both places; no graph for its steps).
    using Same4 = Conv2D<4, 3, ReLU, 1, Padding::Same>;
    using ResNet = Sequential<Input<8, 8, 1>, Same4, Residual<Same4, Conv2D<4, 3, Linear, 1, Padding::Same>, ReLU>,
                              Residual<Projection<8, 2>, Conv2D<8, 3, ReLU, 2, Padding::Same>, Conv2D<8, 3, Linear, 1, Padding::Same>, ReLU>,
                              AveragePooling2D<2>, GlobalAveragePooling2D, Dense<3, Softmax>>;
    using DropResNet = Sequential<Input<8, 8, 1>, Same4, Residual<Same4, Dropout<20>, Conv2D<4, 3, Linear, 1, Padding::Same>, ReLU>,
                                  Residual<Projection<8, 2>, Conv2D<8, 3, ReLU, 2, Padding::Same>>, GlobalAveragePooling2D,
                                  Dense<3, Softmax>>;
    auto check = [](auto net, bool graphs) {
        using Net = decltype(net);
        dist::OneDevice<strata::place::Cuda> gpu;
        strata::Model<Net, dist::OneDevice<strata::place::Cuda>, double> on_gpu(gpu, 3);
        strata::Model<Net, dist::Default, double> on_host(3);
        on_gpu.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
        on_host.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
        CHECK(on_gpu.get_weights() == on_host.get_weights());
        auto ds = data(64).batch(16);
        on_gpu.fit(ds, {.epochs = 3, .verbose = 0});
        on_host.fit(ds, {.epochs = 3, .verbose = 0});
        CHECK(max_relative(on_gpu.get_weights(), on_host.get_weights()) < 1e-9);
        const auto eg = on_gpu.evaluate(ds), eh = on_host.evaluate(ds);
        CHECK(eg.loss == doctest::Approx(eh.loss).epsilon(1e-9));
        if (graphs) CHECK(on_gpu.cuda_graph_replays() > 0);
        else CHECK(on_gpu.cuda_graph_replays() == 0);
    };
    check(ResNet{}, true);
    check(DropResNet{}, false);
}

TEST_CASE("Mirrored and CentralStorage on two logical GPUs match one GPU") {
    two_logical_gpus();
    dist::OneDevice<strata::place::Cuda> one;
    const auto ref = train_sgd(one);
    dist::Mirrored<strata::place::Cuda> mirrored(2);
    dist::CentralStorage<strata::place::Cuda> central(2);
    for (const auto& w : {train_sgd(mirrored), train_sgd(central)})
        CHECK(max_relative(w, ref) < 1e-12);
}

TEST_CASE("Pipeline (GPipe and 1F1B) over two logical GPUs matches one GPU") {
    two_logical_gpus();
    dist::OneDevice<strata::place::Cuda> one;
    const auto ref = train_sgd(one);
    dist::Pipeline<strata::place::Cuda, dist::GPipe, dist::split::Balanced<2>> gpipe({.micro_batches = 4});
    dist::Pipeline<strata::place::Cuda, dist::OneFOneB, dist::split::Balanced<2>> f1b({.micro_batches = 3});
    for (const auto& w : {train_sgd(gpipe), train_sgd(f1b)})
        CHECK(max_relative(w, ref) < 1e-12);
}

TEST_CASE("ParameterServer with workers on two logical GPUs equals OneDevice<Host> on the same global batches") {
    two_logical_gpus();
    const auto adam = strata::optim::Adam{.learning_rate = 0.01};
    // Synchronous, 2 workers on mini-batches of 6: the update of the global batch of 12.
    strata::Model<Cnn, dist::Default, double> host(7);
    host.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    host.fit(data(60).batch(12), {.epochs = 2, .verbose = 0});
    for (int servers : {1, 2}) {
        CAPTURE(servers);
        dist::ParameterServer<strata::place::Cuda, strata::sync::Synchronous> ps(2, servers, {});
        strata::Model<Cnn, decltype(ps), double> model(ps, 7);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
        model.fit(data(60).batch(6), {.epochs = 2, .verbose = 0});
        CHECK(max_relative(model.get_weights(), host.get_weights()) < 1e-9);
        CHECK(model.gradient_path().stats().updates == 10);
    }
    // One worker, any mode: sequential SGD on its mini-batches (sync::Any chosen at run time).
    strata::Model<Cnn, dist::Default, double> seq(9);
    seq.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    seq.fit(data(40).batch(5), {.epochs = 1, .verbose = 0});
    dist::ParameterServerOptions o;
    o.rule = strata::sync::Rule::Asynchronous;
    dist::ParameterServer<strata::place::Cuda, strata::sync::Any> async(1, 1, o);
    strata::Model<Cnn, decltype(async), double> model(async, 9);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    model.fit(data(40).batch(5), {.epochs = 1, .verbose = 0});
    CHECK(max_relative(model.get_weights(), seq.get_weights()) < 1e-9);
}
