// bench_gemm: single-precision GEMM through strata's tensor API (strata::gemm on
// strata::Tensor views) against cblas_sgemm called directly on the same buffers.
//
// "direct" is what a program calling the BLAS itself gets: cblas_sgemm with the BLAS's own
// thread pool at the full thread budget. "strata" is strata::gemm with whatever threading it
// chooses (today: C split over its OpenMP team, one single-threaded BLAS call per block). Both
// run the same BLAS kernels, so the ratio shows what strata's layer (checks, threading) costs or
// gains; C agrees to float rounding (bit for bit when both split the work the same way). Shapes: square matrices, the GEMMs of the ViT, and the GEMMs of the MNIST
// CNN's training step at batch 128 (im2col forward, and the two backward GEMMs of each layer:
// the weight gradient dW = X^T dY and the input gradient dX = dY W^T).
//
//   build/benchmarks/bench_gemm [--threads N] [--reps N] [--warmup N] [--min-time S]
//                               [--pause S] [--only NAME] [--json FILE]
//
// Each figure is the median over --reps samples; a sample times enough back-to-back calls to
// last at least --min-time seconds (small GEMMs are too short to time one by one). strata and
// direct samples alternate, so a slow spell of the machine hits both.
// Only the tensor core: the benchmark measures it and nothing else (and compiles faster).
#include <strata/tensor/tensor_all.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using bench::Clock;

struct Options : bench::SamplingOptions {
    Options() : SamplingOptions(0.05) {}
    double pause = 0.15;
    std::string only;
    std::string json;
};

/// Declares the flags on `app`, with their ranges.
void declare_flags(CLI::App& app, Options& o) {
    o.declare(app, "threads for the BLAS and strata's host ops (strata::set_num_threads; 0: all)");
    app.add_option("--pause", o.pause, "idle seconds before each sample, so the other side's threads settle")
        ->check(cli::number(0, 3600))->capture_default_str();
    app.add_option("--only", o.only, "run only rows whose name contains NAME (e.g. conv2, square)");
    app.add_option("--json", o.json, "also write the figures as JSON to FILE");
}

std::string blas_config() {
#if defined(STRATA_BLAS_OPENBLAS)
    return openblas_get_config();
#else
    return "CBLAS (not OpenBLAS)";
#endif
}

// OpenBLAS 0.3.21 (Debian 12) does not know recent Xeons (e.g. family 6 model 207) and falls
// back to its generic "Prescott" SSE3 kernels, several times slower than its AVX-512 ones. The
// choice is made when the library loads, so only the environment can change it.
std::string blas_warning() {
#if defined(STRATA_BLAS_OPENBLAS) && (defined(__x86_64__) || defined(__i386__))
    const std::string core = openblas_get_corename();
    const bool generic = core == "Prescott" || core == "prescott" || core == "Core2" || core == "core2" || core == "Nehalem";
    if (generic && __builtin_cpu_supports("avx512f"))
        return "OpenBLAS runs its generic '" + core + "' kernels on a CPU with AVX-512: it did not recognise this CPU. "
               "Run with OPENBLAS_CORETYPE=SkylakeX (or Haswell without AVX-512) for its fast kernels.";
    if (generic && __builtin_cpu_supports("avx2"))
        return "OpenBLAS runs its generic '" + core + "' kernels on a CPU with AVX2: it did not recognise this CPU. "
               "Run with OPENBLAS_CORETYPE=Haswell for its fast kernels.";
#endif
    return "";
}

// One GEMM: C[m,n] = op(A) op(B), with A and B stored as the training step stores them.
struct Case {
    std::string name;     // row label
    std::string role;     // what the training step uses it for
    strata::Trans ta, tb;
    std::int64_t m, n, k;
};

