// bench_mpi_allreduce: MPI_Allreduce (MPI_SUM, float, in place) across processes, with the same
// sizes, method and columns as bench_allreduce, so the two tables can be read side by side.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/benchmarks/bench_mpi_allreduce
//          [--sizes-mb MiB,...] [--reps N] [--warmup N] [--json FILE]
//
// The number of participants is the number of MPI processes (-np). A sample is `calls`
// back-to-back MPI_Allreduce calls (16 MiB worth, between 1 and 16) started after an
// MPI_Barrier; a rank's time is its elapsed MPI_Wtime / calls and the sample's time is the
// slowest rank's (MPI_MAX), followed by rank 0's memcpy of the same bytes while the others
// wait without spinning. Buffers are refilled (untimed) before every sample; the median of
// --reps samples is reported after --warmup untimed ones. Rank 0 prints and writes the JSON.
//
// Conventions (GB = 1e9 bytes, sizes in MiB = 2^20 bytes, S = buffer bytes, N = processes):
//   time ms       median time of one all-reduce
//   algbw GB/s    S / time
//   busbw GB/s    algbw * 2(N-1)/N   (nccl-tests' bus bandwidth for all-reduce)
//   memcpy GB/s   S / time of std::memcpy of S bytes on one thread, measured on rank 0
//   bus/memcpy    busbw / memcpy GB/s
// The C API only: Open MPI's and MPICH's deprecated C++ bindings add nothing and warn.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

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
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
    std::vector<double> sizes_mib{1, 16, 64};
    int reps = 11;
    int warmup = 2;
    std::string json;
};

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

[[noreturn]] void usage(const char* prog, int status) {
    if (world_rank() == 0)
        std::fprintf(status ? stderr : stdout,
                     "usage: mpirun -np N %s [--sizes-mb MiB,...] [--reps N] [--warmup N] [--json FILE]\n"
                     "  --sizes-mb LIST  buffer sizes in MiB, comma-separated, fractions allowed (default 1,16,64)\n"
                     "  --reps N         timed samples per figure; the median is reported (default 11)\n"
                     "  --warmup N       untimed samples first (default 2)\n"
                     "  --json FILE      also write the figures as JSON to FILE (rank 0)\n",
                     prog);
    MPI_Finalize();
    std::exit(status);
}

