// cost_model: an alpha-beta-gamma model of one data-parallel training step, its parameters
// measured on this machine, its predictions checked against measured Mirrored steps, and then
// used to predict scaling to 1024 GPUs on published NVLink / InfiniBand figures.
// docs/scaling.md explains every formula and cites its source.
//
//   build/benchmarks/cost_model [--batch 128] [--replicas 1,2,4] [--steps N] [--reps N]
//                               [--pingpong-json FILE | --mpirun CMD] [--json FILE]
//                               [--plot-dir DIR] [--no-measure-steps]
//
// Parts, in the order they run:
//   1. in-process collective: ReplicaGroup all-reduce (Direct, what Auto picks) between 2
//      threads at sizes 4 KiB .. 4 MiB -> alpha and the per-byte slope; one-thread add and copy
//      kernels -> gamma (reduction time per byte) and beta (copy time per byte).
//   2. cross-process point-to-point: bench_pingpong under mpirun -np 2 (run from here, or its
//      JSON given with --pingpong-json) -> alpha_x, beta_x.
//   3. compute: one replica (OneDevice with the cores Mirrored would give it) at the per-replica
//      batch: forward+backward and the optimizer update, timed apart; the backward's per-layer
//      ready times (when each layer's gradient is final), for the overlap model; the cost of
//      waking R replica threads for a step.
//   4. check: Mirrored with R = 1, 2, 4 replicas (default 4 MiB buckets, and 64 KiB buckets
//      that cut the seed CNN's gradient into 4) timed with train_step, beside the prediction;
//      in the same samples the step is taken apart with the custom-loop pieces, which gives the
//      replicas' compute in situ (on a shared machine, alone and beside each other differ).
//      Rows for MultiWorkerMirrored (1-2 processes x 1-2 replicas) are one more row set:
//      predicted the same way, measured by mwm_step under mpirun (its JSON read back).
//   5. prediction: scaling efficiency from 8 to 1024 GPUs (DGX A100 nodes: NVLink inside, HDR
//      InfiniBand between) for the seed CNN and a 25.6 M-parameter fp32 gradient, by algorithm,
//      and a bucket-size sweep; SVG plots with strata::io::LinePlot.
//
// Every time is the median of --reps samples; a sample of steps is --steps back-to-back steps.
#include <strata/strata.hpp>
#include <strata/io/svg_plot.hpp>

#include "../tools/mnist_cnn_net.hpp"
#include "bench_common.hpp"
#include "step_timing.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

namespace {

namespace sd = strata::distribute;
namespace coll = strata::distribute::collective;
using Net = mnist_example::Net;
using bench::Clock;
using bench::MirroredTiming;
using bench::synthetic_x;
using bench::synthetic_y;
constexpr std::int64_t kParams = Net::num_params;
constexpr double kMiB = double(1 << 20);

struct Options {
    std::int64_t batch = 128;
    std::vector<int> replicas{1, 2, 4};
    int steps = 10;
    int reps = 7;
    std::string pingpong_json;
    std::string mpirun = "mpirun --allow-run-as-root --oversubscribe -np 2";
    std::string mpirun_n = "mpirun --allow-run-as-root --oversubscribe --bind-to none -np";
    std::string mwm_transport = "mpi";
    std::string json;
    std::string plot_dir;
    bool measure_steps = true;
};

/// CPU seconds the whole machine spent busy (/proc/stat), and this process with its waited-for
/// children (getrusage): their difference over a run is what other processes took from it.
struct CpuClock {
    double machine_busy = 0, self = 0;
    static CpuClock now() {
        CpuClock c;
        std::ifstream in("/proc/stat");
        std::string cpu;
        double v[8] = {};
        in >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
        const double hz = double(::sysconf(_SC_CLK_TCK));
        c.machine_busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;  // all but idle and iowait
        for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
            rusage u{};
            ::getrusage(who, &u);
            c.self += double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
        }
        return c;
    }
};

// ======================================= the model ==========================================
// Formulas of ../shared/research/multi-process.md (g); the citations are in docs/scaling.md.

/// One level of links: alpha (s per message), beta (s per byte moved), gamma (s per byte reduced).
struct Link {
    double alpha = 0, beta = 0, gamma = 0;
};

double lg(double p) { return std::log2(p); }

/// Ring (reduce-scatter + all-gather): 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
double t_ring(int p, double n, const Link& l) {
    if (p <= 1) return 0;
    return 2.0 * (p - 1) * l.alpha + 2.0 * (p - 1) / p * n * l.beta + double(p - 1) / p * n * l.gamma;
}
/// Recursive doubling: lg p (alpha + n beta + n gamma).
double t_recursive_doubling(int p, double n, const Link& l) {
    if (p <= 1) return 0;
    return lg(p) * (l.alpha + n * l.beta + n * l.gamma);
}
/// Rabenseifner (recursive-halving reduce-scatter + recursive-doubling all-gather), p a power of
/// two: 2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
double t_rabenseifner(int p, double n, const Link& l) {
    if (p <= 1) return 0;
    return 2.0 * lg(p) * l.alpha + 2.0 * (p - 1) / p * n * l.beta + double(p - 1) / p * n * l.gamma;
}
/// Binomial-tree reduce + broadcast: 2 lg p (alpha + n beta) + lg p n gamma.
double t_binomial_tree(int p, double n, const Link& l) {
    if (p <= 1) return 0;
    return 2.0 * std::ceil(lg(p)) * (l.alpha + n * l.beta) + std::ceil(lg(p)) * n * l.gamma;
}
/// strata's Direct all-reduce in shared memory (collective/direct.hpp): one reduce-scatter round
/// and one all-gather round, each ending in a barrier: 2 alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
double t_direct(int p, double n, const Link& l) {
    if (p <= 1) return 0;
    return 2.0 * l.alpha + 2.0 * (p - 1) / p * n * l.beta + double(p - 1) / p * n * l.gamma;
}

/// How much slower each of `threads` busy threads runs on `cores` cores: max(1, threads / cores).
double share(double threads, double cores) { return std::max(1.0, threads / cores); }

/// Exposed communication of a bucketed backward pass: bucket i becomes ready at ready[i]
/// (seconds after backward starts, non-decreasing) and takes dur[i]; buckets are reduced one
/// after another on one communication channel, each as soon as it is ready and the previous one
/// is done. Returns how long after the end of backward (`backward`) the last one finishes.
double exposed_after_backward(const std::vector<double>& ready, const std::vector<double>& dur, double backward) {
    double end = 0;
    for (std::size_t i = 0; i < ready.size(); ++i) end = std::max(end, ready[i]) + dur[i];
    return std::max(0.0, end - backward);
}

