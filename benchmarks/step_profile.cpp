// step_profile: where a training step and an inference pass of a model spend their time: the
// seed CNN (--model cnn, the default), strata_train's resnet (--model resnet: a ResNet with
// batch normalization) or its vit (--model vit: a Vision Transformer; tools/strata_train_models.hpp).
//
// Compiled with STRATA_PROFILE=1 (strata/core/profile.hpp), so the library's probes record the
// time of every layer's forward and backward (the backward split into the activation's
// gradient, the weight gradient and the data gradient), the loss, the metrics, the optimizer
// update and the input pipeline. Each phase is printed beside its FLOPs and its fraction of
// the sgemm ceiling, measured in the same run: strata::gemm on a 2048 x 2048 x 2048 product
// with the same threads (the fastest square product the BLAS gives strata here).
//
//   build/benchmarks/step_profile --data data/mnist --batch 128 --steps 100 --reps 5 --json p.json
//   build/benchmarks/step_profile --model resnet --data data/fashion_mnist --steps 40 --reps 3
//
// Three tables: the training step (fit on MNIST, shuffled, batched, prefetched, as
// tools/mnist_cnn trains), inference (evaluate on the 10 000 test images, batch 1000), and
// the first step of a new model against a steady one. Each figure is the median over --reps
// samples; a sample is --steps steps (training) or one pass over the test set (inference).
// Without MNIST files (--data), synthetic images of the same shape are used and the table says
// so. The probes cost a few clock reads per layer and step: the totals are within a percent of
// a build without them (tools/mnist_cnn reports those).
#define STRATA_PROFILE 1
#include <strata/strata.hpp>

#include "bench_common.hpp"
#include "step_timing.hpp"
#include "../tools/strata_train_models.hpp"

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace {

struct Options {
    std::string model = "cnn";
    std::string data = "data/mnist";
    std::int64_t batch = 128;
    std::int64_t eval_batch = 1000;
    int threads = 0;
    int steps = 100;
    int reps = 5;
    std::string json;
};

// FLOPs of one example through a layer's phases (2 per multiply-add); 0 for layers that only
// move data (pooling, flatten), whose cost is memory traffic.
struct PhaseFlops {
    double forward = 0, weights = 0, data = 0;
};

template <class L>
PhaseFlops layer_flops(bool first);

// A residual block's: the sum of its inner layers' (the first of them sees the block's input).
template <class Inner, std::size_t... I>
PhaseFlops inner_flops(bool first, std::index_sequence<I...>) {
    PhaseFlops sum;
    ((sum.forward += layer_flops<std::tuple_element_t<I, Inner>>(first).forward,
      sum.weights += layer_flops<std::tuple_element_t<I, Inner>>(first).weights,
      sum.data += layer_flops<std::tuple_element_t<I, Inner>>(first).data), ...);
    return sum;
}

template <class L>
PhaseFlops layer_flops(bool first) {
    PhaseFlops f;
    if constexpr (requires { typename L::inner_layers; }) {
        using Inner = typename L::inner_layers;
        return inner_flops<Inner>(first, std::make_index_sequence<std::tuple_size_v<Inner>>{});
    } else if constexpr (requires { L::patch; L::filters; }) {  // Conv2D: one patch · kernel product per output pixel
        const double pixels = double(L::output_shape::size / L::filters);
        f.forward = 2.0 * pixels * double(L::patch) * double(L::filters);
        f.weights = f.forward;
        f.data = first ? 0.0 : f.forward;
    } else if constexpr (requires { L::inputs; L::kernel_size; }) {  // Dense
        f.forward = 2.0 * double(L::kernel_size);
        f.weights = f.forward;
        f.data = first ? 0.0 : f.forward;
    }
    return f;
}

template <class Layers, std::size_t... I>
std::vector<PhaseFlops> all_flops(std::index_sequence<I...>) {
    return {layer_flops<std::tuple_element_t<I, Layers>>(I == 0)...};
}

// The FLOPs of one example in a row's phase.
double row_flops(const std::vector<PhaseFlops>& flops, const std::vector<std::string>& names, const std::string& group,
                 const std::string& phase) {
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (names[i] != group) continue;
        if (phase == "forward" || phase == "forward.gemm") return flops[i].forward;
        if (phase == "backward") return flops[i].weights + flops[i].data;
        if (phase == "backward.weights") return flops[i].weights;
        if (phase == "backward.data") return flops[i].data;
    }
    return 0;
}

