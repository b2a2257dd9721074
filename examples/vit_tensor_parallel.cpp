// Tensor parallelism the way Megatron-LM splits a transformer: strata_train's Vision Transformer
// (patch 4, width 64, depth 4, 4 heads, MLP 128 GELU) with every attention layer split by heads
// and every MLP split column-then-row over 2 or 4 logical devices, optionally under Mirrored
// replicas (data x tensor parallelism). It trains the unsplit model on the same batches beside
// it and prints how far apart the two end (float rounding: the sums over shards run in another
// order), and each shard's device, heads, hidden features and peak memory.
//
//   build/examples/vit_tensor_parallel                                  2 shards, synthetic images
//   build/examples/vit_tensor_parallel --shards 4 --replicas 2 --data data/mnist --examples 8192
//   build/examples/vit_tensor_parallel --json out.json
//
// Without --data the images are synthetic (28x28, labelled by a fixed random linear "teacher"),
// so the program needs no files. docs/parallelism.md ("Tensor parallelism") explains the split.
#include <strata/strata.hpp>
#include <strata/data/mnist.hpp>
#include <strata/distribute/tensor_parallel_attention.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../tools/cli.hpp"

using namespace strata::nn;
namespace dist = strata::distribute;
namespace pd = strata::place;

namespace {

constexpr std::int64_t kPatch = 4, kWidth = 64, kHeads = 4, kMlp = 128;

// The ViT of tools/strata_train_models.hpp with its attention and MLP layers as template
// arguments: the unsplit layers, or the split ones (same variables, names and initial values).
template <class Attention, class Up, class Down>
struct VitWith {
    using A = Residual<LayerNormalization<>, Attention>;
    using M = Residual<LayerNormalization<>, Up, Down>;
    using Net = Sequential<Input<28, 28, 1>, PatchEmbedding<kPatch, kWidth>, PositionEmbedding<>, A, M, A, M, A, M, A, M,
                           LayerNormalization<>, GlobalAveragePooling1D, Dense<10, Softmax>>;
};
using Unsplit = VitWith<MultiHeadAttention<kHeads, kWidth / kHeads>, TokenDense<kMlp, GELU>, TokenDense<kWidth>>::Net;
template <int N>
using Split = typename VitWith<dist::TensorParallelMultiHeadAttention<kHeads, kWidth / kHeads, 0, N>,
                               dist::TensorParallelTokenDense<kMlp, GELU, N, dist::Columns>,
                               dist::TensorParallelTokenDense<kWidth, Linear, N, dist::Rows>>::Net;
static_assert(Split<2>::num_params == Unsplit::num_params && Split<4>::num_params == Unsplit::num_params);

struct Flags {
    int shards = 2;
    int replicas = 1;
    int epochs = 1;
    std::int64_t batch_size = 64;
    std::int64_t examples = 1024;
    std::string data;
    std::uint64_t seed = 42;
    std::string json;
};

// 28x28 images of uniform noise in [0, 1) labelled by the argmax of a fixed random linear map.
strata::data::Dataset<> teacher_images(std::int64_t n, std::uint64_t seed) {
    std::vector<float> x(std::size_t(n) * 784), w(10 * 784);
    std::uint64_t s = 0;
    auto next = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return float(double(s >> 11) / double(1ull << 53));
    };
    s = 12345;
    for (auto& v : w) v = next() * 2 - 1;
    s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& v : x) v = next();
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        double best_v = -1e300;
        for (int c = 0; c < 10; ++c) {
            double v = 0;
            for (int j = 0; j < 784; ++j) v += double(w[std::size_t(c * 784 + j)]) * double(x[std::size_t(i * 784 + j)]);
            if (v > best_v) best_v = v, y[std::size_t(i)] = c;
        }
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {28, 28, 1}, std::move(y));
}

struct Run {
    std::vector<float> weights;
    double seconds = 0, loss = 0, accuracy = 0;
};

template <class Net>
Run train(const Flags& f, const strata::data::Dataset<>& data, const strata::data::Dataset<>& test) {
    dist::Mirrored<> mirrored(f.replicas);
    strata::Model<Net, dist::Mirrored<>> model(mirrored, f.seed);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::AdamW{.learning_rate = 1e-3, .weight_decay = 0.05});
    const auto t0 = std::chrono::steady_clock::now();
    model.fit(data.batch(std::size_t(f.batch_size)), {.epochs = f.epochs, .verbose = 0});
    Run r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto ev = model.evaluate(test.batch(256));
    r.loss = ev.loss;
    r.accuracy = ev.accuracy;
    r.weights = model.get_weights();
    return r;
}

