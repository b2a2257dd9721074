// bench_pipeline: model parallelism on this machine (issue 21).
//
// 1. The bubble: a P-stage pipeline of a Dense model, every M, both schedules; each stage's idle
//    fraction on the real clock and on the virtual one (distribute::PipelineStats) against
//    (P - 1) / (M + P - 1), and the most micro-batches each stage held at once.
// 2. Speed: the seed CNN and a Dense model at batch 128 under OneDevice on one core, Mirrored x2
//    (one core each) and Pipeline over 2 stages balanced by FLOPs (one core each), M = 4 and 8.
//
//   build/benchmarks/bench_pipeline [--steps 20] [--stages 4] [--json out.json]
#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <strata/io/svg_plot.hpp>

#include "bench_common.hpp"

using namespace strata::nn;
namespace dist = strata::distribute;
namespace split = strata::distribute::split;
using Host = strata::place::Host;

namespace {

using Cnn = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>, MaxPooling2D<2>, Conv2D<64, 3, ReLU>, MaxPooling2D<2>, Flatten,
                       Dense<64, ReLU>, Dense<10, Softmax>>;
// Four equal Dense layers (and a small head), so that P = 2 and 4 stages are balanced.
using Mlp = Sequential<Input<512>, Dense<512, ReLU>, Dense<512, ReLU>, Dense<512, ReLU>, Dense<512, ReLU>, Dense<10, Softmax>>;

template <class Net>
strata::data::Dataset<> random_data(std::int64_t n) {
    std::vector<float> x(std::size_t(n * Net::input_shape::size));
    std::uint64_t s = 88172645463325252ull;
    for (auto& v : x) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v = float(double(s >> 11) / double(1ull << 53));
    }
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 10);
    return strata::data::Dataset<>::from_arrays(std::move(x), std::vector<std::size_t>(Net::input_shape::dims.begin(), Net::input_shape::dims.end()),
                                                std::move(y));
}

struct Timing {
    double images_per_second = 0;
    std::vector<double> idle, virtual_idle;
    std::vector<std::int64_t> in_flight;
};

// `steps` training steps at batch 128 after one untimed epoch of 2 steps; images/s of the timed ones.
template <class Net, class Strategy>
Timing time_steps(Strategy& strategy, int steps) {
    strata::Model<Net, Strategy> model(strategy, 1);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.01});
    const auto data = random_data<Net>(128 * std::int64_t(steps));
    model.fit(data.batch(128), {.epochs = 1, .steps_per_epoch = 2, .verbose = 0});
    if constexpr (requires { model.gradient_path().reset_pipeline_stats(); }) model.gradient_path().reset_pipeline_stats();
    const auto t0 = bench::Clock::now();
    model.fit(data.batch(128), {.epochs = 1, .verbose = 0});
    Timing t;
    t.images_per_second = 128.0 * steps / bench::seconds_since(t0);
    if constexpr (requires { model.gradient_path().pipeline_stats(); }) {
        const auto& st = model.gradient_path().pipeline_stats();
        for (std::size_t s = 0; s < st.stages.size(); ++s) {
            t.idle.push_back(st.idle_fraction(s));
            t.virtual_idle.push_back(st.virtual_idle_fraction(s));
            t.in_flight.push_back(st.stages[s].max_in_flight);
        }
    }
    return t;
}

// The schedule and the stage count are chosen at run time: one pipeline model per network
// serves every row (the split is Balanced<P, ByFlops>'s).
using AnyPipeline = dist::Pipeline<Host, dist::AnySchedule, split::AnyBalanced<split::ByFlops>>;

void bubble_rows(dist::ScheduleKind schedule, int P, int steps, cli::Json& rows) {
    for (int m : {1, 2, 4, 8, 16}) {
        AnyPipeline pipeline({.micro_batches = m, .cores_per_stage = 1, .schedule = schedule, .stages = P});
        const auto t = time_steps<Mlp>(pipeline, steps);
        const double predicted = double(P - 1) / double(m + P - 1);
        double idle = 0, vidle = 0;
        for (int s = 0; s < P; ++s) idle += t.idle[std::size_t(s)] / P, vidle += t.virtual_idle[std::size_t(s)] / P;
        std::string flight;
        for (auto f : t.in_flight) flight += (flight.empty() ? "" : ",") + std::to_string(f);
        std::printf("%-6s %3d %3d %12.3f %14.3f %12.3f %14s %10.0f\n", pipeline.schedule_name(), P, m, predicted, vidle, idle,
                    flight.c_str(), t.images_per_second);
        rows.push_back({{"schedule", pipeline.schedule_name()}, {"stages", P}, {"micro_batches", m}, {"bubble_predicted", predicted},
                        {"idle_virtual", t.virtual_idle}, {"idle_real", t.idle}, {"max_in_flight", t.in_flight},
                        {"images_per_second", t.images_per_second}});
    }
}