// The sgemm ceiling: strata::gemm on a square product with this run's threads, best of reps.
double sgemm_ceiling_gflops(int reps) {
    constexpr std::int64_t s = 2048;
    strata::Tensor<float> a({s, s}), b({s, s}), c({s, s});
    for (std::int64_t i = 0; i < a.size(); ++i) {
        a.data()[i] = float(i % 17) * 0.01f;
        b.data()[i] = float(i % 13) * 0.01f;
    }
    strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view());
    double best = 1e30;
    for (int r = 0; r < std::max(reps, 3); ++r) {
        const auto t0 = bench::Clock::now();
        strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view());
        best = std::min(best, bench::seconds_since(t0));
    }
    return 2.0 * double(s) * double(s) * double(s) / best * 1e-9;
}

// A table row: a phase's median seconds per step (or per pass).
struct Line {
    std::string group, phase;
    std::vector<double> samples;  // seconds per step, one per rep
    double flops = 0;             // per step (per pass)
};

void add_sample(std::vector<Line>& lines, const std::vector<strata::profile::Row>& rows, double per) {
    for (const auto& r : rows) {
        auto it = std::find_if(lines.begin(), lines.end(), [&](const Line& l) { return l.group == r.group && l.phase == r.phase; });
        if (it == lines.end()) {
            lines.push_back({r.group, r.phase, {}, 0});
            it = lines.end() - 1;
        }
        it->samples.push_back(r.seconds / per);
    }
}

// Top-level rows (a layer's forward or backward, and the model's phases) add up to the step;
// the dotted ones are parts of their layer's backward or forward.
bool top_level(const Line& l) { return l.phase.find('.') == std::string::npos; }

cli::Json print_table(const char* title, std::vector<Line>& lines, double total_s, double examples, double ceiling_gflops) {
    std::printf("\n%s\n", title);
    std::printf("%-16s %-30s %10s %7s %12s %9s %10s\n", "group", "phase", "ms", "share", "MFLOP", "GFLOP/s", "of ceiling");
    double accounted = 0;
    cli::Json rows = cli::Json::array();
    for (auto& l : lines) {
        const double s = bench::median(l.samples);
        const double gf = l.flops > 0 && s > 0 ? l.flops / s * 1e-9 : 0;
        if (top_level(l)) accounted += s;
        const std::string phase = top_level(l) ? l.phase : "  " + l.phase;
        std::printf("%-16s %-30s %10.3f %6.1f%% %12s %9s %10s\n", l.group.c_str(), phase.c_str(), s * 1e3, 100.0 * s / total_s,
                    l.flops > 0 ? bench::format("%.1f", l.flops * 1e-6).c_str() : "",
                    gf > 0 ? bench::format("%.1f", gf).c_str() : "", gf > 0 ? bench::format("%.1f%%", 100 * gf / ceiling_gflops).c_str() : "");
        rows.push_back({{"group", l.group}, {"phase", l.phase}, {"ms", s * 1e3}, {"share", s / total_s},
                        {"mflop", l.flops * 1e-6}, {"gflops", gf}, {"fraction_of_ceiling", gf / ceiling_gflops}});
    }
    double total_flops = 0;
    for (const auto& l : lines)
        if (top_level(l)) total_flops += l.flops;
    const double other = total_s - accounted;
    std::printf("%-16s %-30s %10.3f %6.1f%%\n", "", "(not in a probe)", other * 1e3, 100.0 * other / total_s);
    const double gf = total_flops / total_s * 1e-9;
    std::printf("%-16s %-30s %10.3f %6.1f%% %12.1f %9.1f %9.1f%%\n", "total", "", total_s * 1e3, 100.0, total_flops * 1e-6, gf,
                100 * gf / ceiling_gflops);
    std::printf("images/s: %.0f\n", examples / total_s);
    return {{"rows", rows},
            {"unprobed_ms", other * 1e3},
            {"total_ms", total_s * 1e3},
            {"mflop", total_flops * 1e-6},
            {"gflops", gf},
            {"fraction_of_ceiling", gf / ceiling_gflops},
            {"images_per_second", examples / total_s}};
}

