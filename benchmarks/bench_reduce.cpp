// bench_reduce: bandwidth of strata::sum over a float tensor (accumulated in double) against
// memcpy of the same bytes, in the spirit of nccl-tests: every column says what it counts.
//
//   build/benchmarks/bench_reduce [--threads N] [--reps N] [--warmup N] [--min-time S]
//                                 [--sizes MiB,MiB,...] [--json FILE]
//
// Conventions (GB = 1e9 bytes, sizes in MiB = 2^20 bytes):
//   sum GB/s        bytes read / time          strata::sum(view), the library call under test
//   ref GB/s        bytes read / time          a plain OpenMP loop with independent double
//                                              accumulators: what a reduction can reach here
//   memcpy GB/s     bytes copied / time        std::memcpy on one thread (reads S, writes S)
//   memcpy xN GB/s  bytes copied / time        the buffer split in N chunks, one memcpy per thread
//   sum/memcpy      sum GB/s / memcpy GB/s     (one-thread memcpy)
// A copy moves twice the bytes it is credited with (read + write), so a reduction that is
// limited by memory bandwidth should reach well above 1.0 here, not merely 1.0.
// Only the tensor core: the benchmark measures it and nothing else (and compiles faster).
#include <strata/tensor/tensor_all.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
    int threads = 0;  // 0: all hardware threads
    int reps = 11;
    int warmup = 2;
    double min_time = 0.1;
    std::vector<std::int64_t> sizes_mib{1, 16, 64, 256};
    std::string json;
};

[[noreturn]] void usage(const char* prog, int status) {
    std::fprintf(status ? stderr : stdout,
                 "usage: %s [--threads N] [--reps N] [--warmup N] [--min-time SECONDS] [--sizes MiB,...] [--json FILE]\n"
                 "  --threads N     threads for strata's host ops and the reference loops (default: all)\n"
                 "  --reps N        timed samples per figure; the median is reported (default 11)\n"
                 "  --warmup N      untimed calls of each variant before timing (default 2)\n"
                 "  --min-time S    a sample repeats the call until it lasts at least S seconds (default 0.1)\n"
                 "  --sizes LIST    buffer sizes in MiB, comma-separated (default 1,16,64,256)\n"
                 "  --json FILE     also write the figures as JSON to FILE\n",
                 prog);
    std::exit(status);
}

long parse_long(const char* prog, const std::string& flag, const std::string& v, long lo) {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || x < lo || x > 1'000'000) {
        std::fprintf(stderr, "%s: %s expects an integer >= %ld, got '%s'\n", prog, flag.c_str(), lo, v.c_str());
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
        if (a == "--threads") o.threads = int(parse_long(argv[0], a, value(), 0));
        else if (a == "--reps") o.reps = int(parse_long(argv[0], a, value(), 1));
        else if (a == "--warmup") o.warmup = int(parse_long(argv[0], a, value(), 0));
        else if (a == "--min-time") {
            const std::string v = value();
            char* end = nullptr;
            o.min_time = std::strtod(v.c_str(), &end);
            if (v.empty() || *end || !(o.min_time >= 0)) {
                std::fprintf(stderr, "%s: --min-time expects seconds >= 0, got '%s'\n", argv[0], v.c_str());
                usage(argv[0], 2);
            }
        } else if (a == "--sizes") {
            o.sizes_mib.clear();
            std::stringstream ss(value());
            std::string item;
            while (std::getline(ss, item, ',')) o.sizes_mib.push_back(parse_long(argv[0], a, item, 1));
            if (o.sizes_mib.empty()) usage(argv[0], 2);
        } else if (a == "--json") o.json = value();
        else if (a == "-h" || a == "--help") usage(argv[0], 0);
        else {
            std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
            usage(argv[0], 2);
        }
    }
    return o;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
        }
    return "unknown";
}

std::string load_average() {
    // Other processes on the machine skew every figure; the table records how busy it was.
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

// The reference reduction: fixed blocks of 4096 elements spread over the threads, each summed
// with 8 independent double accumulators so the adds pipeline instead of waiting on each other.
double reference_sum(const float* x, std::int64_t n) {
    constexpr std::int64_t block = 4096, lanes = 8;
    const std::int64_t blocks = (n + block - 1) / block;
    double total = 0;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(+ : total)
#endif
    for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t first = b * block, last = std::min(n, first + block);
        double acc[lanes] = {};
        std::int64_t i = first;
        for (; i + lanes <= last; i += lanes)
            for (std::int64_t j = 0; j < lanes; ++j) acc[j] += double(x[i + j]);
        for (; i < last; ++i) acc[0] += double(x[i]);
        double s = 0;
        for (double a : acc) s += a;
        total += s;
    }
    return total;
}

