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
//                 measured in the same samples as the all-reduces
//   bus/memcpy    busbw / memcpy GB/s
//   vs ring       this algorithm's time / the ring's time at the same size and N
#include <strata/distribute/collective/all_reduce.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace coll = strata::distribute::collective;
using Clock = std::chrono::steady_clock;

struct Options {
    std::vector<double> sizes_mib{1, 16, 64};
    std::vector<int> participants{2, 4};
    std::vector<coll::Algorithm> algorithms{coll::Algorithm::Ring, coll::Algorithm::NaiveRing,
                                            coll::Algorithm::Direct};
    int reps = 11;
    int warmup = 2;
    std::string json;
};

[[noreturn]] void usage(const char* prog, int status) {
    std::fprintf(status ? stderr : stdout,
                 "usage: %s [--sizes-mb MiB,...] [--participants N,...] [--reps N] [--warmup N]\n"
                 "          [--algorithms ring,naive_ring,direct] [--json FILE]\n"
                 "  --sizes-mb LIST      buffer sizes in MiB, comma-separated, fractions allowed (default 1,16,64)\n"
                 "  --participants LIST  replica (thread) counts, comma-separated (default 2,4)\n"
                 "  --reps N             timed samples per figure; the median is reported (default 11)\n"
                 "  --warmup N           untimed samples first (default 2)\n"
                 "  --algorithms LIST    which algorithms (default ring,naive_ring,direct)\n"
                 "  --json FILE          also write the figures as JSON to FILE\n",
                 prog);
    std::exit(status);
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(item);
    return out;
}

double parse_number(const char* prog, const std::string& flag, const std::string& v, double lo, double hi) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(x >= lo && x <= hi)) {
        std::fprintf(stderr, "%s: %s expects a number in [%g, %g], got '%s'\n", prog, flag.c_str(), lo, hi, v.c_str());
        usage(prog, 2);
    }
    return x;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
                usage(argv[0], 2);
            }
            return argv[++i];
        };
        if (a == "--sizes-mb") {
            o.sizes_mib.clear();
            for (const auto& s : split(value())) o.sizes_mib.push_back(parse_number(argv[0], a, s, 0, 1 << 16));
            if (o.sizes_mib.empty()) usage(argv[0], 2);
        } else if (a == "--participants") {
            o.participants.clear();
            for (const auto& s : split(value())) o.participants.push_back(int(parse_number(argv[0], a, s, 1, 1024)));
            if (o.participants.empty()) usage(argv[0], 2);
        } else if (a == "--algorithms") {
            o.algorithms.clear();
            for (const auto& s : split(value())) {
                if (s == "ring") o.algorithms.push_back(coll::Algorithm::Ring);
                else if (s == "naive_ring") o.algorithms.push_back(coll::Algorithm::NaiveRing);
                else if (s == "direct") o.algorithms.push_back(coll::Algorithm::Direct);
                else {
                    std::fprintf(stderr, "%s: unknown algorithm '%s' (ring, naive_ring, direct)\n", argv[0], s.c_str());
                    usage(argv[0], 2);
                }
            }
        } else if (a == "--reps") o.reps = int(parse_number(argv[0], a, value(), 1, 1e6));
        else if (a == "--warmup") o.warmup = int(parse_number(argv[0], a, value(), 0, 1e6));
        else if (a == "--json") o.json = value();
        else if (a == "-h" || a == "--help") usage(argv[0], 0);
        else {
            std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
            usage(argv[0], 2);
        }
    }
    return o;
}

std::string first_line_field(const char* file, const char* key) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
        }
    return "unknown";
}

