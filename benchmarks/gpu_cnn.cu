// gpu_cnn: the seed CNN's training step on one GPU, strata OneDevice<place::Cuda> (issue 18).
//
//   build/benchmarks/gpu_cnn [--batch-size 128 --batch-size 1024] [--warmup 20] [--steps 100]
//                            [--reps 3] [--seed 42] [--cuda-graphs on|off] [--json FILE]
//
// The network is tools/mnist_cnn_net.hpp's Net (Conv2D<32,3,ReLU>, MaxPooling2D<2>,
// Conv2D<64,3,ReLU>, MaxPooling2D<2>, Flatten, Dense<64,ReLU>, Dense<10,Softmax>), float,
// sparse categorical cross-entropy, RMSprop 1e-3, trained with Model::train_step on one fixed
// batch of synthetic MNIST-shaped images (uniform [0, 1) pixels, labels 0..9 from an LCG) per
// batch size. For each batch size: --warmup untimed steps, then --reps samples of --steps steps,
// each sample timed on the steady clock between two cudaDeviceSynchronize calls; the median
// sample is reported.
//
// Columns:
//   batch        images per step
//   ms/step      median sample's seconds / --steps, in milliseconds
//   images/s     batch / (seconds per step)
//   GFLOP/s      FLOPs of a training step (flops_per_image x batch, below) / seconds per step
//   loss         the last step's loss (a finite number: the step really trained)
// flops_per_image counts the multiply-adds (x2) of the convolutions and dense layers: forward,
// weight gradient, and data gradient for every layer but the first (benchmarks/step_profile.cpp
// counts the same way); pooling, activations, the loss and the optimizer are not counted.
//
// --cuda-graphs on (the default): the step's forward, loss and backward are captured once as a CUDA
// graph and replayed (place/cuda_graph.hpp); every timed step must be a replay, else the run fails
// (the warm-up is then at least 2 steps: the first runs eagerly, the second is captured).
// off: their kernels are launched one by one.
//
// Where the input lives: Model::train_step takes a host batch (data::Batch holds host spans)
// and stages it to the GPU every step (one host-to-device copy of batch x 784 floats and the
// labels), so this figure includes that copy; the Model API has no device-resident input yet.
// benchmarks/gpu_vs_pytorch.py runs this binary beside PyTorch and reports both.
//
// Without a usable GPU it prints why and exits 77 (nothing is measured); --help works anywhere.
#include <strata/strata.hpp>

#include "../tools/mnist_cnn_net.hpp"  // the seed CNN alone: the network, no tool code
#include "bench_common.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using mnist_example::Net;  // the network tools/mnist_cnn trains
using Gpu = strata::distribute::OneDevice<strata::place::Cuda>;
using Layers = Net::bound_layers<float, strata::place::Cuda>;

struct Options {
    std::vector<std::int64_t> batches{128, 1024};
    int warmup = 20;
    int steps = 100;
    int reps = 3;
    std::uint64_t seed = 42;
    std::string cuda_graphs = "on";
    std::string json;
};

// FLOPs of one example's training step through layer L (2 per multiply-add); 0 for layers that
// only move data. The same count as step_profile's layer_flops.
template <class L>
constexpr double layer_train_flops(bool first) {
    double forward = 0;
    if constexpr (requires { L::patch; L::filters; }) {  // Conv2D: one patch . kernel product per output pixel
        const double pixels = double(L::output_shape::size / L::filters);
        forward = 2.0 * pixels * double(L::patch) * double(L::filters);
    } else if constexpr (requires { L::inputs; L::kernel_size; }) {  // Dense
        forward = 2.0 * double(L::kernel_size);
    }
    return forward /* forward */ + forward /* weight gradient */ + (first ? 0.0 : forward) /* data gradient */;
}
template <std::size_t... I>
constexpr double train_flops_per_image(std::index_sequence<I...>) {
    return (0.0 + ... + layer_train_flops<std::tuple_element_t<I, Layers>>(I == 0));
}
constexpr double flops_per_image = train_flops_per_image(std::make_index_sequence<std::tuple_size_v<Layers>>{});
// The figure benchmarks/gpu_vs_pytorch.py computes from the layer shapes (it checks the JSON's).
static_assert(flops_per_image == 14778624.0);

struct Row {
    std::int64_t batch = 0;
    double step_seconds = 0, images_per_second = 0, gflops = 0, loss = 0;
    std::int64_t replayed = 0;  // timed steps replayed from the captured graph
    std::vector<double> sample_step_seconds;
};

void sync(const char* what) { strata::place::cuda_check(cudaDeviceSynchronize(), what); }