void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
    {
        const auto t = std::size_t(omp_get_thread_num()), nt = std::size_t(omp_get_num_threads());
        const std::size_t chunk = (bytes / nt + 63) / 64 * 64;
        const std::size_t first = std::min(bytes, t * chunk), last = std::min(bytes, first + chunk);
        if (last > first) std::memcpy(static_cast<char*>(dst) + first, static_cast<const char*>(src) + first, last - first);
    }
#else
    (void)threads;
    std::memcpy(dst, src, bytes);
#endif
}

struct Row {
    std::int64_t mib = 0, elements = 0, bytes = 0;
    double sum_s = 0, ref_s = 0, memcpy_s = 0, pmemcpy_s = 0;  // median seconds per call
    double sum_best_s = 0, memcpy_best_s = 0;                  // fastest sample
    double strata_value = 0, reference_value = 0;
    double gbps(double s) const { return double(bytes) / s * 1e-9; }
};

struct Timing {
    double median_s, best_s;
};

template <class F>
Timing timed(F f, const Options& opt) {
    for (int i = 0; i < opt.warmup; ++i) f();
    const auto t0 = Clock::now();
    f();
    const double t1 = std::chrono::duration<double>(Clock::now() - t0).count();
    const long calls = std::max(1L, long(std::ceil(opt.min_time / std::max(t1, 1e-9))));
    std::vector<double> samples;
    for (int r = 0; r < opt.reps; ++r) {
        const auto s0 = Clock::now();
        for (long i = 0; i < calls; ++i) f();
        samples.push_back(std::chrono::duration<double>(Clock::now() - s0).count() / double(calls));
    }
    return {median(samples), *std::min_element(samples.begin(), samples.end())};
}

volatile double sink;  // keeps the compiler from dropping sums nobody reads

}  // namespace

