// precision_underflow: why float16 needs a loss scale, measured. The seed CNN is trained in
// float32 for --train-steps steps on MNIST (the gradients shrink as the loss falls); then one
// batch's gradient is computed under float32, mixed_bfloat16, and mixed_float16 with the loss
// scale at 1 (no scale) and at 2^15 (the loss scale's start), and each variable's gradient is
// compared with float32's: the share of its elements that are exactly zero where float32's are
// not (flushed), and its relative error ||g - g32|| / ||g32||.
//
//   build/benchmarks/precision_underflow [--data data/mnist] [--train-steps 300] [--batch 128]
//                                        [--json FILE]
//
// Without MNIST files in --data it uses synthetic images of MNIST's shape (and says so).
#include <strata/strata.hpp>

#include "../tools/mnist_cnn_net.hpp"
#include "bench_common.hpp"
#include "step_timing.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

struct Options {
    std::string data = "data/mnist";
    int train_steps = 300;
    std::int64_t batch = 128;
    std::string json;
};

using Net = mnist_example::Net;
namespace prec = strata::precision;

struct Setting {
    const char* name;
    prec::Compute compute;
    double scale;
};

// One batch's gradient (divided back by `scale`) under `compute`, from weights `w`.
std::vector<double> gradient(const std::vector<float>& w, std::vector<float> x, const std::vector<float>& y, prec::Compute compute,
                             double scale) {
    strata::nn::Network<Net, float, strata::place::Host> net;
    const std::int64_t n = std::int64_t(y.size());
    std::vector<float> g(w.size(), 0.f);
    const strata::nn::Mode mode{.training = true, .skip_activation = true, .compute = compute};
    auto out = net.forward(w.data(), strata::TensorView<float>(x.data(), strata::Shape{n, 28, 28, 1}), mode);
    std::vector<float> target = y;
    strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::SparseCategoricalCrossentropy{}}, out,
                                strata::TensorView<float>(target.data(), strata::Shape{n}), net.output_grad(), double(n) / scale,
                                strata::loss::Input::Logits);
    net.backward(w.data(), g.data(), mode);
    std::vector<double> d(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) d[i] = double(g[i]) / scale;
    return d;
}

int run(const Options& o) {
    auto [real, train_x, test_x, train_y, test_y] = bench::mnist_or_synthetic(o.data, 6000, 1000);
    strata::Model<Net, strata::distribute::Default, prec::Float32> model(1);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{});
    if (o.train_steps > 0) {
        auto train = strata::data::Dataset<>::from_arrays(train_x, {28, 28, 1}, train_y).shuffle(10000, 42).batch(std::size_t(o.batch)).repeat();
        model.fit(train, {.epochs = 1, .steps_per_epoch = o.train_steps, .verbose = 0});
    }
    const auto w = model.get_weights();
    const std::size_t n = std::size_t(o.batch);
    std::vector<float> x(test_x.begin(), test_x.begin() + std::ptrdiff_t(n * 784));
    std::vector<float> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = float(test_y[i]);

    const Setting settings[] = {{"mixed_bfloat16", prec::Compute::BFloat16, 1},
                                {"mixed_float16, no loss scale", prec::Compute::Float16, 1},
                                {"mixed_float16, loss scale 2^15", prec::Compute::Float16, 32768}};
    const auto g32 = gradient(w, x, y, prec::Compute::Float32, 1);
    std::printf("precision_underflow: the seed CNN after %d float32 steps (RMSprop, batch %lld) on %s; one batch's gradient\n",
                o.train_steps, (long long)o.batch, real ? "MNIST" : "synthetic images (no MNIST files in --data)");
    std::printf("%-24s %10s | %-32s %12s %12s\n", "variable", "|g32| rms", "policy", "flushed", "rel. error");
    cli::Json rows;  // an array (push_back makes it one)
    const auto params = Net::parameters();
    std::vector<std::vector<double>> grads;
    for (const auto& s : settings) grads.push_back(gradient(w, x, y, s.compute, s.scale));
    for (const auto& p : params) {
        const auto first = std::size_t(p.offset), count = std::size_t(p.shape.size());
        double ss32 = 0;
        std::size_t nonzero32 = 0;
        for (std::size_t i = first; i < first + count; ++i) {
            ss32 += g32[i] * g32[i];
            nonzero32 += g32[i] != 0;
        }
        for (std::size_t k = 0; k < std::size(settings); ++k) {
            double ssd = 0;
            std::size_t flushed = 0;
            for (std::size_t i = first; i < first + count; ++i) {
                const double d = grads[k][i] - g32[i];
                ssd += d * d;
                flushed += g32[i] != 0 && grads[k][i] == 0;
            }
            const double share = nonzero32 ? double(flushed) / double(nonzero32) : 0.0;
            const double rel = ss32 > 0 ? std::sqrt(ssd / ss32) : 0.0;
            char rms[32] = "";
            if (k == 0) std::snprintf(rms, sizeof rms, "%.3g", std::sqrt(ss32 / double(count)));
            std::printf("%-24s %10s | %-32s %11.1f%% %12.3g\n", k == 0 ? p.name.c_str() : "", rms, settings[k].name, 100 * share, rel);
            if (k > 0 && k + 1 == std::size(settings)) std::printf("\n");
            cli::Json r;
            r["variable"] = p.name;
            r["policy"] = std::string(settings[k].name);
            r["rms_float32"] = std::sqrt(ss32 / double(count));
            r["flushed_share"] = share;
            r["relative_error"] = rel;
            rows.push_back(r);
        }
    }
    if (!o.json.empty()) {
        cli::Json j;
        j["benchmark"] = "precision_underflow";
        j["data"] = real ? "mnist" : "synthetic";
        j["train_steps"] = o.train_steps;
        j["batch"] = o.batch;
        j["rows"] = rows;
        bench::write_json(o.json, j);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Why float16 needs a loss scale: one batch's gradient under each precision against float32.",
                 "precision_underflow"};
    Options o;
    app.add_option("--data", o.data, "MNIST directory (synthetic images when its files are missing)")->capture_default_str();
    app.add_option("--train-steps", o.train_steps, "float32 training steps before the gradient is taken")
        ->transform(cli::integer(0, 1000000))->capture_default_str();
    app.add_option("--batch", o.batch, "batch size")->transform(cli::integer<std::int64_t>(1, 10000))->capture_default_str();
    app.add_option("--json", o.json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] { return run(o); });
}