template <class Net>
void speed_rows(const char* name, int steps, cli::Json& rows) {
    auto row = [&](const std::string& what, double ips) {
        std::printf("%-8s %-34s %10.0f\n", name, what.c_str(), ips);
        rows.push_back({{"model", name}, {"strategy", what}, {"images_per_second", ips}});
    };
    {
        dist::OneDevice<> one(1);
        row("OneDevice (1 core)", time_steps<Net>(one, steps).images_per_second);
    }
    {
        dist::Mirrored<> mirrored(2, {.cores_per_replica = 1});
        row("Mirrored x2 (1 core each)", time_steps<Net>(mirrored, steps).images_per_second);
    }
    for (int m : {4, 8}) {
        AnyPipeline g({.micro_batches = m, .cores_per_stage = 1, .schedule = dist::ScheduleKind::GPipe, .stages = 2});
        row("Pipeline GPipe P=2 M=" + std::to_string(m) + " (1 core each)", time_steps<Net>(g, steps).images_per_second);
        AnyPipeline f({.micro_batches = m, .cores_per_stage = 1, .schedule = dist::ScheduleKind::OneFOneB, .stages = 2});
        row("Pipeline 1F1B P=2 M=" + std::to_string(m) + " (1 core each)", time_steps<Net>(f, steps).images_per_second);
    }
}

// Two panels from the bubble rows: the idle fraction against M (predicted, virtual and real
// clock) for P = 2 and 4, and the most micro-batches stage 0 held (GPipe: M; 1F1B: P).
void bubble_plot(const cli::Json& rows, const std::string& path) {
    strata::io::Figure fig;
    strata::io::LinePlot idle, held;
    idle.title = "Bubble: idle fraction of a stage (mean over stages)";
    idle.x_label = "micro-batches M (log scale)";
    idle.y_label = "idle fraction";
    idle.x_scale = held.x_scale = strata::io::Scale::Log;
    held.title = "Activation memory: micro-batches held by stage 0";
    held.x_label = "micro-batches M (log scale)";
    held.y_label = "micro-batches held at once";
    std::size_t color = 0;
    for (int P : {2, 4})
        for (const std::string sched : {"GPipe", "1F1B"}) {
            std::vector<double> m, predicted, virt, real, first;
            for (const auto& r : rows) {
                if (r["stages"].get<int>() != P || r["schedule"].get<std::string>() != sched) continue;
                m.push_back(r["micro_batches"].get<double>());
                predicted.push_back(r["bubble_predicted"].get<double>());
                double v = 0, re = 0;
                for (const auto& x : r["idle_virtual"]) v += x.get<double>() / P;
                for (const auto& x : r["idle_real"]) re += x.get<double>() / P;
                virt.push_back(v);
                real.push_back(re);
                first.push_back(r["max_in_flight"][0].get<double>());
            }
            const std::string tag = sched + " P=" + std::to_string(P);
            const std::string c = strata::io::palette(color++);
            if (sched == "GPipe") idle.add("(P-1)/(M+P-1), P=" + std::to_string(P), m, predicted, "#444444", true);
            idle.add(tag + " virtual clock", m, virt, c);
            idle.add(tag + " real clock (shared 2-vCPU VM)", m, real, c, true);
            held.add(tag, m, first, c);
        }
    fig.panels = {idle, held};
    fig.save(path);
    std::printf("wrote %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Pipeline parallelism: the bubble against (P-1)/(M+P-1), and speed against OneDevice and Mirrored.",
                 "bench_pipeline"};
    int steps = 20;
    std::string json;
    bool bubble_only = false;
    std::string plot;
    app.add_option("--steps", steps, "timed training steps (batch 128) per figure")->transform(cli::integer(1, 100000))->capture_default_str();
    app.add_flag("--bubble-only", bubble_only, "only the bubble table (fast)");
    app.add_option("--json", json, "also write the figures as JSON to FILE");
    app.add_option("--plot", plot, "draw the bubble and the micro-batches held against M as FILE.svg");
    return cli::run(app, argc, argv, [&] {
        const std::string load_before = bench::load_average();
        cli::Json doc;
        doc["benchmark"] = "bench_pipeline";
        doc["machine"] = {{"cpu", bench::cpu_model()}, {"hardware_threads", strata::hardware_threads()}, {"load_before", load_before}};
        doc["steps"] = steps;
        std::printf("bench_pipeline on %s (%d hardware threads), load %s; %d steps of batch 128 per figure\n\n",
                    bench::cpu_model().c_str(), strata::hardware_threads(), load_before.c_str(), steps);
        std::printf("The bubble: Dense 512x4 model, stages balanced by FLOPs, one core per stage; idle = mean over stages\n");
        std::printf("%-6s %3s %3s %12s %14s %12s %14s %10s\n", "sched", "P", "M", "predicted", "virtual idle", "real idle",
                    "max in flight", "images/s");
        cli::Json bubble = cli::Json::array();
        for (int P : {2, 4})
            for (auto schedule : {dist::ScheduleKind::GPipe, dist::ScheduleKind::OneFOneB}) bubble_rows(schedule, P, steps, bubble);
        doc["bubble"] = bubble;
        if (!plot.empty()) bubble_plot(bubble, plot);
        if (!bubble_only) {
            std::printf("\nSpeed at batch 128 (images/s, training)\n");
            cli::Json speed = cli::Json::array();
            speed_rows<Mlp>("dense", steps, speed);
            speed_rows<Cnn>("cnn", steps, speed);
            doc["speed"] = speed;
        }
        doc["machine"]["load_after"] = bench::load_average();
        std::printf("\nload after: %s\n", bench::load_average().c_str());
        if (!json.empty()) bench::write_json(json, doc);
        return 0;
    });
}