std::vector<Case> cases() {
    using strata::Trans;
    std::vector<Case> c;
    for (std::int64_t s : {256, 512, 1024, 2048}) c.push_back({"square" + std::to_string(s), "square, NN", Trans::No, Trans::No, s, s, s});
    // Layer GEMMs of the MNIST CNN at batch 128. Forward: Y[M,N] = X[M,K] W[K,N], with X the
    // im2col patches (conv) or the activations (dense) and W the Keras-layout kernel.
    // Backward: dW[K,N] = X^T dY (A = X transposed) and dX[M,K] = dY W^T (B = W transposed).
    struct Layer { const char* name; std::int64_t M, K, N; const char* note; };
    const Layer layers[] = {
        {"conv1", 128 * 26 * 26, 3 * 3 * 1, 32, ""},
        {"conv2", 128 * 11 * 11, 3 * 3 * 32, 64, ""},
        {"dense1", 128, 5 * 5 * 64, 64, ""},
        // strata_train's ViT at batch 128 (49 tokens, width 64, 4 heads of 16, MLP 128): a
        // projection (query, key, value, output), the MLP's two layers, and one head's scores
        // (Q Kᵀ: M 49, K 16, N 49) and weighted values (A V: M 49, K 49, N 16), which run as
        // 512 such products a block.
        {"vit.proj", 128 * 49, 64, 64, ""},
        {"vit.mlp_up", 128 * 49, 64, 128, ""},
        {"vit.mlp_down", 128 * 49, 128, 64, ""},
        {"vit.scores", 49, 16, 49, ""},
        {"vit.av", 49, 49, 16, ""},
    };
    for (const auto& l : layers) {
        const std::string n = l.name;
        c.push_back({n + ".fwd", "Y = X W", Trans::No, Trans::No, l.M, l.N, l.K});
        c.push_back({n + ".dW", "dW = X^T dY", Trans::Yes, Trans::No, l.K, l.N, l.M});
        c.push_back({n + ".dX", n == "conv1" ? "dX = dY W^T (not needed: input layer)" : "dX = dY W^T", Trans::No, Trans::Yes,
                     l.M, l.K, l.N});
    }
    return c;
}

struct Row {
    Case c;
    double strata_s = 0, direct_s = 0;  // median seconds per call
    double strata_best_s = 0, direct_best_s = 0;  // fastest sample: what a quiet machine gives
    long strata_calls = 0, direct_calls = 0;  // calls per timed sample
    bool identical = false;             // strata's C equals the direct call's C bit for bit
    double max_rel_diff = 0;            // max |C_strata - C_direct| / max |C_direct|
    double ratio = 0;                   // median over repetitions of direct time / strata time
    double gflops(double s) const { return 2.0 * double(c.m) * double(c.n) * double(c.k) / s * 1e-9; }
};

// BLAS pool sizes for each side. strata::gemm runs its own threading and may keep the BLAS's
// pool smaller than the thread budget (it splits C over its OpenMP team and calls a
// single-threaded BLAS per block); the direct baseline is what a program that calls
// cblas_sgemm itself gets: the BLAS's own pool at the full thread budget.
struct BlasModes {
    int strata = -1, direct = -1;
};