int main(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    strata::set_num_threads(opt.threads);
    const int threads = opt.threads > 0 ? opt.threads : strata::hardware_threads();
    const std::string cpu = cpu_model(), load_before = load_average();

    std::printf("strata reduction benchmark: strata::sum over float (accumulated in double) vs memcpy\n");
    std::printf("cpu: %s, %d hardware threads; threads: %d (strata host ops: %d)\n", cpu.c_str(), strata::hardware_threads(),
                threads, strata::num_threads());
    std::printf("median of %d samples, each >= %.3g s of back-to-back calls; GB = 1e9 bytes, sizes in MiB\n", opt.reps, opt.min_time);
    std::printf("sum, ref:  GB/s = bytes read / time     (ref: OpenMP loop, 8 double accumulators per thread)\n");
    std::printf("memcpy:    GB/s = bytes copied / time   (1 thread; xN: one memcpy per thread on 1/N of the buffer)\n");
    std::printf("load average before: %s\n\n", load_before.c_str());
    std::printf("%8s %11s %10s %9s %9s %12s %14s %11s %10s\n", "MiB", "floats", "sum ms", "sum GB/s", "ref GB/s",
                "memcpy GB/s", "memcpy xN GB/s", "sum/memcpy", "sum/ref");

    std::vector<Row> rows;
    for (const auto mib : opt.sizes_mib) {
        Row r;
        r.mib = mib;
        r.bytes = mib << 20;
        r.elements = r.bytes / std::int64_t(sizeof(float));
        strata::Tensor<float> x(strata::Shape{r.elements}), y(strata::Shape{r.elements});
        strata::random_uniform(x.view(), 0.0f, 1.0f, 7);
        strata::fill(y.view(), 0.0f);  // fault the destination's pages in before timing

        r.strata_value = double(strata::sum(x.view()));
        r.reference_value = reference_sum(x.data(), r.elements);
        const Timing ts = timed([&] { sink = double(strata::sum(x.view())); }, opt);
        const Timing tm = timed([&] { std::memcpy(y.data(), x.data(), std::size_t(r.bytes)); sink = double(y[r.elements - 1]); }, opt);
        r.sum_s = ts.median_s, r.sum_best_s = ts.best_s, r.memcpy_s = tm.median_s, r.memcpy_best_s = tm.best_s;
        r.ref_s = timed([&] { sink = reference_sum(x.data(), r.elements); }, opt).median_s;
        r.pmemcpy_s = timed([&] { parallel_memcpy(y.data(), x.data(), std::size_t(r.bytes), threads); sink = double(y[0]); }, opt).median_s;

        std::printf("%8lld %11lld %10.3f %9.2f %9.2f %12.2f %14.2f %11.3f %10.3f\n", (long long)r.mib, (long long)r.elements,
                    r.sum_s * 1e3, r.gbps(r.sum_s), r.gbps(r.ref_s), r.gbps(r.memcpy_s), r.gbps(r.pmemcpy_s),
                    r.gbps(r.sum_s) / r.gbps(r.memcpy_s), r.gbps(r.sum_s) / r.gbps(r.ref_s));
        std::fflush(stdout);
        const double rel = std::abs(r.strata_value - r.reference_value) / std::abs(r.reference_value);
        if (rel > 1e-9)
            std::printf("  note: strata::sum = %.17g differs from the reference %.17g by %.3g relative\n", r.strata_value,
                        r.reference_value, rel);
        rows.push_back(r);
    }

    const std::string load_after = load_average();
    std::printf("\nload average after: %s\n", load_after.c_str());

    if (!opt.json.empty()) {
        std::ofstream out(opt.json);
        if (!out) {
            std::fprintf(stderr, "%s: cannot write %s\n", argv[0], opt.json.c_str());
            return 1;
        }
        out << "{\n  \"benchmark\": \"reduce\",\n  \"dtype\": \"float32\",\n  \"accumulator\": \"float64\",\n"
            << "  \"machine\": {\"cpu\": " << json_string(cpu) << ", \"hardware_threads\": " << strata::hardware_threads()
            << ", \"load_average_before\": " << json_string(load_before) << ", \"load_average_after\": " << json_string(load_after)
            << "},\n"
            << "  \"threads\": " << threads << ",\n  \"reps\": " << opt.reps << ",\n  \"warmup\": " << opt.warmup
            << ",\n  \"min_time_s\": " << opt.min_time << ",\n"
            << "  \"conventions\": {\"GB\": \"1e9 bytes\", \"sum_gbps\": \"bytes read / time\", \"ref_gbps\": \"bytes read / time\", "
               "\"memcpy_gbps\": \"bytes copied / time, one thread\", \"parallel_memcpy_gbps\": \"bytes copied / time, one memcpy per thread\", "
               "\"figures\": \"median sample; *_best_gbps: fastest sample\"},\n"
            << "  \"rows\": [\n";
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const Row& r = rows[i];
            char buf[1024];
            std::snprintf(buf, sizeof buf,
                          "    {\"mib\": %lld, \"bytes\": %lld, \"elements\": %lld, \"sum_seconds\": %.9g, \"sum_gbps\": %.6g, "
                          "\"ref_seconds\": %.9g, \"ref_gbps\": %.6g, \"memcpy_seconds\": %.9g, \"memcpy_gbps\": %.6g, "
                          "\"parallel_memcpy_seconds\": %.9g, \"parallel_memcpy_gbps\": %.6g, \"sum_over_memcpy\": %.6g, "
                          "\"sum_over_ref\": %.6g, \"sum_best_gbps\": %.6g, \"memcpy_best_gbps\": %.6g, "
                          "\"strata_sum\": %.17g, \"reference_sum\": %.17g}%s\n",
                          (long long)r.mib, (long long)r.bytes, (long long)r.elements, r.sum_s, r.gbps(r.sum_s), r.ref_s,
                          r.gbps(r.ref_s), r.memcpy_s, r.gbps(r.memcpy_s), r.pmemcpy_s, r.gbps(r.pmemcpy_s),
                          r.gbps(r.sum_s) / r.gbps(r.memcpy_s), r.gbps(r.sum_s) / r.gbps(r.ref_s), r.gbps(r.sum_best_s),
                          r.gbps(r.memcpy_best_s), r.strata_value,
                          r.reference_value, i + 1 < rows.size() ? "," : "");
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
