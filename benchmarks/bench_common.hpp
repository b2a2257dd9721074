// bench_common.hpp: what the benchmarks (bench_gemm, bench_reduce, bench_allreduce,
// bench_mpi_allreduce) share: their common flags, machine description, statistics and JSON
// output. Flags and JSON go through tools/cli.hpp (standard library only), like the
// examples'. No strata: bench_mpi_allreduce builds without strata or its BLAS.
#pragma once

#include "../tools/cli.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

/// Seconds from `t0` to now on the steady clock: the one stopwatch every timing uses.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// printf into a std::string: table cells and JSON rows without fixed-size buffers.
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string format(const char* fmt, ...) {
    va_list args, again;
    va_start(args, fmt);
    va_copy(again, args);
    const int n = std::vsnprintf(nullptr, 0, fmt, args);
    va_end(args);
    std::string out(n > 0 ? std::size_t(n) : 0, '\0');
    if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
    va_end(again);
    return out;
}

// ---- command line ---------------------------------------------------------------------------

/// The sampling flags bench_gemm and bench_reduce share, as a base of their Options:
/// --threads N, --reps N, --warmup N and --min-time S.
struct SamplingOptions {
    int threads = 0;  // 0: all hardware threads
    int reps = 11;
    int warmup = 2;
    double min_time;  // seconds a sample lasts at least; each benchmark has its default

    explicit SamplingOptions(double default_min_time) : min_time(default_min_time) {}

    /// Declares the four flags on `app`, with their ranges.
    void declare(CLI::App& app, const char* threads_help) {
        app.add_option("--threads", threads, threads_help)->transform(cli::integer(0, 4096))->capture_default_str();
        app.add_option("--reps", reps, "timed samples per figure; the median is reported")
            ->transform(cli::integer(1, 1'000'000))->capture_default_str();
        app.add_option("--warmup", warmup, "untimed calls of each variant before timing")
            ->transform(cli::integer(0, 1'000'000))->capture_default_str();
        app.add_option("--min-time", min_time, "a sample repeats the call until it lasts at least this many seconds")
            ->check(cli::number(0, 3600))->capture_default_str();
    }
};

// ---- the machine ----------------------------------------------------------------------------

/// The text after the colon of the first line of `file` that starts with `key` ("unknown"
/// when there is none): reads /proc/cpuinfo-style "key : value" files.
inline std::string first_line_field(const char* file, const char* key) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
        }
    return "unknown";
}

/// The CPU's model name from /proc/cpuinfo ("unknown" elsewhere).
inline std::string cpu_model() { return first_line_field("/proc/cpuinfo", "model name"); }

/// The 1, 5 and 15 minute load averages ("0.52 0.40 0.31", or "unknown"). Other processes on
/// the machine skew every figure; the output records how busy it was before and after.
inline std::string load_average() {
    std::ifstream in("/proc/loadavg");
    std::string one, five, fifteen;
    if (!(in >> one >> five >> fifteen)) return "unknown";
    return one + " " + five + " " + fifteen;
}

// ---- statistics and timing ------------------------------------------------------------------

/// The median of the samples (the mean of the middle two for an even count); every figure the
/// benchmarks report is one.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const auto n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// How many back-to-back calls make a sample last at least `min_time` seconds, given that one
/// call took `one_call` seconds (at least 1).
inline long calls_for_min_time(double min_time, double one_call) {
    return std::max(1L, long(std::ceil(min_time / std::max(one_call, 1e-9))));
}

// ---- alpha-beta fits (bench_pingpong, cost_model) -------------------------------------------

/// A latency-bandwidth line t(n) = a + b n fitted to measured times.
struct LineFit {
    double a = 0, b = 0;       // seconds, seconds per byte
    double max_rel_error = 0;  // largest |fit / measured - 1| over the points
};

/// Least squares in relative error (each point weighted by 1 / t^2, so that the microsecond
/// points count as much as the millisecond ones): minimises sum ((a + b n_i - t_i) / t_i)^2.
/// Requires at least two distinct n; a negative a or b is clamped to 0 and the other refitted.
inline LineFit fit_line(const std::vector<double>& n, const std::vector<double>& t) {
    double s00 = 0, s01 = 0, s11 = 0, r0 = 0, r1 = 0;
    for (std::size_t i = 0; i < n.size(); ++i) {
        const double w = 1.0 / (t[i] * t[i]);
        s00 += w;
        s01 += w * n[i];
        s11 += w * n[i] * n[i];
        r0 += w * t[i];
        r1 += w * n[i] * t[i];
    }
    LineFit f;
    const double det = s00 * s11 - s01 * s01;
    f.a = (r0 * s11 - r1 * s01) / det;
    f.b = (s00 * r1 - s01 * r0) / det;
    if (f.a < 0) f = {0, r1 / s11, 0};
    if (f.b < 0) f = {r0 / s00, 0, 0};
    for (std::size_t i = 0; i < n.size(); ++i) f.max_rel_error = std::max(f.max_rel_error, std::abs((f.a + f.b * n[i]) / t[i] - 1));
    return f;
}

// ---- JSON -----------------------------------------------------------------------------------

