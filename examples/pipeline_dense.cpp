// Model parallelism, the reason it exists: a Dense model whose variables, gradients and Adam
// slots do not fit one logical device's memory limit fails under OneDevice, and trains under a
// Pipeline that puts its layers on 2, 3 or 4 such devices (distribute/pipeline.hpp).
//
//   build/examples/pipeline_dense                              4 stages, 1F1B, 32 MiB per device
//   build/examples/pipeline_dense --stages 2 --schedule gpipe --micro-batches 8 --json out.json
//
// The data are synthetic (a fixed random linear "teacher" labels uniform inputs), so the program
// needs no files; the table gives each stage's layers, parameters, device and peak memory.
#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../tools/cli.hpp"

using namespace strata::nn;
namespace dist = strata::distribute;
namespace pd = strata::place;

namespace {

// 2,374,666 parameters: 9.1 MiB in float32, 45 MiB with gradients and Adam's two slots under
// OneDevice; the largest of four balanced stages (one 1024x1024 layer) needs about 20 MiB.
using Net = Sequential<Input<256>, Dense<1024, ReLU>, Dense<1024, ReLU>, Dense<1024, ReLU>, Dense<10, Softmax>>;

struct Flags {
    int stages = 4;
    int micro_batches = 4;
    std::string schedule = "1f1b";
    int limit_mib = 32;
    int epochs = 2;
    std::int64_t batch_size = 128;
    std::int64_t examples = 4096;
    std::uint64_t seed = 42;
    std::string json;
};

// Uniform inputs in [-1, 1) drawn from `seed`; the label is the argmax of a fixed random linear
// map of them (the same "teacher" for every seed).
strata::data::Dataset<> teacher_data(std::int64_t n, std::uint64_t seed) {
    std::vector<float> x(std::size_t(n) * 256), w(10 * 256);
    std::uint64_t s = 0;
    auto next = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return float(double(s >> 11) / double(1ull << 53) * 2.0 - 1.0);
    };
    s = 12345;
    for (auto& v : w) v = next();
    s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& v : x) v = next();
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        int best = 0;
        float best_v = -1e30f;
        for (int c = 0; c < 10; ++c) {
            float v = 0;
            for (int j = 0; j < 256; ++j) v += w[std::size_t(c * 256 + j)] * x[std::size_t(i * 256 + j)];
            if (v > best_v) best_v = v, best = c;
        }
        y[std::size_t(i)] = best;
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {256}, std::move(y));
}

// Tries one training step under OneDevice on /device:CPU:0; returns the error it stopped with.
std::string try_one_device(const Flags& f, const strata::data::Dataset<>& train) {
    dist::OneDevice<> one("/device:CPU:0");
    try {
        strata::Model<Net, dist::OneDevice<>> model(one, f.seed);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 1e-3});
        model.fit(train.batch(std::size_t(f.batch_size)), {.epochs = 1, .steps_per_epoch = 1, .verbose = 0});
    } catch (const strata::DeviceError& e) {
        return e.what();
    }
    return "";
}

// The stage count and the schedule come from the flags, at run time (split::AnyBalanced,
// AnySchedule): one compiled model serves them all. With both in the type instead
// (Pipeline<pd::Host, dist::OneFOneB, dist::split::Balanced<4>>) the split is checked at compile
// time and Model::summary() prints it.
int run_pipeline(const Flags& f, const strata::data::Dataset<>& train, const strata::data::Dataset<>& test, cli::Json& json) {
    using Strategy = dist::Pipeline<pd::Host, dist::AnySchedule, dist::split::AnyBalanced<dist::split::ByParams>>;
    using Model = strata::Model<Net, Strategy>;
    Strategy pipeline({.micro_batches = f.micro_batches,
                       .schedule = f.schedule == "gpipe" ? dist::ScheduleKind::GPipe : dist::ScheduleKind::OneFOneB,
                       .stages = f.stages});
    std::printf("%s%s\n", Net::summary().c_str(), pipeline.split_summary<Net>().c_str());
    Model model(pipeline, f.seed);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 1e-3});
    const auto t0 = std::chrono::steady_clock::now();
    auto history = model.fit(train.shuffle(std::size_t(f.examples), f.seed).batch(std::size_t(f.batch_size)),
                             {.epochs = f.epochs, .verbose = 2});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto ev = model.evaluate(test.batch(std::size_t(f.batch_size)));  // micro-batches no larger than training's

    const auto bounds = pipeline.split_bounds<Net>();
    const int P = pipeline.num_stages();
    const auto names = Net::layer_names();
    const auto params = dist::split::layer_costs<Net, dist::split::ByParams>();
    std::printf("\n%-6s %-16s %-22s %12s %12s %12s\n", "stage", "device", "layers", "params", "peak", "limit");
    cli::Json stages = cli::Json::array();
    for (int s = 0; s < P; ++s) {
        std::string layers;
        double p = 0;
        for (std::size_t l = bounds[std::size_t(s)]; l < bounds[std::size_t(s) + 1]; ++l) {
            layers += (layers.empty() ? "" : ",") + names[l];
            p += params[l];
        }
        const auto& d = pipeline.device(0, s);
        const auto mem = pd::memory_info(d);
        std::printf("%-6d %-16s %-22s %12.0f %12s %12s\n", s, d.name.c_str(), layers.c_str(), p, pd::format_bytes(mem.peak).c_str(),
                    pd::format_bytes(mem.limit).c_str());
        stages.push_back({{"stage", s}, {"device", d.name}, {"layers", layers}, {"params", p}, {"peak_bytes", mem.peak},
                          {"limit_bytes", mem.limit}});
    }
    const double images = double(f.examples) * f.epochs;
    std::printf("\ntrained %d epochs in %.2f s (%.0f images/s); test loss %.4f, accuracy %.4f\n", f.epochs, seconds,
                images / seconds, ev.loss, ev.accuracy);
    json["pipeline"] = {{"stages", P},
                        {"schedule", pipeline.schedule_name()},
                        {"micro_batches", f.micro_batches},
                        {"bubble_predicted", double(P - 1) / double(f.micro_batches + P - 1)},
                        {"per_stage", stages},
                        {"seconds", seconds},
                        {"images_per_second", images / seconds},
                        {"loss", history.history["loss"]},
                        {"test_loss", ev.loss},
                        {"test_accuracy", ev.accuracy}};
    return 0;
}