void set_blas_threads(int n) {
#if defined(STRATA_BLAS_OPENBLAS)
    if (n > 0) openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

int get_blas_threads() {
#if defined(STRATA_BLAS_OPENBLAS)
    return openblas_get_num_threads();
#else
    return -1;
#endif
}

Row run_case(const Case& c, std::size_t index, const BlasModes& modes, const Options& opt) {
    using strata::Trans;
    // Stored shapes: A is [m,k] or, transposed, [k,m]; B is [k,n] or [n,k].
    const strata::Shape sa = c.ta == Trans::No ? strata::Shape{c.m, c.k} : strata::Shape{c.k, c.m};
    const strata::Shape sb = c.tb == Trans::No ? strata::Shape{c.k, c.n} : strata::Shape{c.n, c.k};
    strata::Tensor<float> a(sa), b(sb), c_strata(strata::Shape{c.m, c.n}), c_direct(strata::Shape{c.m, c.n});
    strata::random_uniform(a.view(), -1.0f, 1.0f, 1);
    strata::random_uniform(b.view(), -1.0f, 1.0f, 2);
    strata::fill(c_strata.view(), 0.0f);
    strata::fill(c_direct.view(), 0.0f);

    auto via_strata = [&] { strata::gemm(c.ta, c.tb, 1.0f, a.view(), b.view(), 0.0f, c_strata.view()); };
    auto direct = [&] {
        cblas_sgemm(CblasRowMajor, c.ta == Trans::No ? CblasNoTrans : CblasTrans, c.tb == Trans::No ? CblasNoTrans : CblasTrans,
                    int(c.m), int(c.n), int(c.k), 1.0f, a.data(), int(sa[1]), b.data(), int(sb[1]), 0.0f, c_direct.data(), int(c.n));
    };

    // strata and direct samples alternate (the order flips every repetition), so a slow spell of
    // the machine hits both; the ratio is the median of the per-repetition ratios. Before each
    // sample the BLAS pool is sized for that side and the other side's threads get --pause to go
    // idle (OpenBLAS's pool spins ~0.1 s after a call), so neither is timed against the other's
    // leftovers.
    auto prepare = [&](bool use_strata) {
        set_blas_threads(use_strata ? modes.strata : modes.direct);
        std::this_thread::sleep_for(std::chrono::duration<double>(opt.pause));
    };
    auto run = [&](bool use_strata) { use_strata ? via_strata() : direct(); };
    auto calls_for = [&](bool use_strata) {
        prepare(use_strata);
        for (int i = 0; i < opt.warmup; ++i) run(use_strata);
        const auto t0 = Clock::now();
        run(use_strata);
        return bench::calls_for_min_time(opt.min_time, bench::seconds_since(t0));
    };
    auto sample = [&](bool use_strata, long calls) {
        prepare(use_strata);
        run(use_strata);  // untimed: the first call after a pause wakes the threads up
        const auto t0 = Clock::now();
        for (long i = 0; i < calls; ++i) run(use_strata);
        return bench::seconds_since(t0) / double(calls);
    };
    Row row{c};
    row.strata_calls = calls_for(true);
    row.direct_calls = calls_for(false);
    std::vector<double> ts, td, ratios;
    for (int r = 0; r < opt.reps; ++r) {
        const bool strata_first = (r + int(index)) % 2 == 0;
        const double first = sample(strata_first, strata_first ? row.strata_calls : row.direct_calls);
        const double second = sample(!strata_first, strata_first ? row.direct_calls : row.strata_calls);
        ts.push_back(strata_first ? first : second);
        td.push_back(strata_first ? second : first);
        ratios.push_back(td.back() / ts.back());
    }
    row.strata_s = bench::median(ts);
    row.direct_s = bench::median(td);
    row.ratio = bench::median(ratios);
    row.strata_best_s = *std::min_element(ts.begin(), ts.end());
    row.direct_best_s = *std::min_element(td.begin(), td.end());
    row.identical = std::memcmp(c_strata.data(), c_direct.data(), std::size_t(c.m * c.n) * sizeof(float)) == 0;
    double diff = 0, scale = 0;
    for (std::int64_t i = 0; i < c.m * c.n; ++i) {
        diff = std::max(diff, double(std::abs(c_strata[i] - c_direct[i])));
        scale = std::max(scale, double(std::abs(c_direct[i])));
    }
    row.max_rel_diff = scale > 0 ? diff / scale : diff;
    return row;
}

const char* trans_name(strata::Trans a, strata::Trans b) {
    using strata::Trans;
    return a == Trans::No ? (b == Trans::No ? "NN" : "NT") : (b == Trans::No ? "TN" : "TT");
}

/// The whole benchmark: prints the table, writes the JSON; returns the exit status.
int run(const Options& opt) {
    strata::set_num_threads(opt.threads);
    const int threads = opt.threads > 0 ? opt.threads : strata::hardware_threads();
    // One small strata::gemm first: whatever strata does to the BLAS's pool on first use (it
    // keeps it at one thread) is then in place and can be restored before strata's samples.
    {
        strata::Tensor<float> x(strata::Shape{8, 8}), y(strata::Shape{8, 8});
        strata::fill(x.view(), 1.0f);
        strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, x.view(), x.view(), 0.0f, y.view());
    }
    BlasModes modes;
    modes.strata = get_blas_threads();
    modes.direct = threads;
    bench::Machine machine;
    machine.hardware_threads = strata::hardware_threads();
    const std::string blas = blas_config(), warning = blas_warning();
    machine.extra = {{"blas", blas}};

    std::printf("strata GEMM benchmark: float, row-major, C = op(A) op(B) (alpha 1, beta 0)\n");
    std::printf("cpu: %s, %d hardware threads; BLAS: %s\n", machine.cpu.c_str(), strata::hardware_threads(), blas.c_str());
    std::printf("threads: %d. strata: strata::gemm on an OpenMP team of %d (BLAS pool left at %d, as strata sets it);\n"
                "         direct: cblas_sgemm with the BLAS's own pool at %d threads\n",
                threads, strata::num_threads(), modes.strata, modes.direct);
    std::printf("%d repetitions of one strata and one direct sample (alternating order), each >= %.3g s of back-to-back\n"
                "calls after %.3g s idle\n", opt.reps, opt.min_time, opt.pause);
    std::printf("GFLOP/s = 2*m*n*k / median time; ratio = median over repetitions of (direct time / strata time),\n"
                "so > 1 means strata is faster\n");
    std::printf("load average before: %s\n", machine.load_before.c_str());
    if (!warning.empty()) std::printf("WARNING: %s\n", warning.c_str());
    std::printf("\n");
    std::printf("%-12s %-3s %7s %6s %6s %12s %12s %12s %12s %6s %9s  %s\n", "name", "op", "m", "n", "k", "strata ms",
                "strata GF/s", "direct ms", "direct GF/s", "ratio", "rel diff", "role");

    std::vector<Row> rows;
    for (const auto& c : cases()) {
        if (!opt.only.empty() && c.name.find(opt.only) == std::string::npos) continue;
        Row r = run_case(c, rows.size(), modes, opt);
        const std::string diff = r.identical ? "identical" : bench::format("%.1e", r.max_rel_diff);
        std::printf("%-12s %-3s %7lld %6lld %6lld %12.3f %12.1f %12.3f %12.1f %6.3f %9s  %s\n", c.name.c_str(),
                    trans_name(c.ta, c.tb), (long long)c.m, (long long)c.n, (long long)c.k, r.strata_s * 1e3,
                    r.gflops(r.strata_s), r.direct_s * 1e3, r.gflops(r.direct_s), r.ratio, diff.c_str(), c.role.c_str());
        std::fflush(stdout);
        rows.push_back(r);
    }
    machine.load_after = bench::load_average();
    std::printf("\nrel diff: max |C_strata - C_direct| / max |C_direct| (\"identical\": bit for bit; the two may split the\n"
                "work differently, which changes float rounding only). load average after: %s\n", machine.load_after.c_str());

    if (!opt.json.empty()) {
        cli::Json j;
        j["benchmark"] = "gemm";
        j["dtype"] = "float32";
        j["machine"] = machine.json();
        j["blas_warning"] = warning;
        j["threads"] = threads;
        j["strata_omp_threads"] = strata::num_threads();
        j["strata_blas_threads"] = modes.strata;
        j["direct_blas_threads"] = modes.direct;
        j["reps"] = opt.reps;
        j["warmup"] = opt.warmup;
        j["min_time_s"] = opt.min_time;
        j["pause_s"] = opt.pause;
        j["gflops_definition"] = "2*m*n*k / median seconds per call (*_best_gflops: fastest sample)";
        cli::Json json_rows = cli::Json::array();
        for (const Row& r : rows)
            json_rows.push_back({{"name", r.c.name}, {"op", trans_name(r.c.ta, r.c.tb)}, {"m", r.c.m}, {"n", r.c.n},
                                 {"k", r.c.k}, {"role", r.c.role}, {"strata_seconds", r.strata_s},
                                 {"strata_gflops", r.gflops(r.strata_s)}, {"direct_seconds", r.direct_s},
                                 {"direct_gflops", r.gflops(r.direct_s)}, {"ratio", r.ratio},
                                 {"strata_best_gflops", r.gflops(r.strata_best_s)},
                                 {"direct_best_gflops", r.gflops(r.direct_best_s)},
                                 {"strata_calls_per_sample", r.strata_calls}, {"direct_calls_per_sample", r.direct_calls},
                                 {"identical", r.identical}, {"max_rel_diff", r.max_rel_diff}});
        j["rows"] = json_rows;
        bench::write_json(opt.json, j);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"strata::gemm against cblas_sgemm on the same buffers.", "bench_gemm"};
    Options opt;
    declare_flags(app, opt);
    return cli::run(app, argc, argv, [&] { return run(opt); });
}