std::string load_average() {
    // Other processes on the machine skew every figure; the output records how busy it was.
    std::ifstream in("/proc/loadavg");
    std::string one, five, fifteen;
    if (!(in >> one >> five >> fifteen)) return "unknown";
    return one + " " + five + " " + fifteen;
}

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\', out += c;
        else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else out += c;
    }
    return out + "\"";
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const auto n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Enough back-to-back calls for a sample of >= 16 MiB of traffic, at most 16 (so that Sum of
// ones, N^calls, stays finite in float for any N < 256).
long calls_per_sample(std::size_t bytes) {
    return std::clamp(long((std::size_t{16} << 20) / std::max<std::size_t>(bytes, 1)), 1L, 16L);
}

struct Timings {
    std::vector<double> seconds;  // per algorithm, median time of one all-reduce
    double memcpy_seconds = 0;    // median time of one memcpy of the same bytes
};

// Times every algorithm and a memcpy for `n` participant threads and `elements` floats.
// The machine this runs on may be shared, so the variants are interleaved: each sample runs
// every algorithm once (rotating which goes first) and then the memcpy, so a burst of load
// from elsewhere hits all of them alike instead of skewing one row.
Timings measure(int n, std::size_t elements, const Options& opt) {
    const std::size_t algs = opt.algorithms.size();
    const int samples = opt.warmup + opt.reps;
    const std::size_t bytes = elements * sizeof(float);
    const long calls = calls_per_sample(bytes);
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
                const double want = std::pow(double(n), double(calls));
                for (int s = 0; s < samples; ++s) {
                    for (std::size_t k = 0; k < algs; ++k) {
                        const std::size_t a = (k + std::size_t(s)) % algs;
                        std::fill(buf.begin(), buf.end(), 1.0f);
                        group.barrier(r);
                        const auto t0 = Clock::now();
                        for (long c = 0; c < calls; ++c)
                            group.all_reduce(r, std::span<float>(buf), coll::ReduceOp::Sum, opt.algorithms[a]);
                        times[a][std::size_t(s)][std::size_t(r)] =
                            std::chrono::duration<double>(Clock::now() - t0).count() / double(calls);
                        if (elements > 0 && want < 1e38 && (buf[0] != float(want) || buf[elements - 1] != float(want)))
                            throw std::runtime_error("wrong all-reduce result");
                    }
                    // Rank 0 copies alone: the others block (not spin) in the barrier below.
                    if (r == 0) {
                        const auto t0 = Clock::now();
                        for (long c = 0; c < calls; ++c) {
                            if (bytes > 0) std::memcpy(dst.data(), buf.data(), bytes);
                            if (elements > 0) buf[std::size_t(c) % elements] += 1.0f;  // each copy observable
                        }
                        copy_times[std::size_t(s)] = std::chrono::duration<double>(Clock::now() - t0).count() / double(calls);
                        volatile float sink = elements > 0 ? dst[elements / 2] : 0.0f;
                        (void)sink;
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
        out.seconds.push_back(median(slowest));
    }
    out.memcpy_seconds = median(std::vector<double>(copy_times.begin() + opt.warmup, copy_times.end()));
    return out;
}

struct Row {
    int participants = 0;
    double mib = 0;
    std::size_t bytes = 0;
    std::string algorithm;
    double seconds = 0, memcpy_seconds = 0, ring_seconds = 0;
    double algbw() const { return double(bytes) / seconds * 1e-9; }
    double busbw() const { return algbw() * 2.0 * (participants - 1) / participants; }
    double memcpy_gbps() const { return double(bytes) / memcpy_seconds * 1e-9; }
};

}  // namespace

int main(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    const unsigned hw = std::thread::hardware_concurrency();
    const std::string cpu = first_line_field("/proc/cpuinfo", "model name"), load_before = load_average();

    std::printf("strata all-reduce benchmark: ReplicaGroup (threads sharing memory), float, Sum\n");
    std::printf("cpu: %s, %u hardware threads\n", cpu.c_str(), hw);
    for (int n : opt.participants)
        if (unsigned(n) > hw)
            std::printf("note: %d participants on %u hardware threads are oversubscribed: threads take turns on the cores\n",
                        n, hw);
    std::printf("median of %d samples after %d warm-up; GB = 1e9 bytes, sizes in MiB\n", opt.reps, opt.warmup);
    std::printf("algbw = bytes / time; busbw = algbw * 2(N-1)/N (nccl-tests); memcpy = bytes / time, one thread\n");
    std::printf("load average before: %s\n\n", load_before.c_str());
    std::printf("%4s %9s %-11s %10s %11s %11s %12s %11s %8s\n", "N", "MiB", "algorithm", "time ms", "algbw GB/s",
                "busbw GB/s", "memcpy GB/s", "bus/memcpy", "vs ring");

    std::vector<Row> rows;
    for (int n : opt.participants) {
        for (double mib : opt.sizes_mib) {
            const std::size_t elements = std::size_t(std::llround(mib * double(1 << 20))) / sizeof(float);
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
                char vs[16] = "-";
                if (ring > 0) std::snprintf(vs, sizeof vs, "%.2f", r.seconds / ring);
                std::printf("%4d %9.4g %-11s %10.3f %11.2f %11.2f %12.2f %11.2f %8s\n", n, mib, r.algorithm.c_str(),
                            r.seconds * 1e3, r.algbw(), r.busbw(), r.memcpy_gbps(), r.busbw() / r.memcpy_gbps(), vs);
                std::fflush(stdout);
                rows.push_back(r);
            }
        }
    }

    const std::string load_after = load_average();
    std::printf("\nload average after: %s\n", load_after.c_str());

    if (!opt.json.empty()) {
        std::ofstream out(opt.json);
        if (!out) {
            std::fprintf(stderr, "%s: cannot write %s\n", argv[0], opt.json.c_str());
            return 1;
        }
        out << "{\n  \"benchmark\": \"allreduce\",\n  \"transport\": \"shared memory (threads)\",\n"
            << "  \"dtype\": \"float32\",\n  \"op\": \"sum\",\n"
            << "  \"machine\": {\"cpu\": " << json_string(cpu) << ", \"hardware_threads\": " << hw
            << ", \"load_average_before\": " << json_string(load_before)
            << ", \"load_average_after\": " << json_string(load_after) << "},\n"
            << "  \"reps\": " << opt.reps << ",\n  \"warmup\": " << opt.warmup << ",\n"
            << "  \"conventions\": {\"GB\": \"1e9 bytes\", \"mib\": \"2^20 bytes\", \"algbw_gbps\": \"bytes / time\", "
               "\"busbw_gbps\": \"algbw * 2(N-1)/N\", \"memcpy_gbps\": \"bytes copied / time, one thread\"},\n"
            << "  \"rows\": [\n";
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const Row& r = rows[i];
            char buf[768];
            std::snprintf(buf, sizeof buf,
                          "    {\"participants\": %d, \"oversubscribed\": %s, \"mib\": %.6g, \"bytes\": %zu, "
                          "\"algorithm\": \"%s\", \"seconds\": %.9g, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, "
                          "\"memcpy_seconds\": %.9g, \"memcpy_gbps\": %.6g, \"busbw_over_memcpy\": %.6g, "
                          "\"time_over_ring\": %s}%s\n",
                          r.participants, unsigned(r.participants) > hw ? "true" : "false", r.mib, r.bytes,
                          r.algorithm.c_str(), r.seconds, r.algbw(), r.busbw(), r.memcpy_seconds, r.memcpy_gbps(),
                          r.busbw() / r.memcpy_gbps(),
                          r.ring_seconds > 0 ? std::to_string(r.seconds / r.ring_seconds).c_str() : "null",
                          i + 1 < rows.size() ? "," : "");
            out << buf;
        }
        out << "  ]\n}\n";
        if (!out) {
            std::fprintf(stderr, "%s: error writing %s\n", argv[0], opt.json.c_str());
            return 1;
        }
        std::printf("wrote %s\n", opt.json.c_str());
    }
}
