// bench_allreduce: time and bus bandwidth of strata's shared-memory all-reduce (ReplicaGroup)
// for each algorithm, beside a one-thread memcpy of the same bytes, in the spirit of nccl-tests.
//
//   build/benchmarks/bench_allreduce [--sizes-mb MiB,...] [--participants N,...] [--reps N]
//                                    [--warmup N] [--algorithms ring,naive_ring,direct]
//                                    [--json FILE]
//
// Each participant is a thread owning a float buffer of the given size (first touched by that
// thread); all call group.all_reduce(rank, buffer, Sum, algorithm). A timing is `calls`
// back-to-back all-reduces (16 MiB worth of calls, between 1 and 16) started after a barrier;
// a rank's time is its elapsed time / calls and the timing is the slowest rank's. The buffers
// are refilled (untimed) before every timing. One sample times every algorithm once (in
// rotating order) and then rank 0's memcpy of its buffer while the other threads block, so
// that load from other processes on a shared machine hits all columns alike. The median of
// --reps samples is reported, after --warmup untimed samples.
//
// Conventions (GB = 1e9 bytes, sizes in MiB = 2^20 bytes, S = buffer bytes, N = participants):
//   time ms       median time of one all-reduce
//   algbw GB/s    S / time
//   busbw GB/s    algbw * 2(N-1)/N   (nccl-tests' bus bandwidth for all-reduce: the bytes each
//                                     rank must send and receive at least, over time)
//   memcpy GB/s   S / time of std::memcpy of S bytes on one thread (reads S, writes S),
//                 measured in the same samples as the all-reduces: each sample is the
//                 fastest of 5 copies, so that the baseline is stable
//   bus/memcpy    busbw / memcpy GB/s
//   vs ring       this algorithm's time / the ring's time at the same size and N
#include <strata/distribute/collective/all_reduce.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace coll = strata::distribute::collective;
using bench::Clock;

struct Options {
    std::vector<double> sizes_mib{1, 16, 64};
    std::vector<int> participants{2, 4};
    std::vector<coll::Algorithm> algorithms{coll::Algorithm::Ring, coll::Algorithm::NaiveRing,
                                            coll::Algorithm::Direct};
    int reps = 11;
    int warmup = 2;
    std::string json;
};

/// Declares the flags on `app`, with their ranges.
void declare_flags(CLI::App& app, Options& o, std::vector<std::string>& algorithm_names) {
    app.add_option("--sizes-mb", o.sizes_mib, "buffer sizes in MiB, comma-separated, fractions allowed")
        ->delimiter(',')->check(cli::number(0, 1 << 16))->capture_default_str();
    app.add_option("--participants", o.participants, "replica (thread) counts, comma-separated")
        ->delimiter(',')->transform(cli::integer(1, 1024))->capture_default_str();
    app.add_option("--reps", o.reps, "timed samples per figure; the median is reported")
        ->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed samples first")->transform(cli::integer(0, 1'000'000))->capture_default_str();
    app.add_option("--algorithms", algorithm_names, "which algorithms, comma-separated")
        ->delimiter(',')->check(cli::one_of({"ring", "naive_ring", "direct"}))->capture_default_str();
    app.add_option("--json", o.json, "also write the figures as JSON to FILE");
}

/// The algorithms named by --algorithms, in the order given.
std::vector<coll::Algorithm> algorithms_named(const std::vector<std::string>& names) {
    std::vector<coll::Algorithm> out;
    for (const auto& s : names)
        out.push_back(s == "ring" ? coll::Algorithm::Ring : s == "naive_ring" ? coll::Algorithm::NaiveRing : coll::Algorithm::Direct);
    return out;
}

struct Timings {
    std::vector<double> seconds;  // per algorithm, median time of one all-reduce
    double memcpy_seconds = 0;    // median time of one memcpy of the same bytes
};

// Times every algorithm and a memcpy for `n` participant threads and `elements` floats.
// The machine this runs on may be shared, so the variants are interleaved: each sample runs
// every algorithm once (rotating which goes first) and then the memcpy, so a burst of load
// from elsewhere hits all of them alike instead of skewing one row.
constexpr int kCopies = 5;  // memcpy timings per sample; the fastest is the sample