template <int N>
int run_split(const Flags& f, const strata::data::Dataset<>& data, const strata::data::Dataset<>& test, cli::Json& json) {
    const auto cpu = pd::list_physical_devices(pd::DeviceKind::Cpu).front();
    pd::set_logical_device_configuration(cpu, std::vector<pd::LogicalDeviceConfiguration>(std::size_t(N)), pd::Oversubscribe::Yes);
    const auto devices = pd::list_logical_devices(pd::DeviceKind::Cpu);
    for (const auto& d : devices) pd::reset_memory_stats(d);
    std::printf("%d shard(s) on logical devices %s ... %s, %d replica(s) (Mirrored): %d threads\n\n", N, devices.front().name.c_str(),
                devices.back().name.c_str(), f.replicas, N * f.replicas);

    const Run split = train<Split<N>>(f, data, test);
    std::vector<std::size_t> peaks;
    for (const auto& d : devices) peaks.push_back(pd::memory_info(d).peak);
    const Run unsplit = train<Unsplit>(f, data, test);

    double diff = 0;
    for (std::size_t i = 0; i < split.weights.size(); ++i)
        diff = std::max(diff, std::abs(double(split.weights[i]) - double(unsplit.weights[i])) / std::max(1.0, std::abs(double(unsplit.weights[i]))));

    // A device's peak counts everything allocated in it: its shards' activations, and on the
    // first `replicas` devices also the Mirrored replica that runs there (its whole model).
    std::printf("%-6s %-16s %-10s %-16s %12s\n", "shard", "device", "heads", "hidden features", "device peak");
    cli::Json shards = cli::Json::array();
    for (int j = 0; j < N; ++j) {
        const auto heads = dist::detail::shard_part(kHeads, N, j), hidden = dist::detail::shard_part(kMlp, N, j);
        const std::string h = std::to_string(heads.first) + "-" + std::to_string(heads.first + heads.count - 1);
        const std::string m = std::to_string(hidden.first) + "-" + std::to_string(hidden.first + hidden.count - 1);
        std::printf("%-6d %-16s %-10s %-16s %12s\n", j, devices[std::size_t(j)].name.c_str(), h.c_str(), m.c_str(),
                    pd::format_bytes(peaks[std::size_t(j)]).c_str());
        shards.push_back({{"shard", j}, {"device", devices[std::size_t(j)].name}, {"heads", h}, {"hidden_features", m},
                          {"peak_bytes", peaks[std::size_t(j)]}});
    }
    const double images = double(f.examples) * f.epochs;
    std::printf("\n%-8s %10s %12s %10s %10s\n", "model", "seconds", "images/s", "test loss", "accuracy");
    std::printf("%-8s %10.2f %12.0f %10.4f %10.4f\n", "split", split.seconds, images / split.seconds, split.loss, split.accuracy);
    std::printf("%-8s %10.2f %12.0f %10.4f %10.4f\n", "unsplit", unsplit.seconds, images / unsplit.seconds, unsplit.loss, unsplit.accuracy);
    std::printf("\nlargest relative difference of the %zu variables after training: %.3g (float32; the sums over shards "
                "run in another order)\n",
                split.weights.size(), diff);
    auto side = [&](const Run& r) {
        return cli::Json{{"seconds", r.seconds}, {"images_per_second", images / r.seconds}, {"test_loss", r.loss}, {"test_accuracy", r.accuracy}};
    };
    json["shards"] = N;
    json["replicas"] = f.replicas;
    json["per_shard"] = shards;
    json["split"] = side(split);
    json["unsplit"] = side(unsplit);
    json["max_relative_weight_difference"] = diff;
    return 0;
}

struct Data {
    strata::data::Dataset<> train, test;
    std::string source;
};

Data load(const Flags& f) {
    if (f.data.empty())
        return {teacher_images(f.examples, f.seed), teacher_images(512, f.seed + 1), "synthetic images (a random linear teacher)"};
    auto mnist = strata::data::load_mnist(f.data);
    const auto n = std::min<std::int64_t>(f.examples, std::int64_t(mnist.train.size()));
    std::vector<float> x(mnist.train.images.data.begin(), mnist.train.images.data.begin() + n * 784);
    std::vector<std::int32_t> y(mnist.train.labels.data.begin(), mnist.train.labels.data.begin() + n);
    return {strata::data::Dataset<>::from_arrays(std::move(x), {28, 28, 1}, std::move(y)),
            strata::data::Dataset<>::from_arrays(std::move(mnist.test.images.data), {28, 28, 1}, std::move(mnist.test.labels.data)),
            "MNIST (" + f.data + ")"};
}

int run(const Flags& f) {
    const Data d = load(f);
    const auto& data = d.train;
    const auto& test = d.test;
    const std::string& source = d.source;
    std::printf("a Vision Transformer (%lld variables): attention split by heads, the MLP column-then-row; %s\n",
                static_cast<long long>(Unsplit::num_params), source.c_str());
    cli::Json json;
    json["model_params"] = Unsplit::num_params;
    json["data"] = source;
    json["epochs"] = f.epochs;
    json["examples"] = f.examples;
    json["batch_size"] = f.batch_size;
    const int status = f.shards == 2 ? run_split<2>(f, data, test, json) : run_split<4>(f, data, test, json);
    if (!f.json.empty()) {
        cli::write_json(f.json, json);
        std::printf("wrote %s\n", f.json.c_str());
    }
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"strata_train's Vision Transformer split over 2 or 4 logical devices as Megatron splits it, beside the unsplit one.",
                 "vit_tensor_parallel"};
    Flags f;
    app.add_option("--shards", f.shards, "logical devices the attention heads and MLP features are split over (2 or 4)")
        ->check(cli::one_of({"2", "4"}))->capture_default_str();
    app.add_option("--replicas", f.replicas, "Mirrored replicas, each with its own shards")->transform(cli::integer(1, 16))->capture_default_str();
    app.add_option("--epochs", f.epochs, "passes over the training set")->transform(cli::integer(1, 1000))->capture_default_str();
    app.add_option("--batch-size", f.batch_size, "the global batch")->transform(cli::integer<std::int64_t>(1, 65536))->capture_default_str();
    app.add_option("--examples", f.examples, "training examples")->transform(cli::integer<std::int64_t>(1, 60000))->capture_default_str();
    app.add_option("--data", f.data, "a folder with MNIST's four IDX files (default: synthetic images)");
    app.add_option("--seed", f.seed, "seed of the data and the weights")->capture_default_str();
    app.add_option("--json", f.json, "also write the report as JSON to FILE");
    return cli::run(app, argc, argv, [&] { return run(f); });
}
