// ps_study: what the relaxed sync modes of ParameterServer buy against stragglers, measured.
//
//   runtime  P = 8 workers, virtual clock, X ~ Exp(1) and X ~ 1 + Exp(1), K in {1, 2, 4, 8},
//            >= 10^4 updates per cell: mean time per update of K-sync, K-batch-sync, K-async and
//            K-batch-async next to the closed forms of Dutta et al. (AISTATS 2018):
//              K-sync         (H_P - H_{P-K}) / mu  (+ Delta)
//              K-batch-sync   K / (P mu)            (Exp only)
//              K-async        (H_P - H_{P-K}) / mu  (Exp only: memoryless residuals)
//              K-batch-async  K E[X] / P
//            and their orderings (K-batch-async <= K-async <= K-sync, K-batch-sync <= K-sync).
//            The gradients are really computed (a tiny softmax regression), on real threads.
//   mnist    the seed CNN on real MNIST, 4 workers with shifted-exponential compute times,
//            every mode: test accuracy against virtual time and against updates.
//   real     real clock, 2 workers, worker 1 four times slower (injected sleep): updates/s of
//            KSync<1> and KBatchSync<2> against Synchronous.
//
//   build/benchmarks/ps_study [--part runtime|mnist|real|all] [--json FILE] [--plot-dir DIR]
#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
#include <strata/train/plot.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace sd = strata::distribute;
namespace ss = strata::sync;
using namespace strata::nn;

namespace {

struct Options {
    std::string part = "all";
    std::string json;
    std::string plot_dir;
    std::string data = "data/mnist";
    std::int64_t updates = 10000;       // runtime: updates per cell
    std::int64_t mnist_updates = 600;   // mnist: updates per mode
    std::int64_t eval_every = 50;       // mnist: updates between test evaluations
    std::int64_t real_updates = 60;     // real: updates per mode
};

// ---- runtime against theory ------------------------------------------------------------------

using Tiny = Sequential<Input<2>, Dense<2, Softmax>>;

double harmonic(int n) {
    double h = 0;
    for (int i = 1; i <= n; ++i) h += 1.0 / i;
    return h;
}

/// Mean virtual seconds per update of one mode on P workers.
template <class Sync>
sd::ParameterServerStats run_tiny(int P, int K, const sd::Stragglers& st, std::int64_t updates, std::uint64_t seed) {
    sd::ParameterServerOptions o{.clock = sd::Clock::Virtual, .stragglers = st, .straggler_seed = seed};
    o.k = K;
    sd::ParameterServer<strata::place::Host, Sync> ps(P, 1, o);
    strata::Model<Tiny, decltype(ps)> model(ps, seed);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 1e-3});
    std::vector<float> x(256 * 2);
    std::vector<std::int32_t> y(256);
    for (std::size_t i = 0; i < 256; ++i) {
        x[2 * i] = float(i % 16) / 16.0f;
        x[2 * i + 1] = float(i / 16) / 16.0f;
        y[i] = std::int32_t((i % 16 + i / 16) % 2);
    }
    auto ds = strata::data::Dataset<>::from_arrays(x, {2}, y).repeat().batch(1);
    model.fit(ds, {.epochs = 1, .steps_per_epoch = updates, .verbose = 0});
    return model.gradient_path().stats();
}

struct RuntimeCell {
    std::string law, mode;
    int K = 0;
    double measured = 0, theory = NAN, reference = NAN;  // reference: a published Monte-Carlo value
    std::int64_t updates = 0, cancelled = 0;
};

