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

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

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

Options parse(int argc, char** argv) {
    Options o;
    bench::parse_args(
        argc, argv, usage,
        [&](bench::Args& args, const std::string& a) {
            if (a == "--sizes-mb") {
                o.sizes_mib.clear();
                for (const auto& s : bench::split(args.value())) o.sizes_mib.push_back(args.number(s, 0, 1 << 16));
                if (o.sizes_mib.empty()) args.fail();
            } else if (a == "--reps") o.reps = int(args.number(1, 1e6));
            else if (a == "--warmup") o.warmup = int(args.number(0, 1e6));
            else if (a == "--json") o.json = args.value();
            else return false;
            return true;
        },
        world_rank() == 0);
    return o;
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

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const Options opt = parse(argc, argv);
    const unsigned hw = std::thread::hardware_concurrency();
    bench::Machine machine;
    machine.hardware_threads = hw;

    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::string lib(version, std::size_t(len));
        lib = lib.substr(0, lib.find_first_of(",\n"));
        std::printf("MPI all-reduce benchmark: MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM) across %d processes\n", size);
        std::printf("mpi: %s\ncpu: %s, %u hardware threads\n", lib.c_str(), machine.cpu.c_str(), hw);
        if (unsigned(size) > hw)
            std::printf("note: %d processes on %u hardware threads are oversubscribed: processes take turns on the cores\n",
                        size, hw);
        bench::print_all_reduce_conventions(opt.reps, opt.warmup, machine.load_before);
        std::printf("%4s %9s %-13s %10s %11s %11s %12s %11s\n", "N", "MiB", "algorithm", "time ms", "algbw GB/s",
                    "busbw GB/s", "memcpy GB/s", "bus/memcpy");
    }

    std::vector<bench::AllReduceRow> rows;
    for (double mib : opt.sizes_mib) {
        const std::size_t elements = bench::floats_in_mib(mib);
        const std::size_t bytes = elements * sizeof(float);
        if (elements > std::size_t(INT32_MAX)) {
            if (rank == 0) std::fprintf(stderr, "%s: %g MiB is more floats than one MPI_Allreduce count holds\n", argv[0], mib);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        std::vector<float> buf(elements), dst(rank == 0 ? elements : 0);
        const long calls = bench::calls_per_sample(bytes);
        std::vector<double> slowest, copies;
        for (int s = 0; s < opt.warmup + opt.reps; ++s) {
            std::fill(buf.begin(), buf.end(), 1.0f);
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            for (long c = 0; c < calls; ++c)
                MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double mine = (MPI_Wtime() - t0) / double(calls), worst = 0;
            if (!bench::sum_of_ones_ok(buf, size, calls)) {
                std::fprintf(stderr, "rank %d: wrong MPI_Allreduce result %g (want %g)\n", rank, double(buf[0]),
                             std::pow(double(size), double(calls)));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            // Rank 0 times a memcpy of its buffer in the same sample, so that load from other
            // processes hits both columns alike; the others wait without spinning (MPI_Barrier
            // would busy-poll and take a core from it on a small machine).
            if (rank == 0) {
                const double c0 = MPI_Wtime();
                bench::copy_repeatedly(dst, buf, calls);
                const double copy = (MPI_Wtime() - c0) / double(calls);
                if (s >= opt.warmup) copies.push_back(copy);
            }
            wait_for_all_quietly();
            if (s >= opt.warmup) slowest.push_back(worst);
        }
        const double mem = rank == 0 ? bench::median(copies) : 0.0;

        bench::AllReduceRow r;
        r.participants = size;
        r.mib = mib;
        r.bytes = bytes;
        r.algorithm = "MPI_Allreduce";
        r.seconds = bench::median(slowest);
        r.memcpy_seconds = mem;
        if (rank == 0) {
            std::printf("%4d %9.4g %-13s %10.3f %11.2f %11.2f %12.2f %11.2f\n", size, mib, r.algorithm.c_str(), r.seconds * 1e3,
                        r.algbw(), r.busbw(), r.memcpy_gbps(), r.busbw() / r.memcpy_gbps());
            std::fflush(stdout);
        }
        rows.push_back(r);
    }

    if (rank == 0) {
        machine.load_after = bench::load_average();
        std::printf("\nload average after: %s\n", machine.load_after.c_str());
        if (!opt.json.empty() && !bench::write_json(argv[0], opt.json, [&](std::ostream& out) {
                out << "{\n  \"benchmark\": \"mpi_allreduce\",\n  \"transport\": \"MPI processes\",\n"
                    << "  \"dtype\": \"float32\",\n  \"op\": \"sum\",\n"
                    << "  \"machine\": " << machine.json() << ",\n"
                    << "  \"reps\": " << opt.reps << ",\n  \"warmup\": " << opt.warmup << ",\n"
                    << "  \"conventions\": "
                    << bench::all_reduce_conventions_json("bytes copied / time, one thread, rank 0") << ",\n";
                bench::write_json_rows(out, rows, [&](const bench::AllReduceRow& r) { return r.json_fields(hw); });
                out << "}\n";
            }))
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
    return 0;
}