/// The seed CNN's gradient buckets, as GradientPath<Mirrored> plans them (mirrored.hpp): the
/// layers' parameter blocks in backward order, cut by collective::BucketPlan. Each bucket's
/// bytes and the layer whose gradient completes it (the lowest layer in it).
struct PlannedBucket {
    double bytes = 0;
    std::size_t last_layer = 0;
};
std::vector<PlannedBucket> seed_buckets(std::size_t bucket_bytes) {
    const auto& off = Net::offsets;
    std::vector<std::size_t> sizes, layer_of;
    for (std::size_t l = Net::num_layers; l-- > 0;)
        if (off[l + 1] > off[l]) {
            sizes.push_back(std::size_t(off[l + 1] - off[l]));
            layer_of.push_back(l);
        }
    std::vector<PlannedBucket> out;
    if (bucket_bytes == 0) return {{double(kParams) * 4, layer_of.back()}};
    const coll::BucketPlan plan(sizes, sizeof(float), bucket_bytes);
    for (const auto& b : plan.buckets())
        out.push_back({double(b.length) * 4, layer_of[b.first_tensor + b.tensor_count - 1]});
    return out;
}

// =================================== measurements ===========================================

double median_of(std::vector<double> v) { return bench::median(std::move(v)); }

/// Median time of one in-process all-reduce of `bytes` among `n` threads (the slowest rank's
/// time per call), with the algorithm Auto resolves to (Direct).
double time_group_all_reduce(int n, std::size_t bytes, int reps) {
    const std::size_t elements = std::max<std::size_t>(1, bytes / sizeof(float));
    const long calls = std::clamp(long((std::size_t{32} << 20) / std::max<std::size_t>(bytes, 1)), 4L, 2000L);
    coll::ReplicaGroup group(n);
    std::vector<std::vector<double>> t(std::size_t(reps + 1), std::vector<double>(std::size_t(n)));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            std::vector<float> buf(elements, 1.0f);
            for (int s = 0; s <= reps; ++s) {
                group.barrier(r);
                const auto t0 = Clock::now();
                for (long c = 0; c < calls; ++c) {
                    group.all_reduce(r, std::span<float>(buf), coll::ReduceOp::Mean);
                }
                t[std::size_t(s)][std::size_t(r)] = bench::seconds_since(t0) / double(calls);
            }
        });
    for (auto& th : threads) th.join();
    std::vector<double> slowest;
    for (int s = 1; s <= reps; ++s) slowest.push_back(*std::max_element(t[std::size_t(s)].begin(), t[std::size_t(s)].end()));
    return median_of(slowest);
}

/// Seconds per byte of the reduction kernel (add_into) and of the copy kernel (copy) on one
/// thread, on buffers of `bytes` (the sizes a replica reduces).
std::pair<double, double> time_kernels(std::size_t bytes, int reps) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> a(n, 1.0f), b(n, 2.0f);
    const long calls = std::clamp(long((std::size_t{64} << 20) / std::max<std::size_t>(bytes, 1)), 4L, 4000L);
    std::vector<double> add, cpy;
    for (int s = 0; s <= reps; ++s) {
        auto t0 = Clock::now();
        for (long c = 0; c < calls; ++c) coll::detail::add_into(a.data(), b.data(), n);
        const double ta = bench::seconds_since(t0) / double(calls);
        t0 = Clock::now();
        for (long c = 0; c < calls; ++c) {
            coll::detail::copy(a.data(), b.data(), n);
            b[std::size_t(c) % n] += 1.0f;
        }
        const double tc = bench::seconds_since(t0) / double(calls);
        if (s > 0) {
            add.push_back(ta / double(bytes));
            cpy.push_back(tc / double(bytes));
        }
    }
    volatile float sink = a[n / 2];
    (void)sink;
    return {median_of(add), median_of(cpy)};
}

struct InProcess {
    std::vector<double> bytes, seconds;  // the 2-thread all-reduce points
    bench::LineFit fit;                  // seconds = a + b bytes
    Link link;                           // alpha = a/2; beta, gamma below
    double add_per_byte = 0, copy_per_byte = 0;
    double four_thread_seconds = 0;      // measured 4-thread all-reduce of the seed gradient
};

InProcess measure_in_process(int reps) {
    InProcess m;
    for (double kib : {4.0, 16.0, 64.0, 128.0, 256.0, 476.0, 1024.0, 2048.0, 4096.0}) {
        const auto bytes = std::size_t(kib * 1024);
        m.bytes.push_back(double(bytes));
        m.seconds.push_back(time_group_all_reduce(2, bytes, reps));
    }
    m.fit = bench::fit_line(m.bytes, m.seconds);
    // Direct at p = 2: t = 2 alpha + n beta + n gamma / 2. gamma comes from the kernels: the time
    // per byte an add (read two, write one) takes beyond a copy (read one, write one).
    const auto [add, cpy] = time_kernels(std::size_t(kParams) * 4, reps);
    m.add_per_byte = add;
    m.copy_per_byte = cpy;
    m.link.alpha = m.fit.a / 2;
    m.link.gamma = std::max(0.0, add - cpy);
    m.link.beta = std::max(0.0, m.fit.b - m.link.gamma / 2);
    m.four_thread_seconds = time_group_all_reduce(4, std::size_t(kParams) * 4, reps);
    return m;
}

struct CrossProcess {
    bool available = false;
    std::string source;
    Link link;
    double max_rel_error = 0;
    cli::Json rows = cli::Json::array();
};

/// The directory this executable lives in (bench_pingpong is built beside it).
std::filesystem::path exe_dir() {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::filesystem::path(".") : p.parent_path();
}

CrossProcess measure_cross_process(const Options& opt, double gamma) {
    CrossProcess x;
    std::string path = opt.pingpong_json;
    if (path.empty() && !opt.mpirun.empty()) {
        const auto exe = exe_dir() / "bench_pingpong";
        if (std::filesystem::exists(exe)) {
            path = (std::filesystem::temp_directory_path() / ("cost_model_pingpong_" + std::to_string(::getpid()) + ".json")).string();
            const std::string cmd = opt.mpirun + " " + exe.string() + " --json " + path + " > /dev/null";
            std::printf("running: %s\n", cmd.c_str());
            std::fflush(stdout);
            if (std::system(cmd.c_str()) != 0) path.clear();
            x.source = cmd;
        }
    } else {
        x.source = "--pingpong-json " + path;
    }
    if (path.empty() || !std::filesystem::exists(path)) return x;
    std::ifstream in(path);
    const auto j = cli::Json::parse(in);
    x.link.alpha = j["fit"]["alpha_seconds"].get<double>();
    x.link.beta = j["fit"]["beta_seconds_per_byte"].get<double>();
    x.link.gamma = gamma;  // the reduction runs on the same cores, in the same code
    x.max_rel_error = j["fit"]["max_relative_error"].get<double>();
    x.rows = j["rows"];
    x.available = true;
    if (opt.pingpong_json.empty()) std::filesystem::remove(path);
    return x;
}