cli::Json runtime_part(const Options& opt, std::vector<RuntimeCell>& cells, bool& all_ok) {
    const int P = 8;
    const std::vector<int> ks = {1, 2, 4, 8};
    // Monte-Carlo means for shifted Exp (Delta = 1, mu = 1, P = 8) where no closed form is
    // known, from ../shared/research/sync-modes.md (2*10^5 iterations per cell): shown beside
    // ours, not used as a target.
    const std::map<std::pair<std::string, int>, double> mc_sexp = {
        {{"kbatch_sync", 1}, 1.1250}, {{"kbatch_sync", 2}, 1.2674}, {{"kbatch_sync", 4}, 1.6304}, {{"kbatch_sync", 8}, 2.6697},
        {{"kasync", 1}, 0.2502},      {{"kasync", 2}, 0.5334},      {{"kasync", 4}, 1.2409},      {{"kasync", 8}, 3.7190}};
    std::printf("\n== Runtime per update against theory: P = %d workers, virtual clock, %lld updates per cell ==\n", P,
                (long long)opt.updates);
    std::printf("%-10s %-13s %3s %12s %12s %9s %12s\n", "law", "mode", "K", "measured", "theory", "diff", "Monte-Carlo");
    for (const std::string law : {"exp", "sexp"}) {
        const double delta = law == "exp" ? 0.0 : 1.0;
        const auto st = law == "exp" ? sd::Stragglers::exponential(1.0) : sd::Stragglers::shifted_exponential(1.0, 1.0);
        for (int K : ks)
            for (const std::string mode : {"ksync", "kbatch_sync", "kasync", "kbatch_async"}) {
                sd::ParameterServerStats s;
                const std::uint64_t seed = 1000 + std::uint64_t(K);
                if (mode == "ksync") s = run_tiny<ss::KSync<ss::dynamic>>(P, K, st, opt.updates, seed);
                else if (mode == "kbatch_sync") s = run_tiny<ss::KBatchSync<ss::dynamic>>(P, K, st, opt.updates, seed);
                else if (mode == "kasync") s = run_tiny<ss::KAsync<ss::dynamic>>(P, K, st, opt.updates, seed);
                else s = run_tiny<ss::KBatchAsync<ss::dynamic>>(P, K, st, opt.updates, seed);
                RuntimeCell c{law, mode, K, s.seconds / double(s.updates)};
                c.updates = s.updates;
                c.cancelled = s.cancelled;
                const double order_stat = harmonic(P) - harmonic(P - K);
                if (mode == "ksync") c.theory = delta + order_stat;
                else if (mode == "kbatch_sync" && law == "exp") c.theory = double(K) / P;
                else if (mode == "kasync" && law == "exp") c.theory = order_stat;
                else if (mode == "kbatch_async") c.theory = double(K) * (delta + 1.0) / P;
                if (law == "sexp" && mc_sexp.count({mode, K})) c.reference = mc_sexp.at({mode, K});
                const double diff = std::isnan(c.theory) ? NAN : c.measured / c.theory - 1;
                if (!std::isnan(diff) && std::abs(diff) > 0.03) all_ok = false;
                std::printf("%-10s %-13s %3d %12.4f %12s %9s %12s\n", law == "exp" ? "Exp(1)" : "1+Exp(1)", mode.c_str(), K,
                            c.measured, std::isnan(c.theory) ? "-" : bench::format("%.4f", c.theory).c_str(),
                            std::isnan(diff) ? "-" : bench::format("%+.2f%%", 100 * diff).c_str(),
                            std::isnan(c.reference) ? "-" : bench::format("%.4f", c.reference).c_str());
                cells.push_back(c);
            }
    }
    // The orderings the paper proves (for these new-longer-than-used laws), each up to the 3%
    // measurement tolerance where theory makes two modes equal (K = 1, or Exp for K-async).
    auto at = [&](const std::string& law, const std::string& mode, int K) {
        for (const auto& c : cells)
            if (c.law == law && c.mode == mode && c.K == K) return c.measured;
        return double(NAN);
    };
    cli::Json orderings = cli::Json::array();
    std::printf("\nOrderings (a <= b within 3%%):\n");
    for (const std::string law : {"exp", "sexp"})
        for (int K : ks) {
            const std::vector<std::pair<std::string, std::string>> pairs = {
                {"kbatch_async", "kasync"}, {"kasync", "ksync"}, {"kbatch_sync", "ksync"}};
            for (const auto& [a, b] : pairs) {
                const double va = at(law, a, K), vb = at(law, b, K);
                const bool ok = va <= vb * 1.03;
                if (!ok) all_ok = false;
                std::printf("  %-5s K=%d  %-13s %.4f <= %-13s %.4f  %s\n", law.c_str(), K, a.c_str(), va, b.c_str(), vb, ok ? "yes" : "NO");
                orderings.push_back({{"law", law}, {"K", K}, {"a", a}, {"b", b}, {"a_seconds", va}, {"b_seconds", vb}, {"holds", ok}});
            }
        }
    std::printf("every closed form within 3%% and every ordering holds: %s\n", all_ok ? "yes" : "NO");

    cli::Json rows = cli::Json::array();
    for (const auto& c : cells)
        rows.push_back({{"law", c.law}, {"mode", c.mode}, {"K", c.K}, {"workers", P}, {"updates", c.updates},
                        {"cancelled", c.cancelled}, {"seconds_per_update", c.measured}, {"theory", cli::finite_or_null(c.theory)},
                        {"monte_carlo_reference", cli::finite_or_null(c.reference)}});
    return {{"workers", P}, {"updates_per_cell", opt.updates}, {"cells", rows}, {"orderings", orderings}, {"all_within_3_percent", all_ok}};
}