template <class Net>
int run(const Options& o, const char* what) {
    using Layers = typename Net::template bound_layers<float, strata::place::Host>;
    strata::set_num_threads(o.threads);
    const int threads = strata::num_threads();
    bench::Machine machine;
    machine.hardware_threads = strata::hardware_threads();

    // Data: MNIST when present, else synthetic images of its shape.
    auto [real, train_x, test_x, train_y, test_y] = bench::mnist_or_synthetic(o.data, 60000, 10000);
    auto train = strata::data::Dataset<>::from_arrays(train_x, {28, 28, 1}, train_y)
                     .shuffle(10000, 42)
                     .batch(std::size_t(o.batch))
                     .prefetch(2)
                     .repeat();
    auto test = strata::data::Dataset<>::from_arrays(test_x, {28, 28, 1}, test_y).batch(std::size_t(o.eval_batch));

    const double ceiling = sgemm_ceiling_gflops(o.reps);
#if defined(STRATA_BLAS_OPENBLAS)
    const std::string blas_core = strata::detail::openblas_get_corename();
#else
    const std::string blas_core = "not OpenBLAS";
#endif
    machine.extra.push_back({"openblas_core", blas_core});
    std::printf("step profile: %s, RMSprop, sparse cross-entropy; %s\n", what,
                real ? "the IDX files in --data" : "synthetic images (no IDX files in --data)");
    std::printf("cpu: %s, %d hardware threads; threads: %d; load average before: %s\n", machine.cpu.c_str(),
                int(machine.hardware_threads), threads, machine.load_before.c_str());
    std::printf("sgemm ceiling (strata::gemm 2048^3, best of %d, same threads, OpenBLAS kernels '%s'): %.1f GFLOP/s\n",
                std::max(o.reps, 3), blas_core.c_str(), ceiling);

    strata::distribute::OneDevice<> strategy(threads);
    const auto names = Net::layer_names();
    const auto flops = all_flops<Layers>(std::make_index_sequence<Net::num_layers>{});

    // First step of a new model, then steady steps.
    strata::Model<Net, decltype(strategy)> model(strategy, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    auto it = train.iterate(0);
    const auto& first_batch = *it;
    // What fit does before its first step: allocate and touch the buffers of a batch.
    auto t0 = bench::Clock::now();
    model.build(o.batch);
    const double build = bench::seconds_since(t0);
    strata::profile::reset();
    t0 = bench::Clock::now();
    model.train_step(first_batch);
    const double first_step = bench::seconds_since(t0);
    std::vector<Line> first_lines;
    add_sample(first_lines, strata::profile::rows(), 1.0);
    for (auto& l : first_lines) l.flops = double(o.batch) * row_flops(flops, names, l.group, l.phase);
    std::vector<double> steady;
    for (int i = 0; i < 2 * o.reps + 1; ++i) {
        t0 = bench::Clock::now();
        model.train_step(first_batch);
        steady.push_back(bench::seconds_since(t0));
    }
    const double steady_step = bench::median(steady);

    // Training: reps samples of `steps` steps through fit.
    std::vector<Line> train_lines;
    std::vector<double> train_totals;
    for (int r = 0; r <= o.reps; ++r) {  // sample 0 warms up and is dropped
        strata::profile::reset();
        t0 = bench::Clock::now();
        model.fit(train, {.epochs = 1, .steps_per_epoch = o.steps, .verbose = 0});
        const double s = bench::seconds_since(t0);
        if (r == 0) continue;
        train_totals.push_back(s / o.steps);
        add_sample(train_lines, strata::profile::rows(), o.steps);
    }
    for (auto& l : train_lines) l.flops = double(o.batch) * row_flops(flops, names, l.group, l.phase);

    // Inference: reps passes of evaluate over the test set.
    std::vector<Line> eval_lines;
    std::vector<double> eval_totals;
    const double test_n = double(test_x.size() / 784);
    for (int r = 0; r <= o.reps; ++r) {
        strata::profile::reset();
        t0 = bench::Clock::now();
        model.evaluate(test);
        const double s = bench::seconds_since(t0);
        if (r == 0) continue;
        eval_totals.push_back(s);
        add_sample(eval_lines, strata::profile::rows(), 1.0);
    }
    for (auto& l : eval_lines) l.flops = test_n * row_flops(flops, names, l.group, l.phase);

    cli::Json doc;
    doc["benchmark"] = "step_profile";
    doc["model"] = o.model;
    doc["data"] = real ? "mnist" : "synthetic";
    doc["threads"] = threads;
    doc["batch"] = o.batch;
    doc["eval_batch"] = o.eval_batch;
    doc["steps"] = o.steps;
    doc["reps"] = o.reps;
    doc["sgemm_ceiling_gflops"] = ceiling;
    doc["training"] = print_table(bench::format("training step, batch %lld (per step; median of %d samples of %d steps)",
                                                (long long)o.batch, o.reps, o.steps).c_str(),
                                  train_lines, bench::median(train_totals), double(o.batch), ceiling);
    doc["inference"] = print_table(bench::format("inference: evaluate on %.0f images, batch %lld (per pass; median of %d)",
                                                 test_n, (long long)o.eval_batch, o.reps).c_str(),
                                   eval_lines, bench::median(eval_totals), test_n, ceiling);
    doc["first_step"] = print_table("the first step of a new model (one sample)", first_lines, first_step, double(o.batch), ceiling);
    std::printf("\nModel::build(%lld) before it: %.3f ms. First step of a new model: %.3f ms; steady step (same batch, "
                "median of %d): %.3f ms; ratio %.2f\n",
                (long long)o.batch, build * 1e3, first_step * 1e3, 2 * o.reps + 1, steady_step * 1e3, first_step / steady_step);
    doc["build_ms"] = build * 1e3;
    doc["first_step_ms"] = first_step * 1e3;
    doc["steady_step_ms"] = steady_step * 1e3;
    doc["first_over_steady"] = first_step / steady_step;
    machine.load_after = bench::load_average();
    std::printf("load average after: %s\n", machine.load_after.c_str());
    doc["machine"] = machine.json();
    if (!o.json.empty()) bench::write_json(o.json, doc);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Where a training step and an inference pass of a model spend their time."};
    Options o;
    app.add_option("--model", o.model, "cnn (the seed CNN), resnet (strata_train's, with batch normalization) or vit "
                                       "(strata_train's Vision Transformer)")
        ->check(cli::one_of({"cnn", "resnet", "vit"}))
        ->capture_default_str();
    app.add_option("--data", o.data, "directory with the MNIST IDX files (synthetic images when absent)")->capture_default_str();
    app.add_option("--batch", o.batch, "training batch size")->transform(cli::integer(std::int64_t(1), std::int64_t(1) << 20))->capture_default_str();
    app.add_option("--eval-batch", o.eval_batch, "inference batch size")->transform(cli::integer(std::int64_t(1), std::int64_t(1) << 20))->capture_default_str();
    app.add_option("--threads", o.threads, "threads (0: all)")->transform(cli::integer(0, 4096))->capture_default_str();
    app.add_option("--steps", o.steps, "training steps per sample")->transform(cli::integer(1, 1 << 20))->capture_default_str();
    app.add_option("--reps", o.reps, "samples; medians are reported")->transform(cli::integer(1, 1000))->capture_default_str();
    app.add_option("--json", o.json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] {
        if (o.model == "resnet") return run<strata_train::ResNet::Net>(o, "strata_train's resnet (tools/strata_train_models.hpp)");
        if (o.model == "vit") return run<strata_train::ViT::Net>(o, "strata_train's vit (tools/strata_train_models.hpp)");
        return run<mnist_example::Net>(o, "the seed CNN (tools/mnist_cnn_net.hpp)");
    });
}