/// One replica's compute at a per-replica batch, with the cores Mirrored gives each replica.
struct Compute {
    std::int64_t batch = 0;
    int cores = 1;
    double fb = 0;   // forward + loss + backward, seconds
    double opt = 0;  // optimizer update (RMSprop over every parameter)
    // per layer with parameters: seconds from the start of backward until its gradient is final
    std::array<double, Net::num_layers> ready{};
    double backward = 0;  // backward alone (the profile's own run)
};

Compute measure_compute(std::int64_t batch, int cores, const Options& opt) {
    Compute c;
    c.batch = batch;
    c.cores = cores;
    sd::OneDevice<> strategy(cores);
    strata::Model<Net, sd::OneDevice<>> model(strategy, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    auto ds = strata::data::Dataset<>::from_arrays(synthetic_x(batch), {28, 28, 1}, synthetic_y(batch)).batch(std::size_t(batch));
    auto it = ds.iterate(0);
    const auto& b = *it;
    std::vector<double> fb, up;
    for (int s = 0; s <= opt.reps; ++s) {
        double f = 0, u = 0;
        for (int k = 0; k < opt.steps; ++k) {
            model.begin_step();
            strategy.run([&](sd::ReplicaContext& ctx) {
                const auto t0 = Clock::now();
                model.compute_gradients(ctx, sd::split_batch(b, 1, 0));
                const auto t1 = Clock::now();
                model.apply_gradients(ctx);
                f += std::chrono::duration<double>(t1 - t0).count();
                u += bench::seconds_since(t1);
            });
            model.end_step(std::int64_t(b.size()));
        }
        if (s > 0) {
            fb.push_back(f / opt.steps);
            up.push_back(u / opt.steps);
        }
    }
    c.fb = median_of(fb);
    c.opt = median_of(up);

    // Per-layer ready times: the network alone, with the backward hook stamping each layer.
    strata::set_num_threads(cores);
    strata::nn::Network<Net, float, strata::place::Host> net;
    std::vector<float> params(static_cast<std::size_t>(kParams)), grads(static_cast<std::size_t>(kParams));
    net.init(params.data(), 42);
    auto x = synthetic_x(batch);
    const strata::TensorView<float, strata::place::Host> xv(x.data(), Net::input_shape::batched(batch));
    std::vector<std::array<double, Net::num_layers>> runs;
    std::vector<double> totals;
    for (int s = 0; s <= opt.reps * opt.steps; ++s) {
        const strata::nn::Mode mode{.training = true, .step = std::uint64_t(s + 1), .seed = 42};
        net.forward(params.data(), xv, mode);
        strata::fill(net.output_grad(), 1e-3f);
        std::array<double, Net::num_layers> r{};
        const auto t0 = Clock::now();
        net.backward(params.data(), grads.data(), mode, [&](std::int64_t first, std::int64_t) {
            for (std::size_t l = 0; l < Net::num_layers; ++l)
                if (Net::offsets[l] == first && Net::offsets[l + 1] > first) r[l] = bench::seconds_since(t0);
        });
        const double total = bench::seconds_since(t0);
        if (s > 0) {
            runs.push_back(r);
            totals.push_back(total);
        }
    }
    strata::set_num_threads(0);
    c.backward = median_of(totals);
    for (std::size_t l = 0; l < Net::num_layers; ++l) {
        std::vector<double> v;
        for (const auto& r : runs) v.push_back(r[l]);
        c.ready[l] = median_of(v);
    }
    return c;
}

/// Seconds to wake R replica threads for an empty step and wait for them (strategy.run).
double measure_launch(int replicas, const Options& opt) {
    sd::Mirrored<> strategy(replicas);
    std::vector<double> v;
    for (int s = 0; s <= opt.reps; ++s) {
        const int calls = 200;
        const auto t0 = Clock::now();
        for (int k = 0; k < calls; ++k) strategy.run([](sd::ReplicaContext&) {});
        if (s > 0) v.push_back(bench::seconds_since(t0) / calls);
    }
    return median_of(v);
}

/// Median seconds per Mirrored step and its parts (step_timing.hpp).
MirroredTiming measure_mirrored(int replicas, std::size_t bucket_bytes, const Options& opt) {
    sd::Mirrored<> strategy(replicas, {.bucket_bytes = bucket_bytes});
    return bench::time_steps<Net>(strategy, opt.batch, opt.steps, opt.reps);
}

/// mwm_step under `mpirun -np N` (opt.mpirun_n + N), read back from its JSON; NaN if it fails.
MirroredTiming measure_multi_worker(int processes, int replicas, std::size_t bucket_bytes, const Options& opt) {
    const auto exe = exe_dir() / "mwm_step";
    if (!std::filesystem::exists(exe)) return {};
    const auto path = std::filesystem::temp_directory_path() / ("cost_model_mwm_" + std::to_string(::getpid()) + ".json");
    const std::string cmd = opt.mpirun_n + " " + std::to_string(processes) + " " + exe.string() + " --replicas " +
                            std::to_string(replicas) + " --batch " + std::to_string(opt.batch) + " --steps " +
                            std::to_string(opt.steps) + " --reps " + std::to_string(opt.reps) + " --bucket-bytes " +
                            std::to_string(bucket_bytes) + " --transport " + opt.mwm_transport + " --json " + path.string() +
                            " > /dev/null";
    std::printf("running: %s\n", cmd.c_str());
    std::fflush(stdout);
    if (std::system(cmd.c_str()) != 0 || !std::filesystem::exists(path)) return {};
    std::ifstream in(path);
    const auto j = cli::Json::parse(in);
    std::filesystem::remove(path);
    auto num = [&](const char* k) { return j[k].is_number() ? j[k].get<double>() : double(NAN); };
    return {num("step_seconds"), num("compute_seconds"), num("apply_seconds"), num("join_seconds")};
}

// ================================ the model of this host ====================================

struct HostStep {
    double launch = 0, compute = 0, comm = 0, update = 0;
    double total() const { return launch + compute + comm + update; }
};

/// Predicted Mirrored (processes = 1) or MultiWorkerMirrored (processes > 1) step on this host.
/// Every process's Mirrored gives each of its R replicas max(1, C / R) cores, so N processes x
/// R replicas run N R max(1, C/R) busy threads on C cores: each runs share() times slower.
/// Communication in shared memory is done by those same cores: it overlaps backward only where
/// backward leaves a core idle, which never happens here (every core has a replica thread), so
/// every bucket's all-reduce adds to the step.
HostStep predict_host_step(int processes, int replicas, std::size_t bucket_bytes, const Compute& c, double launch,
                           const Link& in, const Link* cross, int cores) {
    const bool multi_worker = cross != nullptr;
    HostStep s;
    const double busy = double(processes) * replicas * c.cores;
    const double k = share(busy, cores);
    s.launch = launch;
    s.compute = k * c.fb;
    s.update = k * c.opt;
    const int total_replicas = processes * replicas;
    if (total_replicas == 1) return s;
    const double kc = share(double(processes) * replicas, cores);  // communicating threads on the cores
    const auto buckets = seed_buckets(bucket_bytes);
    std::vector<double> ready, dur;
    for (const auto& b : buckets) {
        double t = 0;
        if (!multi_worker) {
            t = kc * t_direct(replicas, b.bytes, in);
        } else {
            // MultiWorkerMirrored's hierarchical all-reduce (ReplicaGroup with an outer stage):
            // every replica sums its slice of the process's buffers (Direct's reduce-scatter
            // round), the R slices of n/R bytes cross the processes in parallel, one per lane,
            // and the replicas gather them back (Direct's all-gather round). Across processes
            // with the MPI transport: an arrival report to rank 0 (a round trip, 2 alpha_x), then
            // MPI_Iallreduce, modelled as ring = Rabenseifner at p = 2.
            const double r = replicas;
            const double local_reduce = replicas > 1 ? in.alpha + (r - 1) / r * b.bytes * (in.beta + in.gamma) : 0;
            const double local_gather = replicas > 1 ? in.alpha + (r - 1) / r * b.bytes * in.beta : 0;
            const double across = processes > 1 ? 2 * cross->alpha + t_ring(processes, b.bytes / r, *cross) : 0;
            t = kc * (local_reduce + local_gather + across);
        }
        ready.push_back(k * c.ready[b.last_layer]);
        dur.push_back(t);
    }
    const bool idle_core = busy < cores;
    if (idle_core && buckets.size() > 1) {
        s.comm = exposed_after_backward(ready, dur, k * c.backward);
    } else {
        for (double d : dur) s.comm += d;
    }
    return s;
}

struct CheckRow {
    std::string strategy;
    int processes = 1, replicas = 1;
    std::size_t bucket_bytes = 0;
    std::size_t buckets = 0;
    HostStep predicted;   // compute measured in situ (MirroredTiming::compute)
    HostStep isolated;    // compute measured alone (OneDevice) times share()
    MirroredTiming measured;
    double error() const { return predicted.total() / measured.step - 1; }
    double isolated_error() const { return isolated.total() / measured.step - 1; }
};

// ================================== the GPU cluster =========================================

/// A cluster of nodes with g GPUs each: NVLink inside a node, one InfiniBand NIC per GPU between
/// nodes (DGX A100). Figures and sources: docs/scaling.md.
struct Cluster {
    int g = 8;
    double bw_intra = 235e9;  // B/s per GPU inside a node (NCCL's own A100 NVLink cap, below 300 GB/s)
    double bw_inter = 25e9;   // B/s per GPU between nodes: one 200 Gb/s HDR port per GPU
    double alpha_intra = 3.4e-6, alpha_inter = 9.6e-6, alpha_call = 8.4e-6;  // NCCL tuning.cc (ring, Simple)
};

enum class Algo { Ring, Tree, Hierarchical, RecursiveDoubling, Rabenseifner };
constexpr std::array<Algo, 5> kAlgos{Algo::Ring, Algo::Tree, Algo::Hierarchical, Algo::RecursiveDoubling,
                                     Algo::Rabenseifner};
const char* algo_name(Algo a) {
    switch (a) {
        case Algo::Ring: return "ring";
        case Algo::Tree: return "tree";
        case Algo::Hierarchical: return "hierarchical";
        case Algo::RecursiveDoubling: return "recursive_doubling";
        case Algo::Rabenseifner: return "rabenseifner";
    }
    return "?";
}

/// All-reduce of n bytes over p GPUs (p a multiple of g, or p <= g) on `cl`. GPU reductions run
/// at HBM speed, far above the links: gamma = 0.
double t_cluster(Algo a, int p, double n, const Cluster& cl) {
    if (p <= 1) return 0;
    const int g = std::min(p, cl.g), m = p / g;
    const Link in{cl.alpha_intra, 1 / cl.bw_intra, 0}, out{cl.alpha_inter, 1 / cl.bw_inter, 0};
    double t = cl.alpha_call;
    switch (a) {
        case Algo::Ring:
            // One flat ring per NIC (NCCL channels): 2(p-1) steps, 2(m-1) of them cross nodes;
            // g rings each carry n/g, each through its own NIC.
            if (m == 1) return t + t_ring(p, n, in);
            return t + (2.0 * (p - 1) - 2.0 * (m - 1)) * in.alpha + 2.0 * (m - 1) * out.alpha +
                   2.0 * (p - 1) / p * n / std::min(cl.bw_intra, g * cl.bw_inter);
        case Algo::Tree:
            // NCCL: chain inside the node, double binary tree between nodes; pipelined, each GPU
            // sends and receives about 2n (nccl #545).
            if (m == 1) return t + 2.0 * (g - 1) * in.alpha + 2.0 * n / cl.bw_intra;
            return t + 2.0 * ((g - 1) * in.alpha + std::ceil(lg(m)) * out.alpha) + 2.0 * n / std::min(cl.bw_intra, g * cl.bw_inter);
        case Algo::Hierarchical:
            // Horovod: reduce-scatter inside, every GPU all-reduces its n/g slice across nodes on
            // its own NIC (ring), all-gather inside.
            return t + t_ring(g, n, in) + (m > 1 ? t_ring(m, n / g, out) : 0.0);
        case Algo::RecursiveDoubling:
            // lg g exchanges of n over NVLink, lg m of n over the NICs.
            return t + t_recursive_doubling(g, n, in) + (m > 1 ? t_recursive_doubling(m, n, out) : 0.0);
        case Algo::Rabenseifner:
            // Halving with the nearest partners first: the n/2, n/4 ... exchanges inside the
            // node, the last lg m (n/g/2 ...) across: its bandwidth term is the hierarchical one.
            return t + t_rabenseifner(g, n, in) + (m > 1 ? t_rabenseifner(m, n / g, out) : 0.0);
    }
    return t;
}

/// A model trained on the cluster, weak scaling (fixed batch per GPU).
struct GpuWorkload {
    std::string name;
    double params = 0;
    double step_one_gpu = 0;  // seconds: forward + backward + update on one GPU
    double backward_fraction = 2.0 / 3.0;
    // cumulative fraction of the gradient bytes final at fraction f of backward (f in [0, 1]);
    // bucket ready times follow from it.
    std::function<double(double)> bytes_ready_at;
    // inverse: fraction of backward elapsed when a cumulative fraction q of the bytes is final
    std::function<double(double)> time_when_bytes_ready;
};

/// Seconds per step on p GPUs: one GPU's step plus the all-reduce not hidden behind backward
/// (buckets of `bucket_bytes` in backward order, reduced one after another on one stream).
double gpu_step(const GpuWorkload& w, Algo a, int p, double bucket_bytes, const Cluster& cl) {
    const double n = w.params * 4;
    const double bwd = w.step_one_gpu * w.backward_fraction;
    std::vector<double> ready, dur;
    for (double done = 0; done < n;) {
        const double b = std::min(bucket_bytes, n - done);
        done += b;
        ready.push_back(bwd * w.time_when_bytes_ready(done / n));
        dur.push_back(t_cluster(a, p, b, cl));
    }
    return w.step_one_gpu + exposed_after_backward(ready, dur, bwd);
}

// ===================================== reporting ============================================

std::string ms(double s) { return std::isfinite(s) ? bench::format("%.3f", s * 1e3) : "-"; }

int run(const Options& opt) {
    const int cores = int(std::thread::hardware_concurrency());
    const CpuClock cpu0 = CpuClock::now();
    const auto wall0 = Clock::now();
    bench::Machine machine;
    machine.hardware_threads = cores;
    std::printf("strata cost model: seed CNN (%lld parameters, %.1f KiB of fp32 gradient), global batch %lld\n",
                (long long)kParams, double(kParams) * 4 / 1024, (long long)opt.batch);
    std::printf("cpu: %s, %d hardware threads; load average before: %s\n\n", machine.cpu.c_str(), cores,
                machine.load_before.c_str());

    // ---- 1, 2: links ----
    const InProcess ip = measure_in_process(opt.reps);
    std::printf("== In-process all-reduce (ReplicaGroup, Direct, 2 threads) ==\n%10s %12s %12s %8s\n", "KiB", "measured us",
                "fit us", "err");
    for (std::size_t i = 0; i < ip.bytes.size(); ++i) {
        const double f = ip.fit.a + ip.fit.b * ip.bytes[i];
        std::printf("%10.0f %12.2f %12.2f %+7.0f%%\n", ip.bytes[i] / 1024, ip.seconds[i] * 1e6, f * 1e6, 100 * (f / ip.seconds[i] - 1));
    }
    std::printf("alpha = %.2f us (per barrier round), beta = %.4f ns/B (copy kernel alone: %.4f), gamma = %.4f ns/B "
                "(add kernel %.4f - copy %.4f)\n",
                ip.link.alpha * 1e6, ip.link.beta * 1e9, ip.copy_per_byte * 1e9, ip.link.gamma * 1e9, ip.add_per_byte * 1e9,
                ip.copy_per_byte * 1e9);
    const double four_pred = share(4, cores) * t_direct(4, double(kParams) * 4, ip.link);
    std::printf("4 threads, seed gradient: measured %.1f us, model %.1f us (%+.0f%%)\n\n", ip.four_thread_seconds * 1e6,
                four_pred * 1e6, 100 * (four_pred / ip.four_thread_seconds - 1));

    const CrossProcess xp = measure_cross_process(opt, ip.link.gamma);
    if (xp.available)
        std::printf("== Cross-process (MPI ping-pong, 2 processes) ==\nalpha_x = %.2f us, beta_x = %.4f ns/B (%.2f GB/s); "
                    "largest fit error %.0f%%\n\n",
                    xp.link.alpha * 1e6, xp.link.beta * 1e9, 1e-9 / xp.link.beta, 100 * xp.max_rel_error);
    else
        std::printf("== Cross-process: no ping-pong figures (bench_pingpong not run); MultiWorkerMirrored rows left out ==\n\n");

    // Per-bucket all-reduce time by algorithm on this host's parameters, for the seed gradient.
    {
        const double n = double(kParams) * 4;
        std::printf("== All-reduce of the seed gradient (%.0f KiB) by algorithm, on the measured parameters (us) ==\n", n / 1024);
        std::printf("%-26s %4s %10s %10s %12s %14s %10s\n", "link", "p", "direct", "ring", "rec.doubling", "rabenseifner",
                    "bin.tree");
        auto line = [&](const char* name, int p, const Link& l, double k) {
            std::printf("%-26s %4d %10.1f %10.1f %12.1f %14.1f %10.1f\n", name, p, k * t_direct(p, n, l) * 1e6,
                        k * t_ring(p, n, l) * 1e6, k * t_recursive_doubling(p, n, l) * 1e6, k * t_rabenseifner(p, n, l) * 1e6,
                        k * t_binomial_tree(p, n, l) * 1e6);
        };
        for (int p : {2, 4}) line("in-process (threads)", p, ip.link, share(p, cores));
        if (xp.available)
            for (int p : {2, 4}) line("cross-process (MPI)", p, xp.link, share(p, cores));
        std::printf("\n");
    }

    // ---- 3: compute ----
    std::vector<Compute> computes;
    std::vector<double> launches;
    std::printf("== One replica's compute (OneDevice, the cores Mirrored gives a replica) ==\n");
    std::printf("%3s %6s %6s %14s %12s %14s %12s\n", "R", "batch", "cores", "fwd+bwd ms", "update ms", "per example us",
                "launch us");
    for (int r : opt.replicas) {
        const std::int64_t per = (opt.batch + r - 1) / r;
        const int c = r == 1 ? cores : std::max(1, cores / r);
        computes.push_back(measure_compute(per, c, opt));
        launches.push_back(r == 1 ? 0.0 : measure_launch(r, opt));
        const auto& cm = computes.back();
        std::printf("%3d %6lld %6d %14.3f %12.3f %14.2f %12.1f\n", r, (long long)per, c, cm.fb * 1e3, cm.opt * 1e3,
                    cm.fb / double(per) * 1e6, launches.back() * 1e6);
    }
    {
        const auto& c0 = computes.front();
        std::printf("backward ready times at batch %lld (ms after backward starts, of %.3f):", (long long)c0.batch, c0.backward * 1e3);
        for (std::size_t l = Net::num_layers; l-- > 0;)
            if (Net::offsets[l + 1] > Net::offsets[l]) std::printf("  layer %zu: %.3f", l, c0.ready[l] * 1e3);
        std::printf("\n\n");
    }

    // ---- 4: check ----
    std::vector<CheckRow> rows;
    const std::vector<std::size_t> bucket_choices{std::size_t(4) << 20, std::size_t(64) << 10};
    for (std::size_t i = 0; i < opt.replicas.size(); ++i)
        for (std::size_t bb : bucket_choices) {
            const int r = opt.replicas[i];
            if (r == 1 && bb != bucket_choices.front()) continue;
            CheckRow row;
            row.strategy = "mirrored";
            row.replicas = r;
            row.bucket_bytes = bb;
            row.buckets = r > 1 ? seed_buckets(bb).size() : 0;
            row.isolated = predict_host_step(1, r, bb, computes[i], launches[i], ip.link, nullptr, cores);
            row.predicted = row.isolated;
            if (opt.measure_steps) {
                row.measured = measure_mirrored(r, bb, opt);
                row.predicted.compute = row.measured.compute;  // waking the replicas included
                row.predicted.launch = row.measured.join;
            }
            rows.push_back(row);
        }
    // MultiWorkerMirrored: N processes x R replicas, one more row set: predicted from the same
    // parameters plus the cross-process link, measured by mwm_step under mpirun.
    if (xp.available && !opt.mpirun_n.empty())
        for (int n : {1, 2})
            for (int r : {1, 2}) {
                // per-replica batch b / (n r) with max(1, C / (n r)) cores: the compute measured for
                // n r Mirrored replicas.
                std::size_t i = 0;
                while (i < opt.replicas.size() && opt.replicas[i] != n * r) ++i;
                if (i == opt.replicas.size()) continue;
                CheckRow row;
                row.strategy = "multi_worker_mirrored";
                row.processes = n;
                row.replicas = r;
                row.bucket_bytes = bucket_choices.front();
                row.buckets = seed_buckets(row.bucket_bytes).size();
                // waking R local replicas: as measured for Mirrored with R replicas
                const auto local = std::find(opt.replicas.begin(), opt.replicas.end(), r);
                const double launch = r > 1 && local != opt.replicas.end() ? launches[std::size_t(local - opt.replicas.begin())] : 0.0;
                row.isolated = predict_host_step(n, r, row.bucket_bytes, computes[i], launch, ip.link, &xp.link, cores);
                row.predicted = row.isolated;
                if (opt.measure_steps) {
                    row.measured = measure_multi_worker(n, r, row.bucket_bytes, opt);
                    if (std::isfinite(row.measured.step)) {
                        row.predicted.compute = row.measured.compute;
                        row.predicted.launch = row.measured.join;
                    }
                }
                rows.push_back(row);
            }

    std::printf("== Check: predicted against measured step (median of %d samples of %d steps) ==\n", opt.reps, opt.steps);
    std::printf("compute: measured in situ (step start to the last replica's gradients, replicas computing side by side);\n"
                "comm: the model (alpha, beta, gamma above); update: measured alone; launch: waking and joining the\n"
                "replicas, measured (in situ: the join only, the wake is in compute). isolated: the whole prediction from\n"
                "the one-replica-alone compute times share(busy threads / cores).\n");
    std::printf("%-22s %2s %2s %7s %3s %7s %8s %7s %7s %9s %9s %7s %9s %7s %11s\n", "strategy", "N", "R", "bucket", "#b",
                "launch", "compute", "comm", "update", "predicted", "measured", "error", "isolated", "error",
                "meas. apply");
    bool all_within = true;
    for (const auto& row : rows) {
        const double err = row.error();
        if (std::isfinite(err) && std::abs(err) > 0.15) all_within = false;
        std::printf("%-22s %2d %2d %7s %3zu %7s %8s %7s %7s %9s %9s %7s %9s %7s %11s\n", row.strategy.c_str(), row.processes,
                    row.replicas, row.bucket_bytes >= (1u << 20) ? bench::format("%zuMiB", row.bucket_bytes >> 20).c_str()
                                                                 : bench::format("%zuKiB", row.bucket_bytes >> 10).c_str(),
                    row.buckets, ms(row.predicted.launch).c_str(), ms(row.predicted.compute).c_str(),
                    ms(row.predicted.comm).c_str(), ms(row.predicted.update).c_str(), ms(row.predicted.total()).c_str(),
                    ms(row.measured.step).c_str(), std::isfinite(err) ? bench::format("%+.1f%%", 100 * err).c_str() : "-",
                    ms(row.isolated.total()).c_str(),
                    std::isfinite(row.isolated_error()) ? bench::format("%+.1f%%", 100 * row.isolated_error()).c_str() : "-",
                    ms(row.measured.apply).c_str());
    }
    std::printf("(all times in ms; #b: gradient buckets; meas. apply: last gradients to last update, measured in situ)\n");
    std::printf("every measured row within 15%%: %s\n\n", all_within ? "yes" : "NO");

    // ---- 5: the GPU cluster ----
    const Cluster cl;
    // Published: ResNet-50 v1.5, PyTorch, one A100 80GB, TF32: 938 images/s (NVIDIA
    // DeepLearningExamples); batch 256 per GPU.
    const double resnet_ips = 938, resnet_batch = 256;
    // Seed CNN per example: ResNet-50's time scaled by multiply-adds (seed: conv 26x26x32x9 +
    // 11x11x64x288, dense 1600x64 + 64x10; ResNet-50: 3.8e9, He et al. 2016).
    const double seed_macs = 26.0 * 26 * 32 * 9 + 11.0 * 11 * 64 * 288 + 1600.0 * 64 + 64.0 * 10, resnet_macs = 3.8e9;
    const double seed_batch = 128;
    GpuWorkload resnet;
    resnet.name = "resnet50_sized";
    resnet.params = 25.6e6;
    resnet.step_one_gpu = resnet_batch / resnet_ips;
    resnet.bytes_ready_at = [](double f) { return f; };  // gradient produced evenly over backward
    resnet.time_when_bytes_ready = [](double q) { return q; };
    // The same gradient behind 2.6x faster compute: mixed precision, 2470 images/s on the same
    // page (the gradient all-reduced still fp32, as asked): less backward to hide behind.
    const double resnet_amp_ips = 2470;
    GpuWorkload resnet_amp = resnet;
    resnet_amp.name = "resnet50_sized_amp_compute";
    resnet_amp.step_one_gpu = resnet_batch / resnet_amp_ips;
    GpuWorkload seed;
    seed.name = "seed_cnn";
    seed.params = double(kParams);
    seed.step_one_gpu = seed_batch / resnet_ips * seed_macs / resnet_macs;
    {
        // The seed CNN's own backward profile (measured above, on this CPU, as a fraction of its
        // backward): bytes become final layer by layer from the last layer.
        const auto& c0 = computes.front();
        std::vector<std::pair<double, double>> steps;  // (time fraction, cumulative byte fraction)
        double bytes = 0;
        for (std::size_t l = Net::num_layers; l-- > 0;)
            if (Net::offsets[l + 1] > Net::offsets[l]) {
                bytes += double(Net::offsets[l + 1] - Net::offsets[l]);
                steps.push_back({c0.ready[l] / c0.backward, bytes / double(kParams)});
            }
        seed.bytes_ready_at = [steps](double f) {
            double q = 0;
            for (const auto& [t, b] : steps) if (t <= f) q = b;
            return q;
        };
        seed.time_when_bytes_ready = [steps](double q) {
            for (const auto& [t, b] : steps)
                if (b >= q - 1e-12) return std::min(1.0, t);
            return 1.0;
        };
    }
    const std::vector<int> gpus{8, 16, 32, 64, 128, 256, 512, 1024};
    const double default_bucket = 25 * kMiB;  // PyTorch DDP's bucket_cap_mb
    cli::Json scaling = cli::Json::array();
    for (const GpuWorkload* w : {&seed, &resnet, &resnet_amp}) {
        std::printf("== Predicted scaling efficiency, %s (%.3g M parameters, %.1f MB fp32 gradient), %.0f per GPU, "
                    "step on one GPU %.3f ms, %.0f MiB buckets ==\n",
                    w->name.c_str(), w->params / 1e6, w->params * 4 / 1e6, w == &seed ? seed_batch : resnet_batch,
                    w->step_one_gpu * 1e3, default_bucket / kMiB);
        std::printf("%-20s", "GPUs");
        for (int p : gpus) std::printf(" %7d", p);
        std::printf("\n");
        for (Algo a : kAlgos) {
            std::printf("%-20s", algo_name(a));
            cli::Json eff = cli::Json::array(), step = cli::Json::array();
            for (int p : gpus) {
                const double t = gpu_step(*w, a, p, default_bucket, cl);
                std::printf(" %6.1f%%", 100 * w->step_one_gpu / t);
                eff.push_back(w->step_one_gpu / t);
                step.push_back(t);
            }
            std::printf("\n");
            scaling.push_back({{"workload", w->name}, {"algorithm", algo_name(a)}, {"bucket_bytes", default_bucket},
                               {"gpus", gpus}, {"step_seconds", step}, {"efficiency", eff}});
        }
        std::printf("\n");
    }
    // Bucket sweep at 64 and 1024 GPUs.
    std::vector<double> bucket_mib;
    for (double b = 0.25; b <= 256.0 + 1e-9; b *= 2) bucket_mib.push_back(b);
    cli::Json sweep = cli::Json::array();
    for (int p : {64, 1024}) {
        std::printf("== Bucket-size sweep, %d GPUs: efficiency ==\n%-24s", p, "bucket MiB");
        for (double b : bucket_mib) std::printf(" %6g", b);
        std::printf("\n");
        for (const GpuWorkload* w : {&resnet, &resnet_amp, &seed})
            for (Algo a : kAlgos) {
                std::printf("%-24s", (std::string(w == &seed ? "seed " : w == &resnet ? "r50 " : "r50-amp ") + algo_name(a)).c_str());
                cli::Json eff = cli::Json::array();
                for (double b : bucket_mib) {
                    const double e = w->step_one_gpu / gpu_step(*w, a, p, b * kMiB, cl);
                    std::printf(" %5.1f%%", 100 * e);
                    eff.push_back(e);
                }
                std::printf("\n");
                sweep.push_back({{"workload", w->name}, {"algorithm", algo_name(a)}, {"gpus", p},
                                 {"bucket_mib", bucket_mib}, {"efficiency", eff}});
            }
        std::printf("\n");
    }
    // The model against one published point: 8 GPUs of one DGX A100, TF32, 7248 images/s.
    const double published8 = 7248.0 / (8 * resnet_ips);
    const double model8 = resnet.step_one_gpu / gpu_step(resnet, Algo::Ring, 8, default_bucket, cl);
    const double published8_amp = 16621.0 / (8 * resnet_amp_ips);
    const double model8_amp = resnet_amp.step_one_gpu / gpu_step(resnet_amp, Algo::Ring, 8, default_bucket, cl);
    std::printf("published 8-GPU ResNet-50 efficiency (DGX A100): TF32 %.1f%%, AMP %.1f%%; model (ring, 25 MiB): %.1f%%, "
                "%.1f%%\n\n",
                100 * published8, 100 * published8_amp, 100 * model8, 100 * model8_amp);

    if (!opt.plot_dir.empty()) {
        namespace sp = strata::io;
        std::filesystem::create_directories(opt.plot_dir);
        auto gpu_x = std::vector<double>(gpus.begin(), gpus.end());
        sp::Figure fig;
        fig.columns = 3;
        for (const GpuWorkload* w : {&resnet, &resnet_amp, &seed}) {
            sp::LinePlot p;
            p.title = w == &seed ? "seed CNN (0.12 M parameters), batch 128/GPU"
                      : w == &resnet ? "25.6 M parameters, TF32 compute (938 img/s)"
                                     : "25.6 M parameters, AMP compute (2470 img/s)";
            p.x_label = "GPUs (8 per node, log scale)";
            p.y_label = "predicted scaling efficiency";
            p.x_scale = sp::Scale::Log;
            p.width = 620;
            p.height = 430;
            for (Algo a : kAlgos) {
                std::vector<double> y;
                for (int g : gpus) y.push_back(w->step_one_gpu / gpu_step(*w, a, g, default_bucket, cl));
                p.add(algo_name(a), gpu_x, y);
            }
            fig.panels.push_back(p);
        }
        const auto f1 = std::filesystem::path(opt.plot_dir) / "scaling_efficiency.svg";
        fig.save(f1);
        std::printf("wrote %s\n", f1.c_str());
        sp::Figure sw;
        for (int g : {64, 1024}) {
            sp::LinePlot p;
            p.title = "25.6 M parameters, AMP compute, " + std::to_string(g) + " GPUs";
            p.x_label = "bucket MiB (log scale)";
            p.y_label = "predicted scaling efficiency";
            p.x_scale = sp::Scale::Log;
            p.width = 620;
            p.height = 430;
            for (Algo a : kAlgos) {
                std::vector<double> y;
                for (double b : bucket_mib) y.push_back(resnet_amp.step_one_gpu / gpu_step(resnet_amp, a, g, b * kMiB, cl));
                p.add(algo_name(a), bucket_mib, y);
            }
            sw.panels.push_back(p);
        }
        const auto f2 = std::filesystem::path(opt.plot_dir) / "scaling_bucket_sweep.svg";
        sw.save(f2);
        std::printf("wrote %s\n", f2.c_str());
        // The check as a picture: predicted and measured step time against replicas.
        sp::LinePlot ck;
        ck.title = "This host: step time, seed CNN, global batch " + std::to_string(opt.batch);
        ck.x_label = "replicas in sync (N processes x R replicas)";
        ck.y_label = "ms per step";
        ck.width = 620;
        ck.height = 430;
        auto series = [&](const std::string& tag, auto&& keep) {
            std::vector<double> x, yp, ym;
            for (const auto& r : rows)
                if (keep(r)) {
                    x.push_back(r.processes * r.replicas);
                    yp.push_back(r.predicted.total() * 1e3);
                    ym.push_back(r.measured.step * 1e3);
                }
            const auto color = sp::palette(ck.series.size() / 2);
            ck.add("measured, " + tag, x, ym, color);
            ck.add("predicted, " + tag, x, yp, color, true);
        };
        for (std::size_t bb : bucket_choices)
            series(std::string("Mirrored, ") + (bb >= (1u << 20) ? "4 MiB buckets" : "64 KiB buckets"), [&](const CheckRow& r) {
                return r.strategy == "mirrored" && (r.bucket_bytes == bb || r.replicas == 1);
            });
        series("MultiWorkerMirrored, 2 processes", [](const CheckRow& r) {
            return r.strategy == "multi_worker_mirrored" && r.processes == 2;
        });
        const auto f3 = std::filesystem::path(opt.plot_dir) / "scaling_check.svg";
        ck.save(f3);
        std::printf("wrote %s\n", f3.c_str());
    }

    machine.load_after = bench::load_average();
    const CpuClock cpu1 = CpuClock::now();
    const double wall = bench::seconds_since(wall0);
    const double others = std::max(0.0, (cpu1.machine_busy - cpu0.machine_busy) - (cpu1.self - cpu0.self)) / (wall * cores);
    std::printf("load average after: %s; other processes used %.1f%% of the %d CPUs during the run (%.0f s)\n",
                machine.load_after.c_str(), 100 * others, cores, wall);

    if (!opt.json.empty()) {
        cli::Json j;
        j["benchmark"] = "cost_model";
        j["machine"] = machine.json();
        j["others_cpu_share"] = others;
        j["wall_seconds"] = wall;
        j["batch"] = opt.batch;
        j["steps_per_sample"] = opt.steps;
        j["reps"] = opt.reps;
        j["seed_cnn_parameters"] = kParams;
        cli::Json pts = cli::Json::array();
        for (std::size_t i = 0; i < ip.bytes.size(); ++i) pts.push_back({{"bytes", ip.bytes[i]}, {"seconds", ip.seconds[i]}});
        j["in_process"] = {{"collective", "ReplicaGroup all_reduce, Direct, 2 threads"},
                           {"points", pts},
                           {"fit_intercept_seconds", ip.fit.a},
                           {"fit_slope_seconds_per_byte", ip.fit.b},
                           {"fit_max_relative_error", ip.fit.max_rel_error},
                           {"alpha_seconds", ip.link.alpha},
                           {"beta_seconds_per_byte", ip.link.beta},
                           {"gamma_seconds_per_byte", ip.link.gamma},
                           {"add_kernel_seconds_per_byte", ip.add_per_byte},
                           {"copy_kernel_seconds_per_byte", ip.copy_per_byte},
                           {"four_threads_seed_gradient_seconds", ip.four_thread_seconds},
                           {"four_threads_seed_gradient_model_seconds", four_pred}};
        if (xp.available)
            j["cross_process"] = {{"source", xp.source},
                                  {"alpha_seconds", xp.link.alpha},
                                  {"beta_seconds_per_byte", xp.link.beta},
                                  {"max_relative_error", xp.max_rel_error},
                                  {"points", xp.rows}};
        else
            j["cross_process"] = nullptr;
        cli::Json comp = cli::Json::array();
        for (std::size_t i = 0; i < computes.size(); ++i) {
            const auto& c = computes[i];
            cli::Json ready = cli::Json::object();
            for (std::size_t l = 0; l < Net::num_layers; ++l)
                if (Net::offsets[l + 1] > Net::offsets[l]) ready[std::to_string(l)] = c.ready[l];
            comp.push_back({{"replicas", opt.replicas[i]}, {"batch_per_replica", c.batch}, {"cores", c.cores},
                            {"forward_backward_seconds", c.fb}, {"update_seconds", c.opt},
                            {"backward_seconds", c.backward}, {"layer_ready_seconds", ready},
                            {"launch_seconds", launches[i]}});
        }
        j["compute"] = comp;
        cli::Json check = cli::Json::array();
        for (const auto& r : rows)
            check.push_back({{"strategy", r.strategy}, {"processes", r.processes}, {"replicas", r.replicas},
                             {"bucket_bytes", r.bucket_bytes}, {"buckets", r.buckets},
                             {"predicted_launch_seconds", r.predicted.launch},
                             {"predicted_compute_seconds", r.predicted.compute},
                             {"predicted_comm_seconds", r.predicted.comm},
                             {"predicted_update_seconds", r.predicted.update},
                             {"predicted_seconds", r.predicted.total()},
                             {"measured_seconds", cli::finite_or_null(r.measured.step)},
                             {"relative_error", cli::finite_or_null(r.error())},
                             {"isolated_predicted_compute_seconds", r.isolated.compute},
                             {"isolated_predicted_seconds", r.isolated.total()},
                             {"isolated_relative_error", cli::finite_or_null(r.isolated_error())},
                             {"measured_compute_seconds", cli::finite_or_null(r.measured.compute)},
                             {"measured_apply_seconds", cli::finite_or_null(r.measured.apply)},
                             {"measured_join_seconds", cli::finite_or_null(r.measured.join)}});
        j["check"] = check;
        j["check_all_within_15_percent"] = all_within;
        j["cluster"] = {{"gpus_per_node", cl.g}, {"intra_bytes_per_second", cl.bw_intra},
                        {"inter_bytes_per_second_per_gpu", cl.bw_inter}, {"alpha_intra_seconds", cl.alpha_intra},
                        {"alpha_inter_seconds", cl.alpha_inter}, {"alpha_call_seconds", cl.alpha_call},
                        {"resnet50_images_per_second_one_gpu", resnet_ips}, {"resnet50_batch_per_gpu", resnet_batch},
                        {"seed_cnn_batch_per_gpu", seed_batch}, {"seed_cnn_step_seconds_one_gpu", seed.step_one_gpu},
                        {"resnet50_step_seconds_one_gpu", resnet.step_one_gpu}};
        j["scaling"] = scaling;
        j["bucket_sweep"] = sweep;
        j["published_8gpu_resnet50_efficiency"] = published8;
        j["model_8gpu_resnet50_efficiency"] = model8;
        j["published_8gpu_resnet50_amp_efficiency"] = published8_amp;
        j["model_8gpu_resnet50_amp_efficiency"] = model8_amp;
        bench::write_json(opt.json, j);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"An alpha-beta-gamma model of a data-parallel step: measured here, checked, then scaled to 1024 GPUs.",
                 "cost_model"};
    Options opt;
    app.add_option("--batch", opt.batch, "global batch of the checked Mirrored steps")
        ->transform(cli::integer<std::int64_t>(1, 65536))->capture_default_str();
    app.add_option("--replicas", opt.replicas, "Mirrored replica counts to check, comma-separated")
        ->delimiter(',')->transform(cli::integer(1, 64))->capture_default_str();
    app.add_option("--steps", opt.steps, "steps per timed sample")->transform(cli::integer(1, 100000))->capture_default_str();
    app.add_option("--reps", opt.reps, "timed samples per figure; the median is reported")
        ->transform(cli::integer(1, 1000))->capture_default_str();
    app.add_option("--pingpong-json", opt.pingpong_json, "bench_pingpong's --json output to read instead of running it");
    app.add_option("--mpirun", opt.mpirun, "how to start bench_pingpong on 2 processes (empty: skip)")->capture_default_str();
    app.add_option("--mpirun-n", opt.mpirun_n, "how to start mwm_step; the process count is appended (empty: skip)")
        ->capture_default_str();
    app.add_option("--mwm-transport", opt.mwm_transport, "mwm_step's --transport")
        ->check(cli::one_of({"auto", "shared_memory", "mpi"}))->capture_default_str();
    app.add_option("--json", opt.json, "also write the figures as JSON to FILE");
    app.add_option("--plot-dir", opt.plot_dir, "write the SVG plots into DIR");
    app.add_flag("!--no-measure-steps", opt.measure_steps, "predict only: do not time the Mirrored steps");
    return cli::run(app, argc, argv, [&] { return run(opt); });
}