void runtime_plot(const std::vector<RuntimeCell>& cells, const std::string& path) {
    strata::io::Figure fig;
    for (const std::string law : {"exp", "sexp"}) {
        strata::io::LinePlot p;
        p.title = law == "exp" ? "X ~ Exp(1), P = 8" : "X ~ 1 + Exp(1), P = 8";
        p.x_label = "K (log scale)";
        p.y_label = "mean time per update";
        p.x_scale = strata::io::Scale::Log;
        p.width = 620;
        p.height = 460;
        for (const std::string mode : {"ksync", "kbatch_sync", "kasync", "kbatch_async"}) {
            std::vector<double> x, y, tx, ty;
            for (const auto& c : cells)
                if (c.law == law && c.mode == mode) {
                    x.push_back(c.K);
                    y.push_back(c.measured);
                    if (!std::isnan(c.theory)) {
                        tx.push_back(c.K);
                        ty.push_back(c.theory);
                    }
                }
            const auto color = strata::io::palette(p.series.size() / 2);
            p.add(mode + " (measured)", x, y, color);
            p.add(mode + " (theory)", tx, ty, color, true);
        }
        fig.panels.push_back(p);
    }
    fig.save(path);
    std::printf("wrote %s\n", path.c_str());
}

// ---- the seed CNN on MNIST -----------------------------------------------------------------

using Cnn = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>, MaxPooling2D<2>, Conv2D<64, 3, ReLU>, MaxPooling2D<2>, Flatten,
                       Dense<64, ReLU>, Dense<10, Softmax>>;

struct Curve {
    std::string mode;
    std::vector<double> seconds, updates, accuracy;
    sd::ParameterServerStats stats;
};