Row measure(const Options& o, std::int64_t batch) {
    // One fixed synthetic batch: the same bytes every step, so only the step is measured.
    std::vector<float> x(std::size_t(batch) * 784);
    std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
    std::uint64_t s = o.seed * 2654435761u + 12345;
    auto next = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return s >> 40;
    };
    for (auto& v : x) v = float(next()) / float(1 << 24);
    for (auto& v : y) v = std::int32_t(next() % 10);
    const auto ds = strata::data::Dataset<>::from_arrays(std::move(x), {28, 28, 1}, std::move(y)).batch(batch);

    Gpu gpu;
    strata::Model<Net, Gpu> model(gpu, o.seed);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    auto it = ds.begin();
    const auto& b = *it;

    Row row;
    row.batch = batch;
    // With graphs on, the first step of a shape runs eagerly and the second is captured: at
    // least two warm-up steps, so that every timed step is a replay.
    const int warmup = o.cuda_graphs == "on" && o.warmup < 2 ? 2 : o.warmup;
    for (int i = 0; i < warmup; ++i) row.loss = model.train_step(b).loss;
    sync("cudaDeviceSynchronize after the warm-up");
    const std::int64_t replays_before = model.cuda_graph_replays();
    for (int r = 0; r < o.reps; ++r) {
        sync("cudaDeviceSynchronize before a sample");
        const auto t0 = bench::Clock::now();
        for (int i = 0; i < o.steps; ++i) row.loss = model.train_step(b).loss;
        sync("cudaDeviceSynchronize after a sample");
        row.sample_step_seconds.push_back(bench::seconds_since(t0) / double(o.steps));
    }
    // With graphs on, every timed step must have been a replay: a silent fallback to launching
    // the kernels one by one would be measured under the wrong name.
    row.replayed = model.cuda_graph_replays() - replays_before;
    if (o.cuda_graphs == "on" && row.replayed != std::int64_t(o.reps) * o.steps)
        throw strata::DeviceError("gpu_cnn: --cuda-graphs on, but " + std::to_string(row.replayed) + " of the " +
                                  std::to_string(std::int64_t(o.reps) * o.steps) + " timed steps were replayed graphs (" +
                                  model.cuda_graph_note() + ")");
    row.step_seconds = bench::median(row.sample_step_seconds);
    row.images_per_second = double(batch) / row.step_seconds;
    row.gflops = flops_per_image * double(batch) / row.step_seconds / 1e9;
    return row;
}

int run(const Options& o) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        std::printf("gpu_cnn: no usable GPU (%s); nothing measured\n",
                    status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
        return 77;
    }
    cudaDeviceProp prop{};
    strata::place::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);

    std::printf("gpu_cnn: the seed CNN's training step, strata OneDevice<Cuda>, float, RMSprop 1e-3\n");
    std::printf("GPU: %s (%d SMs, compute capability %d.%d); CUDA driver API %d, runtime %d\n", prop.name,
                prop.multiProcessorCount, prop.major, prop.minor, driver, runtime);
    std::printf("%d warm-up steps, median of %d samples of %d steps; %.0f FLOPs per image per step\n", o.warmup, o.reps,
                o.steps, flops_per_image);
    std::printf("input: one fixed host batch, staged to the GPU by Model::train_step every step (pinned, queued)\n");
    std::printf("CUDA graphs: %s\n\n", o.cuda_graphs == "on" ? "on (the step's forward, loss and backward replayed as one graph)"
                                                            : "off (the kernels launched one by one)");
    strata::place::set_cuda_graphs(o.cuda_graphs == "on");
    std::printf("%8s %10s %12s %10s %10s\n", "batch", "ms/step", "images/s", "GFLOP/s", "loss");
    bench::Machine machine;
    std::vector<Row> rows;
    for (auto batch : o.batches) {
        rows.push_back(measure(o, batch));
        const auto& r = rows.back();
        std::printf("%8lld %10.3f %12.0f %10.1f %10.4f\n", (long long)r.batch, r.step_seconds * 1e3, r.images_per_second,
                    r.gflops, r.loss);
        std::fflush(stdout);
    }
    machine.load_after = bench::load_average();
    if (!o.json.empty()) {
        cli::Json out = cli::Json::array();
        for (const auto& r : rows)
            out.push_back({{"batch", r.batch},
                           {"step_seconds", r.step_seconds},
                           {"sample_step_seconds", r.sample_step_seconds},
                           {"images_per_second", r.images_per_second},
                           {"gflops", r.gflops},
                           {"loss", cli::finite_or_null(r.loss)},
                           {"graph_replays", r.replayed}});
        machine.extra = {{"gpu", prop.name}, {"cuda_driver_api", std::to_string(driver)}, {"cuda_runtime", std::to_string(runtime)}};
        bench::write_json(o.json, {{"benchmark", "gpu_cnn"},
                                   {"machine", machine.json()},
                                   {"gpu", prop.name},
                                   {"sms", prop.multiProcessorCount},
                                   {"flops_per_image", flops_per_image},
                                   {"warmup", o.warmup},
                                   {"steps", o.steps},
                                   {"reps", o.reps},
                                   {"input", "host batch staged to the GPU by Model::train_step every step"},
                                   {"cuda_graphs", o.cuda_graphs},
                                   {"rows", out}});
    }
    for (const auto& r : rows)
        if (!std::isfinite(r.loss)) {
            std::fprintf(stderr, "gpu_cnn: error: the loss at batch %lld is not finite\n", (long long)r.batch);
            return 1;
        }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"The seed CNN's training step on one GPU (strata OneDevice<Cuda>); exits 77 without a GPU.", "gpu_cnn"};
    Options o;
    app.add_option("--batch-size", o.batches, "batch sizes to measure (repeat the flag, or comma-separated)")
        ->delimiter(',')->transform(cli::integer<std::int64_t>(1, 65536))->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed steps before timing each batch size")
        ->transform(cli::integer(0, 1'000'000))->capture_default_str();
    app.add_option("--steps", o.steps, "steps per timed sample")->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--reps", o.reps, "timed samples per batch size; the median is reported")
        ->transform(cli::integer(1, 1000))->capture_default_str();
    app.add_option("--seed", o.seed, "seed of the weights and of the synthetic batch")->capture_default_str();
    app.add_option("--cuda-graphs", o.cuda_graphs,
                   "on: the step's forward, loss and backward captured once as a CUDA graph and replayed (the default); "
                   "off: their kernels launched one by one")
        ->check(cli::one_of({"on", "off"}))
        ->capture_default_str();
    app.add_option("--json", o.json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] { return run(o); });
}