double parse_number(const char* prog, const std::string& flag, const std::string& v, double lo, double hi) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(x >= lo && x <= hi)) {
        if (world_rank() == 0)
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
                if (world_rank() == 0) std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
                usage(argv[0], 2);
            }
            return argv[++i];
        };
        if (a == "--sizes-mb") {
            o.sizes_mib.clear();
            std::stringstream ss(value());
            std::string item;
            while (std::getline(ss, item, ',')) o.sizes_mib.push_back(parse_number(argv[0], a, item, 0, 1 << 16));
            if (o.sizes_mib.empty()) usage(argv[0], 2);
        } else if (a == "--reps") o.reps = int(parse_number(argv[0], a, value(), 1, 1e6));
        else if (a == "--warmup") o.warmup = int(parse_number(argv[0], a, value(), 0, 1e6));
        else if (a == "--json") o.json = value();
        else if (a == "-h" || a == "--help") usage(argv[0], 0);
        else {
            if (world_rank() == 0) std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
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

long calls_per_sample(std::size_t bytes) {
    return std::clamp(long((std::size_t{16} << 20) / std::max<std::size_t>(bytes, 1)), 1L, 16L);
}

void wait_for_all_quietly() {
    MPI_Request request;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    for (int done = 0;;) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (done) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

struct Row {
    int participants = 0;
    double mib = 0;
    std::size_t bytes = 0;
    double seconds = 0, memcpy_seconds = 0;
    double algbw() const { return double(bytes) / seconds * 1e-9; }
    double busbw() const { return algbw() * 2.0 * (participants - 1) / participants; }
    double memcpy_gbps() const { return double(bytes) / memcpy_seconds * 1e-9; }
};

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const Options opt = parse(argc, argv);
    const unsigned hw = std::thread::hardware_concurrency();
    const std::string cpu = cpu_model(), load_before = load_average();

    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::string lib(version, std::size_t(len));
        lib = lib.substr(0, lib.find_first_of(",\n"));
        std::printf("MPI all-reduce benchmark: MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM) across %d processes\n", size);
        std::printf("mpi: %s\ncpu: %s, %u hardware threads\n", lib.c_str(), cpu.c_str(), hw);
        if (unsigned(size) > hw)
            std::printf("note: %d processes on %u hardware threads are oversubscribed: processes take turns on the cores\n",
                        size, hw);
        std::printf("median of %d samples after %d warm-up; GB = 1e9 bytes, sizes in MiB\n", opt.reps, opt.warmup);
        std::printf("algbw = bytes / time; busbw = algbw * 2(N-1)/N (nccl-tests); memcpy = bytes / time, one thread\n");
        std::printf("load average before: %s\n\n", load_before.c_str());
        std::printf("%4s %9s %-13s %10s %11s %11s %12s %11s\n", "N", "MiB", "algorithm", "time ms", "algbw GB/s",
                    "busbw GB/s", "memcpy GB/s", "bus/memcpy");
    }

    std::vector<Row> rows;
    for (double mib : opt.sizes_mib) {
        const std::size_t elements = std::size_t(std::llround(mib * double(1 << 20))) / sizeof(float);
        const std::size_t bytes = elements * sizeof(float);
        if (elements > std::size_t(INT32_MAX)) {
            if (rank == 0) std::fprintf(stderr, "%s: %g MiB is more floats than one MPI_Allreduce count holds\n", argv[0], mib);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        std::vector<float> buf(elements), dst(rank == 0 ? elements : 0);
        const long calls = calls_per_sample(bytes);
        std::vector<double> slowest, copies;
        for (int s = 0; s < opt.warmup + opt.reps; ++s) {
            std::fill(buf.begin(), buf.end(), 1.0f);
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            for (long c = 0; c < calls; ++c)
                MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double mine = (MPI_Wtime() - t0) / double(calls), worst = 0;
            const double want = std::pow(double(size), double(calls));
            if (elements > 0 && want < 1e38 && (buf[0] != float(want) || buf[elements - 1] != float(want))) {
                std::fprintf(stderr, "rank %d: wrong MPI_Allreduce result %g (want %g)\n", rank, double(buf[0]), want);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            // Rank 0 times a memcpy of its buffer in the same sample, so that load from other
            // processes hits both columns alike; the others wait without spinning (MPI_Barrier
            // would busy-poll and take a core from it on a small machine).
            if (rank == 0) {
                const double c0 = MPI_Wtime();
                for (long c = 0; c < calls; ++c) {
                    if (bytes > 0) std::memcpy(dst.data(), buf.data(), bytes);
                    if (elements > 0) buf[std::size_t(c) % elements] += 1.0f;  // each copy observable
                }
                const double copy = (MPI_Wtime() - c0) / double(calls);
                if (s >= opt.warmup) copies.push_back(copy);
                volatile float sink = elements > 0 ? dst[elements / 2] : 0.0f;
                (void)sink;
            }
            wait_for_all_quietly();
            if (s >= opt.warmup) slowest.push_back(worst);
        }
        const double mem = rank == 0 ? median(copies) : 0.0;

        Row r;
        r.participants = size;
        r.mib = mib;
        r.bytes = bytes;
        r.seconds = median(slowest);
        r.memcpy_seconds = mem;
        if (rank == 0) {
            std::printf("%4d %9.4g %-13s %10.3f %11.2f %11.2f %12.2f %11.2f\n", size, mib, "MPI_Allreduce", r.seconds * 1e3,
                        r.algbw(), r.busbw(), r.memcpy_gbps(), r.busbw() / r.memcpy_gbps());
            std::fflush(stdout);
        }
        rows.push_back(r);
    }

    if (rank == 0) {
        const std::string load_after = load_average();
        std::printf("\nload average after: %s\n", load_after.c_str());
        if (!opt.json.empty()) {
            std::ofstream out(opt.json);
            if (!out) {
                std::fprintf(stderr, "%s: cannot write %s\n", argv[0], opt.json.c_str());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            out << "{\n  \"benchmark\": \"mpi_allreduce\",\n  \"transport\": \"MPI processes\",\n"
                << "  \"dtype\": \"float32\",\n  \"op\": \"sum\",\n"
                << "  \"machine\": {\"cpu\": " << json_string(cpu) << ", \"hardware_threads\": " << hw
                << ", \"load_average_before\": " << json_string(load_before)
                << ", \"load_average_after\": " << json_string(load_after) << "},\n"
                << "  \"reps\": " << opt.reps << ",\n  \"warmup\": " << opt.warmup << ",\n"
                << "  \"conventions\": {\"GB\": \"1e9 bytes\", \"mib\": \"2^20 bytes\", \"algbw_gbps\": \"bytes / time\", "
                   "\"busbw_gbps\": \"algbw * 2(N-1)/N\", \"memcpy_gbps\": \"bytes copied / time, one thread, rank 0\"},\n"
                << "  \"rows\": [\n";
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const Row& r = rows[i];
                char buf[640];
                std::snprintf(buf, sizeof buf,
                              "    {\"participants\": %d, \"oversubscribed\": %s, \"mib\": %.6g, \"bytes\": %zu, "
                              "\"algorithm\": \"MPI_Allreduce\", \"seconds\": %.9g, \"algbw_gbps\": %.6g, "
                              "\"busbw_gbps\": %.6g, \"memcpy_seconds\": %.9g, \"memcpy_gbps\": %.6g, "
                              "\"busbw_over_memcpy\": %.6g}%s\n",
                              r.participants, unsigned(r.participants) > hw ? "true" : "false", r.mib, r.bytes,
                              r.seconds, r.algbw(), r.busbw(), r.memcpy_seconds, r.memcpy_gbps(),
                              r.busbw() / r.memcpy_gbps(), i + 1 < rows.size() ? "," : "");
                out << buf;
            }
            out << "  ]\n}\n";
            if (!out) {
                std::fprintf(stderr, "%s: error writing %s\n", argv[0], opt.json.c_str());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            std::printf("wrote %s\n", opt.json.c_str());
        }
    }
    MPI_Finalize();
    return 0;
}