template <class Sync>
Curve run_mnist(const std::string& name, sd::ParameterServerOptions o, const strata::data::Mnist& mnist, const Options& opt) {
    sd::ParameterServer<strata::place::Host, Sync> ps(4, 2, o);
    strata::Model<Cnn, decltype(ps)> model(ps, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    const auto& tr = mnist.train;
    const auto& te = mnist.test;
    auto train = strata::data::Dataset<>::from_arrays(tr.images.data, {28, 28, 1}, tr.labels.data).shuffle(10000, 7).batch(64);
    auto test = strata::data::Dataset<>::from_arrays(te.images.data, {28, 28, 1}, te.labels.data).batch(1000);
    Curve c;
    c.mode = name;
    const int epochs = int((opt.mnist_updates + opt.eval_every - 1) / opt.eval_every);
    // An "epoch" here is eval_every updates: the test set is evaluated between epochs (mini-batches
    // in flight then are cancelled, so evaluation sees a quiet model).
    const auto h = model.fit(train, {.epochs = epochs, .steps_per_epoch = opt.eval_every, .validation_data = test, .verbose = 0});
    double t = 0, u = 0;
    for (std::size_t e = 0; e < h["val_accuracy"].size(); ++e) {
        t += h["seconds"][e];
        u += h["updates"][e];
        c.seconds.push_back(t);
        c.updates.push_back(u);
        c.accuracy.push_back(h["val_accuracy"][e]);
    }
    c.stats = model.gradient_path().stats();
    std::printf("%-14s %8lld %10.3f %10lld %10lld %8lld %9.2f   %s\n", name.c_str(), (long long)c.stats.updates, c.stats.seconds,
                (long long)c.stats.gradients, (long long)c.stats.cancelled, (long long)c.stats.staleness_max,
                100 * c.accuracy.back(), bench::format("%.4f s/update", c.stats.seconds / double(c.stats.updates)).c_str());
    std::fflush(stdout);
    return c;
}

cli::Json mnist_part(const Options& opt, std::vector<Curve>& curves) {
    const auto mnist = strata::data::load_mnist(opt.data);
    sd::ParameterServerOptions o{.clock = sd::Clock::Virtual, .stragglers = sd::Stragglers::shifted_exponential(0.010, 0.020),
                                 .straggler_seed = 5};
    std::printf("\n== The seed CNN on MNIST: 4 workers, 2 servers, mini-batch 64, RMSprop(1e-3), compute time 10 ms + Exp(mean 20 ms), "
                "virtual clock, %lld updates ==\n",
                (long long)opt.mnist_updates);
    std::printf("%-14s %8s %10s %10s %10s %8s %9s\n", "mode", "updates", "seconds", "gradients", "cancelled", "stale", "test acc");
    curves.push_back(run_mnist<ss::Synchronous>("sync", o, mnist, opt));
    o.k = 2;
    curves.push_back(run_mnist<ss::KSync<ss::dynamic>>("ksync K=2", o, mnist, opt));
    curves.push_back(run_mnist<ss::KBatchSync<ss::dynamic>>("kbatch_sync K=2", o, mnist, opt));
    curves.push_back(run_mnist<ss::KAsync<ss::dynamic>>("kasync K=2", o, mnist, opt));
    curves.push_back(run_mnist<ss::KBatchAsync<ss::dynamic>>("kbatch_async K=2", o, mnist, opt));
    o.k = 0;
    curves.push_back(run_mnist<ss::Asynchronous<ss::dynamic>>("async", o, mnist, opt));
    cli::Json rows = cli::Json::array();
    for (const auto& c : curves)
        rows.push_back({{"mode", c.mode}, {"virtual_seconds", c.seconds}, {"updates", c.updates}, {"test_accuracy", c.accuracy},
                        {"gradients", c.stats.gradients}, {"cancelled", c.stats.cancelled}, {"staleness_max", c.stats.staleness_max},
                        {"staleness_mean", c.stats.staleness_mean()}});
    return {{"workers", 4}, {"servers", 2}, {"batch_per_worker", 64}, {"optimizer", "RMSprop(1e-3)"},
            {"compute_time", "0.010 s + Exp(mean 0.020 s)"}, {"eval_every_updates", opt.eval_every}, {"curves", rows}};
}

void mnist_plot(const std::vector<Curve>& curves, const std::string& path) {
    strata::io::LinePlot by_time, by_updates;
    by_time.title = "test accuracy against virtual time";
    by_time.x_label = "virtual seconds";
    by_time.y_label = "test accuracy";
    by_updates.title = "test accuracy against updates";
    by_updates.x_label = "updates";
    by_updates.y_label = "test accuracy";
    for (const auto& c : curves) {
        by_time.add(c.mode, c.seconds, c.accuracy);
        by_updates.add(c.mode, c.updates, c.accuracy);
    }
    strata::io::Figure fig;
    fig.panels = {by_time, by_updates};
    fig.save(path);
    std::printf("wrote %s\n", path.c_str());
}

// ---- real clock --------------------------------------------------------------------------------

template <class Sync>
double real_updates_per_second(int K, const Options& opt, sd::ParameterServerStats& s) {
    sd::ParameterServerOptions o{.clock = sd::Clock::Real, .stragglers = sd::Stragglers::slow(1, 4.0)};
    o.k = K;
    sd::ParameterServer<strata::place::Host, Sync> ps(2, 1, o);
    strata::Model<Cnn, decltype(ps)> model(ps, 1);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.01});
    const std::size_t n = 2048;
    std::vector<float> x(n * 784);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 1000) / 1000.0f;
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t(i % 10);
    auto ds = strata::data::Dataset<>::from_arrays(x, {28, 28, 1}, y).repeat().batch(32);
    model.fit(ds, {.epochs = 1, .steps_per_epoch = opt.real_updates, .verbose = 0});
    s = model.gradient_path().stats();
    return double(s.updates) / s.seconds;
}

