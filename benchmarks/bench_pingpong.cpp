// bench_pingpong: the latency (alpha) and time per byte (beta) of one message between two MPI
// processes, the cross-process parameters of the cost model (docs/scaling.md).
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/benchmarks/bench_pingpong
//          [--sizes-bytes B,...] [--reps N] [--min-time S] [--json FILE]
//
// Rank 0 sends n bytes to rank 1 (MPI_Send), which sends them back; a sample repeats the round
// trip until it lasts --min-time seconds and reports half a round trip (the one-way time). The
// median of --reps samples is reported per size, and a line t(n) = alpha + n beta is fitted to
// those medians in relative least squares (bench::fit_line): Hockney's model of a point-to-point
// message (R. Hockney, "The communication challenge for MPP", Parallel Computing 20(3), 1994),
// the alpha and beta of every all-reduce formula in docs/scaling.md. Ranks other than 0 and 1
// wait. On one host Open MPI carries the messages through shared memory (its vader BTL).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "bench_common.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
    std::vector<std::int64_t> sizes{8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20, 16 << 20};
    int reps = 9;
    double min_time = 0.02;
    std::string json;
};

int run(const Options& opt, int rank, int size) {
    if (size < 2) {
        if (rank == 0) std::fprintf(stderr, "bench_pingpong: needs 2 processes (mpirun -np 2)\n");
        return 2;
    }
    bench::Machine machine;
    machine.hardware_threads = std::thread::hardware_concurrency();
    std::int64_t largest = 0;
    for (auto s : opt.sizes) largest = std::max(largest, s);
    std::vector<char> buf(std::size_t(std::max<std::int64_t>(largest, 1)), 1);
    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::string lib(version, std::size_t(len));
        lib = lib.substr(0, lib.find_first_of(",\n"));
        machine.extra.push_back({"mpi", lib});
        std::printf("MPI ping-pong between ranks 0 and 1 of %d: one-way time = round trip / 2\n", size);
        std::printf("mpi: %s\ncpu: %s, %ld hardware threads\nload average before: %s\n\n", lib.c_str(), machine.cpu.c_str(),
                    machine.hardware_threads, machine.load_before.c_str());
        std::printf("%12s %14s %12s\n", "bytes", "one-way us", "GB/s");
    }
    std::vector<double> ns, ts;
    for (const std::int64_t n : opt.sizes) {
        std::vector<double> samples;
        for (int s = -1; s < opt.reps; ++s) {  // s = -1: warm-up
            long trips = 1;
            double seconds = 0;
            for (;;) {
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                for (long i = 0; i < trips; ++i) {
                    if (rank == 0) {
                        MPI_Send(buf.data(), int(n), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                        MPI_Recv(buf.data(), int(n), MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    } else if (rank == 1) {
                        MPI_Recv(buf.data(), int(n), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                        MPI_Send(buf.data(), int(n), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
                    }
                }
                seconds = MPI_Wtime() - t0;
                // Rank 0's clock decides for everyone whether the sample was long enough.
                int again = rank == 0 && seconds < opt.min_time && trips < (1L << 30);
                MPI_Bcast(&again, 1, MPI_INT, 0, MPI_COMM_WORLD);
                if (!again) break;
                trips *= 2;
            }
            if (s >= 0) samples.push_back(seconds / double(trips) / 2);
        }
        const double t = bench::median(samples);
        ns.push_back(double(n));
        ts.push_back(t);
        if (rank == 0) std::printf("%12lld %14.3f %12.3f\n", (long long)n, t * 1e6, double(n) / t * 1e-9);
    }
    if (rank != 0) return 0;
    const bench::LineFit f = bench::fit_line(ns, ts);
    machine.load_after = bench::load_average();
    std::printf("\nfit t(n) = alpha + n beta: alpha = %.3f us, beta = %.4g ns/B (%.2f GB/s), largest error %.0f%%\n",
                f.a * 1e6, f.b * 1e9, f.b > 0 ? 1e-9 / f.b : 0.0, 100 * f.max_rel_error);
    std::printf("load average after: %s\n", machine.load_after.c_str());
    if (!opt.json.empty()) {
        cli::Json j;
        j["benchmark"] = "pingpong";
        j["transport"] = "MPI processes (MPI_Send/MPI_Recv)";
        j["processes"] = size;
        j["machine"] = machine.json();
        j["reps"] = opt.reps;
        j["min_time"] = opt.min_time;
        cli::Json rows = cli::Json::array();
        for (std::size_t i = 0; i < ns.size(); ++i)
            rows.push_back({{"bytes", std::int64_t(ns[i])}, {"one_way_seconds", ts[i]}, {"gbps", ns[i] / ts[i] * 1e-9}});
        j["rows"] = rows;
        j["fit"] = {{"model", "t(n) = alpha + n beta (relative least squares)"},
                    {"alpha_seconds", f.a},
                    {"beta_seconds_per_byte", f.b},
                    {"bandwidth_gbps", cli::finite_or_null(1e-9 / f.b)},
                    {"max_relative_error", f.max_rel_error}};
        bench::write_json(opt.json, j);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CLI::App app{"MPI ping-pong between two processes: latency and bandwidth, fitted as alpha + n beta.", "bench_pingpong"};
    Options opt;
    app.add_option("--sizes-bytes", opt.sizes, "message sizes in bytes, comma-separated")
        ->delimiter(',')->transform(cli::integer<std::int64_t>(1, std::int64_t(1) << 30))->capture_default_str();
    app.add_option("--reps", opt.reps, "timed samples per size; the median is reported")
        ->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--min-time", opt.min_time, "a sample repeats the round trip until it lasts this many seconds")
        ->check(cli::number(0, 3600))->capture_default_str();
    app.add_option("--json", opt.json, "also write the figures as JSON to FILE (rank 0)");
    const int status = cli::run(app, argc, argv, [&] { return run(opt, rank, size); }, rank == 0);
    if (status == 1 && size > 1) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
    return status;
}
