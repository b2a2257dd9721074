// bench_common.hpp: what the benchmarks (bench_gemm, bench_reduce, bench_allreduce,
// bench_mpi_allreduce) share: command-line reading, machine description, statistics and JSON
// output. Standard library only: bench_mpi_allreduce builds without strata or its BLAS.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>
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

/// The items of a comma-separated list flag (--sizes-mb 1,16,64), empty ones kept.
inline std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(item);
    return out;
}

/// Prints a benchmark's usage text (printf-style, usually with the program name) on stdout for
/// --help (status 0) or on stderr after a mistake, and exits with `status`.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
[[noreturn]] inline void usage_exit(int status, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::vfprintf(status ? stderr : stdout, fmt, args);
    va_end(args);
    std::exit(status);
}

/// Walks a benchmark's argv one flag at a time and checks flag values. Every mistake is
/// reported on stderr as "PROG: FLAG ..." (unless `report` is false, e.g. on MPI ranks other
/// than 0) and ends the program through the benchmark's usage(prog, 2); --help is usage(prog, 0).
class Args {
public:
    /// Prints the benchmark's usage and exits with `status`; must not return.
    using Usage = void (*)(const char* prog, int status);

    Args(int argc, char** argv, Usage usage, bool report = true)
        : argc_(argc), argv_(argv), usage_(usage), report_(report) {}

    /// Steps to the next argument; false when they are all read.
    bool next() {
        if (++i_ >= argc_) return false;
        flag_ = argv_[i_];
        return true;
    }
    /// The current argument, e.g. "--reps".
    const std::string& flag() const { return flag_; }
    /// Whether the current argument is -h or --help.
    bool help() const { return flag_ == "-h" || flag_ == "--help"; }
    /// The program name, for messages.
    const char* prog() const { return argv_[0]; }

    /// The argument after the current flag (its value); a missing one is an error.
    std::string value() {
        if (i_ + 1 >= argc_) {
            say("%s: %s needs a value\n", prog(), flag_.c_str());
            fail();
        }
        return argv_[++i_];
    }
    /// `v` (one item of the current flag's value) as a number in [lo, hi].
    double number(const std::string& v, double lo, double hi) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end || !(x >= lo && x <= hi)) {
            say("%s: %s expects a number in [%g, %g], got '%s'\n", prog(), flag_.c_str(), lo, hi, v.c_str());
            fail();
        }
        return x;
    }
    /// The current flag's value as a number in [lo, hi].
    double number(double lo, double hi) { return number(value(), lo, hi); }
    /// `v` as an integer in [lo, 1'000'000].
    long integer(const std::string& v, long lo) {
        char* end = nullptr;
        const long x = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end || x < lo || x > 1'000'000) {
            say("%s: %s expects an integer >= %ld, got '%s'\n", prog(), flag_.c_str(), lo, v.c_str());
            fail();
        }
        return x;
    }
    /// The current flag's value as an integer in [lo, 1'000'000].
    long integer(long lo) { return integer(value(), lo); }
    /// The current flag's value as a duration in seconds, >= 0.
    double seconds() {
        const std::string v = value();
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end || !(x >= 0)) {
            say("%s: %s expects seconds >= 0, got '%s'\n", prog(), flag_.c_str(), v.c_str());
            fail();
        }
        return x;
    }

    /// Reports an argument the benchmark does not know and exits.
    [[noreturn]] void unknown() {
        say("%s: unknown argument '%s'\n", prog(), flag_.c_str());
        fail();
    }
    /// Reports `what` (the benchmark's own message about the current flag) and exits.
    [[noreturn]] void reject(const std::string& what) {
        say("%s: %s\n", prog(), what.c_str());
        fail();
    }
    /// Exits through usage(prog, 2) without a further message.
    [[noreturn]] void fail() { exit_with(2); }
    /// Prints the usage on stdout and exits 0 (--help).
    [[noreturn]] void show_usage() { exit_with(0); }

private:
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    void say(const char* fmt, ...) const {
        if (!report_) return;
        va_list args;
        va_start(args, fmt);
        std::vfprintf(stderr, fmt, args);
        va_end(args);
    }
    [[noreturn]] void exit_with(int status) {
        usage_(prog(), status);
        std::exit(status);  // usage does not return; this only keeps the promise above
    }

    int argc_;
    char** argv_;
    Usage usage_;
    bool report_;
    int i_ = 0;
    std::string flag_;
};

/// Reads a whole command line: `flag(args, name)` handles each argument and returns false for one
/// it does not know; -h/--help and unknown arguments end the program through `usage`.
template <class Flag>
void parse_args(int argc, char** argv, Args::Usage usage, Flag flag, bool report = true) {
    Args args(argc, argv, usage, report);
    while (args.next())
        if (args.help()) args.show_usage();
        else if (!flag(args, args.flag())) args.unknown();
}