cli::Json real_part(const Options& opt, bool& all_ok) {
    std::printf("\n== Real clock: 2 workers, worker 1 four times slower (sleeps 3x its compute), seed CNN, mini-batch 32, %lld updates ==\n",
                (long long)opt.real_updates);
    sd::ParameterServerStats s0, s1, s2;
    const double sync_rate = real_updates_per_second<ss::Synchronous>(0, opt, s0);
    const double ksync_rate = real_updates_per_second<ss::KSync<ss::dynamic>>(1, opt, s1);
    const double kbatch_rate = real_updates_per_second<ss::KBatchSync<ss::dynamic>>(2, opt, s2);
    std::printf("%-16s %12s %10s %10s %10s\n", "mode", "updates/s", "vs sync", "cancelled", "dropped");
    auto row = [](const char* name, double rate, double base, const sd::ParameterServerStats& s) {
        std::printf("%-16s %12.2f %9.2fx %10lld %10lld\n", name, rate, rate / base, (long long)s.cancelled, (long long)s.dropped);
    };
    row("sync", sync_rate, sync_rate, s0);
    row("ksync K=1", ksync_rate, sync_rate, s1);
    row("kbatch_sync K=2", kbatch_rate, sync_rate, s2);
    const bool ok = ksync_rate >= 1.6 * sync_rate && kbatch_rate >= 1.6 * sync_rate;
    if (!ok) all_ok = false;
    std::printf("target KSync<1> and KBatchSync<2> >= 1.6x Synchronous: %s\n", ok ? "met" : "NOT met");
    return {{"workers", 2}, {"straggler", "slow:1:4"}, {"batch_per_worker", 32}, {"updates", opt.real_updates},
            {"sync_updates_per_second", sync_rate}, {"ksync1_updates_per_second", ksync_rate},
            {"kbatch_sync2_updates_per_second", kbatch_rate}, {"ksync1_vs_sync", ksync_rate / sync_rate},
            {"kbatch_sync2_vs_sync", kbatch_rate / sync_rate}, {"target_met", ok}};
}

int run(const Options& opt) {
    bench::Machine machine;
    machine.hardware_threads = strata::hardware_threads();
    cli::Json doc = {{"benchmark", "ps_study"}};
    bool all_ok = true;
    if (opt.part == "runtime" || opt.part == "all") {
        std::vector<RuntimeCell> cells;
        doc["runtime"] = runtime_part(opt, cells, all_ok);
        if (!opt.plot_dir.empty()) runtime_plot(cells, opt.plot_dir + "/ps_runtime.svg");
    }
    if (opt.part == "mnist" || opt.part == "all") {
        std::vector<Curve> curves;
        doc["mnist"] = mnist_part(opt, curves);
        if (!opt.plot_dir.empty()) mnist_plot(curves, opt.plot_dir + "/ps_mnist.svg");
    }
    if (opt.part == "real" || opt.part == "all") doc["real_clock"] = real_part(opt, all_ok);
    machine.load_after = bench::load_average();
    doc["machine"] = machine.json();
    doc["targets_met"] = all_ok;
    if (!opt.json.empty()) bench::write_json(opt.json, doc);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"ParameterServer sync modes against stragglers: runtime vs theory, MNIST accuracy vs time, real clock.", "ps_study"};
    Options opt;
    app.add_option("--part", opt.part, "which study")->check(cli::one_of({"runtime", "mnist", "real", "all"}))->capture_default_str();
    app.add_option("--json", opt.json, "also write the figures as JSON to FILE");
    app.add_option("--plot-dir", opt.plot_dir, "write ps_runtime.svg and ps_mnist.svg into DIR");
    app.add_option("--data", opt.data, "MNIST directory (scripts/fetch-mnist DIR)")->capture_default_str();
    app.add_option("--updates", opt.updates, "runtime: updates per cell")->transform(cli::integer<std::int64_t>(100, 100'000'000))->capture_default_str();
    app.add_option("--mnist-updates", opt.mnist_updates, "mnist: updates per mode")
        ->transform(cli::integer<std::int64_t>(1, 1'000'000))->capture_default_str();
    app.add_option("--eval-every", opt.eval_every, "mnist: updates between test evaluations")
        ->transform(cli::integer<std::int64_t>(1, 1'000'000))->capture_default_str();
    app.add_option("--real-updates", opt.real_updates, "real: updates per mode")
        ->transform(cli::integer<std::int64_t>(1, 1'000'000))->capture_default_str();
    return cli::run(app, argc, argv, [&] { return run(opt); });
}