Timings measure(int n, std::size_t elements, const Options& opt) {
    const std::size_t algs = opt.algorithms.size();
    const int samples = opt.warmup + opt.reps;
    const std::size_t bytes = elements * sizeof(float);
    const long calls = bench::calls_per_sample(bytes);
    coll::ReplicaGroup group(n);
    // times[a][s][r]: rank r's time per call of algorithm a in sample s
    std::vector<std::vector<std::vector<double>>> times(
        algs, std::vector<std::vector<double>>(static_cast<std::size_t>(samples),
                                               std::vector<double>(static_cast<std::size_t>(n))));
    std::vector<double> copy_times(static_cast<std::size_t>(samples));
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                std::vector<float> buf(elements);  // first touched by its owner
                std::vector<float> dst(r == 0 ? elements : 0);
                for (int s = 0; s < samples; ++s) {
                    for (std::size_t k = 0; k < algs; ++k) {
                        const std::size_t a = (k + std::size_t(s)) % algs;
                        std::fill(buf.begin(), buf.end(), 1.0f);
                        group.barrier(r);
                        const auto t0 = Clock::now();
                        for (long c = 0; c < calls; ++c)
                            group.all_reduce(r, std::span<float>(buf), coll::ReduceOp::Sum, opt.algorithms[a]);
                        times[a][std::size_t(s)][std::size_t(r)] = bench::seconds_since(t0) / double(calls);
                        if (!bench::sum_of_ones_ok(buf, n, calls))
                            throw std::runtime_error("wrong all-reduce result");
                    }
                    // Rank 0 copies alone: the others block (not spin) in the barrier below. The
                    // best of kCopies timings is the sample, so that one slow copy (a page of
                    // dst reclaimed, another process's burst) does not make the baseline slow.
                    if (r == 0) {
                        double best = 1e30;
                        for (int k = 0; k < kCopies; ++k) {
                            const auto t0 = Clock::now();
                            bench::copy_repeatedly(dst, buf, calls);
                            best = std::min(best, bench::seconds_since(t0) / double(calls));
                        }
                        copy_times[std::size_t(s)] = best;
                    }
                    group.barrier(r);
                }
            } catch (...) {
                errors[std::size_t(r)] = std::current_exception();
                group.abort(r, std::current_exception());
            }
        });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(group.failure() ? group.failure() : e);

    Timings out;
    for (std::size_t a = 0; a < algs; ++a) {
        std::vector<double> slowest;
        for (int s = opt.warmup; s < samples; ++s)
            slowest.push_back(*std::max_element(times[a][std::size_t(s)].begin(), times[a][std::size_t(s)].end()));
        out.seconds.push_back(bench::median(slowest));
    }
    out.memcpy_seconds = bench::median(std::vector<double>(copy_times.begin() + opt.warmup, copy_times.end()));
    return out;
}

struct Row : bench::AllReduceRow {
    double ring_seconds = 0;  // the ring's time at the same size and N (0: not measured)
};

/// The whole benchmark: prints the table, writes the JSON; returns the exit status.
int run(const Options& opt) {
    const unsigned hw = std::thread::hardware_concurrency();
    bench::Machine machine;
    machine.hardware_threads = hw;

    std::printf("strata all-reduce benchmark: ReplicaGroup (threads sharing memory), float, Sum\n");
    std::printf("cpu: %s, %u hardware threads\n", machine.cpu.c_str(), hw);
    for (int n : opt.participants)
        if (unsigned(n) > hw)
            std::printf("note: %d participants on %u hardware threads are oversubscribed: threads take turns on the cores\n",
                        n, hw);
    bench::print_all_reduce_conventions(opt.reps, opt.warmup, machine.load_before);
    std::printf("%4s %9s %-11s %10s %11s %11s %12s %11s %8s\n", "N", "MiB", "algorithm", "time ms", "algbw GB/s",
                "busbw GB/s", "memcpy GB/s", "bus/memcpy", "vs ring");

    std::vector<Row> rows;
    for (int n : opt.participants) {
        for (double mib : opt.sizes_mib) {
            const std::size_t elements = bench::floats_in_mib(mib);
            const std::size_t bytes = elements * sizeof(float);
            const Timings t = measure(n, elements, opt);
            double ring = 0;
            for (std::size_t a = 0; a < opt.algorithms.size(); ++a)
                if (opt.algorithms[a] == coll::Algorithm::Ring) ring = t.seconds[a];
            for (std::size_t a = 0; a < opt.algorithms.size(); ++a) {
                Row r;
                r.participants = n;
                r.mib = mib;
                r.bytes = bytes;
                r.algorithm = std::string(coll::to_string(opt.algorithms[a]));
                r.memcpy_seconds = t.memcpy_seconds;
                r.seconds = t.seconds[a];
                r.ring_seconds = ring;
                const std::string vs = ring > 0 ? bench::format("%.2f", r.seconds / ring) : "-";
                std::printf("%4d %9.4g %-11s %10.3f %11.2f %11.2f %12.2f %11.2f %8s\n", n, mib, r.algorithm.c_str(),
                            r.seconds * 1e3, r.algbw(), r.busbw(), r.memcpy_gbps(), r.busbw() / r.memcpy_gbps(), vs.c_str());
                std::fflush(stdout);
                rows.push_back(r);
            }
        }
    }

    machine.load_after = bench::load_average();
    std::printf("\nload average after: %s\n", machine.load_after.c_str());

    if (!opt.json.empty()) {
        cli::Json j;
        j["benchmark"] = "allreduce";
        j["transport"] = "shared memory (threads)";
        j["dtype"] = "float32";
        j["op"] = "sum";
        j["machine"] = machine.json();
        j["reps"] = opt.reps;
        j["warmup"] = opt.warmup;
        j["conventions"] = bench::all_reduce_conventions_json("bytes copied / time, one thread");
        cli::Json json_rows = cli::Json::array();
        for (const Row& r : rows) {
            cli::Json row = r.json(hw);
            row["time_over_ring"] = r.ring_seconds > 0 ? cli::Json(r.seconds / r.ring_seconds) : cli::Json(nullptr);
            json_rows.push_back(row);
        }
        j["rows"] = json_rows;
        bench::write_json(opt.json, j);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"strata's shared-memory all-reduce (ReplicaGroup), each algorithm, against memcpy.", "bench_allreduce"};
    Options opt;
    std::vector<std::string> algorithm_names{"ring", "naive_ring", "direct"};
    declare_flags(app, opt, algorithm_names);
    return cli::run(app, argc, argv, [&] {
        opt.algorithms = algorithms_named(algorithm_names);
        return run(opt);
    });
}