/// The JSON "machine" object every benchmark writes: the CPU, its hardware threads, the load
/// averages before and after the run, and any further string fields (`extra`, e.g. the BLAS),
/// which come after hardware_threads.
struct Machine {
    std::string cpu = cpu_model();
    long hardware_threads = 0;
    std::string load_before = load_average();
    std::string load_after;
    std::vector<std::pair<std::string, std::string>> extra;

    cli::Json json() const {
        cli::Json out = {{"cpu", cpu}, {"hardware_threads", hardware_threads}};
        for (const auto& [key, value] : extra) out[key] = value;
        out["load_average_before"] = load_before;
        out["load_average_after"] = load_after;
        return out;
    }
};

/// Writes the --json FILE (see cli::write_json), then says so on stdout.
inline void write_json(const std::string& path, const cli::Json& doc) {
    cli::write_json(path, doc);
    std::printf("wrote %s\n", path.c_str());
}

// ---- all-reduce (bench_allreduce and bench_mpi_allreduce) -----------------------------------

/// The float count of a buffer of `mib` MiB (fractions allowed).
inline std::size_t floats_in_mib(double mib) { return std::size_t(std::llround(mib * double(1 << 20))) / sizeof(float); }

/// Back-to-back all-reduces per sample: enough for >= 16 MiB of traffic, at most 16 (so that a
/// Sum of ones, N^calls, stays finite in float for any N < 256).
inline long calls_per_sample(std::size_t bytes) {
    return std::clamp(long((std::size_t{16} << 20) / std::max<std::size_t>(bytes, 1)), 1L, 16L);
}

/// Whether `buf`, all ones summed over `participants` ranks `calls` times over, holds
/// participants^calls at both ends (true as well when that is too large to check in float).
inline bool sum_of_ones_ok(const std::vector<float>& buf, int participants, long calls) {
    const double want = std::pow(double(participants), double(calls));
    return buf.empty() || want >= 1e38 || (buf.front() == float(want) && buf.back() == float(want));
}

/// The memcpy baseline: copies `src` into `dst` (as large) `calls` times, changing one element of
/// `src` after each copy so that every copy is observable. The caller times it.
inline void copy_repeatedly(std::vector<float>& dst, std::vector<float>& src, long calls) {
    const std::size_t elements = src.size(), bytes = elements * sizeof(float);
    for (long c = 0; c < calls; ++c) {
        if (bytes > 0) std::memcpy(dst.data(), src.data(), bytes);
        if (elements > 0) src[std::size_t(c) % elements] += 1.0f;
    }
    volatile float sink = elements > 0 ? dst[elements / 2] : 0.0f;
    (void)sink;
}

/// The header lines both all-reduce tables print under their title and CPU line.
inline void print_all_reduce_conventions(int reps, int warmup, const std::string& load_before) {
    std::printf("median of %d samples after %d warm-up; GB = 1e9 bytes, sizes in MiB\n", reps, warmup);
    std::printf("algbw = bytes / time; busbw = algbw * 2(N-1)/N (nccl-tests); memcpy = bytes / time, one thread\n");
    std::printf("load average before: %s\n\n", load_before.c_str());
}

/// The JSON "conventions" object of the all-reduce benchmarks; `memcpy_gbps` says how the memcpy
/// baseline was measured.
inline cli::Json all_reduce_conventions_json(const std::string& memcpy_gbps) {
    return {{"GB", "1e9 bytes"}, {"mib", "2^20 bytes"}, {"algbw_gbps", "bytes / time"},
            {"busbw_gbps", "algbw * 2(N-1)/N"}, {"memcpy_gbps", memcpy_gbps}};
}

/// One all-reduce figure (one algorithm, N participants, one size) and the bandwidths derived
/// from it, nccl-tests style.
struct AllReduceRow {
    int participants = 0;
    double mib = 0;
    std::size_t bytes = 0;
    std::string algorithm;
    double seconds = 0, memcpy_seconds = 0;  // median time of one all-reduce, of one memcpy
    double speedup_vs_baseline = 0;          // a baseline's time / seconds (0: no baseline)
    /// bytes / time, GB/s.
    double algbw() const { return double(bytes) / seconds * 1e-9; }
    /// algbw * 2(N-1)/N: what each rank must send and receive at least, over time.
    double busbw() const { return algbw() * 2.0 * (participants - 1) / participants; }
    /// bytes copied / memcpy time, GB/s.
    double memcpy_gbps() const { return double(bytes) / memcpy_seconds * 1e-9; }
    /// Its JSON row, from "participants" to "busbw_over_memcpy"; oversubscribed means more
    /// participants than the `hardware_threads`.
    cli::Json json(unsigned hardware_threads) const {
        cli::Json j = json_fields(hardware_threads);
        if (speedup_vs_baseline > 0) j["speedup_vs_baseline"] = speedup_vs_baseline;
        return j;
    }
    cli::Json json_fields(unsigned hardware_threads) const {
        return {{"participants", participants}, {"oversubscribed", unsigned(participants) > hardware_threads},
                {"mib", mib}, {"bytes", bytes}, {"algorithm", algorithm}, {"seconds", seconds},
                {"algbw_gbps", algbw()}, {"busbw_gbps", busbw()}, {"memcpy_seconds", memcpy_seconds},
                {"memcpy_gbps", memcpy_gbps()}, {"busbw_over_memcpy", busbw() / memcpy_gbps()}};
    }
};

}  // namespace bench