/// The sampling flags bench_gemm and bench_reduce share, as a base of their Options:
/// --threads N, --reps N, --warmup N and --min-time S.
struct SamplingOptions {
    int threads = 0;  // 0: all hardware threads
    int reps = 11;
    int warmup = 2;
    double min_time;  // seconds a sample lasts at least; each benchmark has its default

    explicit SamplingOptions(double default_min_time) : min_time(default_min_time) {}

    /// Takes the current flag if it is one of these; false if it is not.
    bool parse_flag(Args& args, const std::string& flag) {
        if (flag == "--threads") threads = int(args.integer(0));
        else if (flag == "--reps") reps = int(args.integer(1));
        else if (flag == "--warmup") warmup = int(args.integer(0));
        else if (flag == "--min-time") min_time = args.seconds();
        else return false;
        return true;
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

// ---- JSON -----------------------------------------------------------------------------------

/// `s` as a JSON string literal, quotes included.
inline std::string json_string(const std::string& s) {
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

/// The JSON "machine" object every benchmark writes: the CPU, its hardware threads, the load
/// averages before and after the run, and any further string fields (`extra`, e.g. the BLAS),
/// which come after hardware_threads.
struct Machine {
    std::string cpu = cpu_model();
    long hardware_threads = 0;
    std::string load_before = load_average();
    std::string load_after;
    std::vector<std::pair<std::string, std::string>> extra;

    std::string json() const {
        std::string out = "{\"cpu\": " + json_string(cpu) + ", \"hardware_threads\": " + std::to_string(hardware_threads);
        for (const auto& [key, value] : extra) out += ", " + json_string(key) + ": " + json_string(value);
        return out + ", \"load_average_before\": " + json_string(load_before) +
               ", \"load_average_after\": " + json_string(load_after) + "}";
    }
};

/// Writes the "rows" array, one object per line: `fields(row)` gives the inside of its braces.
template <class Row, class Fields>
void write_json_rows(std::ostream& out, const std::vector<Row>& rows, Fields fields) {
    out << "  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) out << "    {" << fields(rows[i]) << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    out << "  ]\n";
}

/// Writes the --json FILE: `write(out)` fills it, then "wrote FILE" goes to stdout. False, after
/// a message on stderr, when the file cannot be written.
template <class Write>
bool write_json(const char* prog, const std::string& path, Write write) {
    std::ofstream out(path);
    if (!out) {
        std::fprintf(stderr, "%s: cannot write %s\n", prog, path.c_str());
        return false;
    }
    write(static_cast<std::ostream&>(out));
    if (!out) {
        std::fprintf(stderr, "%s: error writing %s\n", prog, path.c_str());
        return false;
    }
    std::printf("wrote %s\n", path.c_str());
    return true;
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
inline std::string all_reduce_conventions_json(const std::string& memcpy_gbps) {
    return "{\"GB\": \"1e9 bytes\", \"mib\": \"2^20 bytes\", \"algbw_gbps\": \"bytes / time\", "
           "\"busbw_gbps\": \"algbw * 2(N-1)/N\", \"memcpy_gbps\": " + json_string(memcpy_gbps) + "}";
}

/// One all-reduce figure (one algorithm, N participants, one size) and the bandwidths derived
/// from it, nccl-tests style.
struct AllReduceRow {
    int participants = 0;
    double mib = 0;
    std::size_t bytes = 0;
    std::string algorithm;
    double seconds = 0, memcpy_seconds = 0;  // median time of one all-reduce, of one memcpy
    /// bytes / time, GB/s.
    double algbw() const { return double(bytes) / seconds * 1e-9; }
    /// algbw * 2(N-1)/N: what each rank must send and receive at least, over time.
    double busbw() const { return algbw() * 2.0 * (participants - 1) / participants; }
    /// bytes copied / memcpy time, GB/s.
    double memcpy_gbps() const { return double(bytes) / memcpy_seconds * 1e-9; }
    /// The fields of its JSON row, from "participants" to "busbw_over_memcpy"; oversubscribed
    /// means more participants than the `hardware_threads`.
    std::string json_fields(unsigned hardware_threads) const {
        return format("\"participants\": %d, \"oversubscribed\": %s, \"mib\": %.6g, \"bytes\": %zu, "
                      "\"algorithm\": %s, \"seconds\": %.9g, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, "
                      "\"memcpy_seconds\": %.9g, \"memcpy_gbps\": %.6g, \"busbw_over_memcpy\": %.6g",
                      participants, unsigned(participants) > hardware_threads ? "true" : "false", mib, bytes,
                      json_string(algorithm).c_str(), seconds, algbw(), busbw(), memcpy_seconds, memcpy_gbps(),
                      busbw() / memcpy_gbps());
    }
};

}  // namespace bench