int run(const Flags& f) {
    const auto cpu = pd::list_physical_devices(pd::DeviceKind::Cpu).front();
    std::vector<pd::LogicalDeviceConfiguration> devices(std::size_t(f.stages),
                                                        pd::LogicalDeviceConfiguration{.memory_limit = pd::Megabytes{std::size_t(f.limit_mib)}});
    pd::set_logical_device_configuration(cpu, devices, pd::Oversubscribe::Yes);
    std::printf("%d logical host devices with a %d MiB memory limit each; the model has %lld parameters (%.1f MiB in float32)\n\n",
                f.stages, f.limit_mib, static_cast<long long>(Net::num_params), double(Net::num_params) * 4 / (1 << 20));
    const auto train = teacher_data(f.examples, f.seed);
    const auto test = teacher_data(1024, f.seed + 1);

    cli::Json json;
    json["model_params"] = Net::num_params;
    json["devices"] = f.stages;
    json["memory_limit_bytes"] = std::size_t(f.limit_mib) << 20;
    const std::string one = try_one_device(f, train);
    std::printf("OneDevice on /device:CPU:0: %s\n\n", one.empty() ? "trained (the model fits one device)" : one.c_str());
    json["one_device_error"] = one.empty() ? cli::Json(nullptr) : cli::Json(one);
    pd::reset_memory_stats(pd::find_device("/device:CPU:0"));  // the peaks below are the pipeline's

    const int status = run_pipeline(f, train, test, json);
    if (!f.json.empty()) {
        cli::write_json(f.json, json);
        std::printf("wrote %s\n", f.json.c_str());
    }
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"A Dense model too big for one logical device, trained by a Pipeline over 2-4 of them.", "pipeline_dense"};
    Flags f;
    app.add_option("--stages", f.stages, "pipeline stages, one logical device each (2, 3 or 4)")
        ->transform(cli::integer(2, 4))->capture_default_str();
    app.add_option("--micro-batches", f.micro_batches, "micro-batches per global batch")
        ->transform(cli::integer(1, 1024))->capture_default_str();
    app.add_option("--schedule", f.schedule, "gpipe or 1f1b")->check(cli::one_of({"gpipe", "1f1b"}))->capture_default_str();
    app.add_option("--limit-mib", f.limit_mib, "memory limit of each logical device, MiB")
        ->transform(cli::integer(1, 65536))->capture_default_str();
    app.add_option("--epochs", f.epochs, "passes over the training set")->transform(cli::integer(1, 1000))->capture_default_str();
    app.add_option("--batch-size", f.batch_size, "the global batch")->transform(cli::integer<std::int64_t>(1, 65536))->capture_default_str();
    app.add_option("--examples", f.examples, "training examples")->transform(cli::integer<std::int64_t>(1, 1 << 22))->capture_default_str();
    app.add_option("--seed", f.seed, "seed of the data, the weights and the shuffle")->capture_default_str();
    app.add_option("--json", f.json, "also write the report as JSON to FILE");
    return cli::run(app, argc, argv, [&] { return run(f); });
}
