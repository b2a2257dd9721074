// bench_all_gather: the all-gather across processes (float, in place, even parts) that the
// tensor-parallel layers and a split pipeline stage use (ShardGroup::gather over
// ProcessGroup::all_gather), against what it replaced and against the MPI library's own, each
// timed on the same buffers in the same run:
//   MPI_Allgatherv       the MPI library's (Open MPI: its tuned collective over shared memory)
//   strata shm gather    ProcessGroup::all_gather, shared-memory transport (each rank stages its
//                        part of a chunk, every rank copies the others' out)
//   strata shm sum       ProcessGroup::all_reduce of the buffer with every other rank's part set
//                        to -0, shared memory: how ShardGroup::gather gathered until 2026-12-02
//   strata mpi gather    ProcessGroup::all_gather, MPI transport (arrival check, MPI_Iallgatherv)
//   strata mpi sum       the -0-padded sum over the MPI transport (its ring from 256 KiB)
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/benchmarks/bench_all_gather
//          [--sizes-mb MiB,...] [--reps N] [--warmup N] [--json FILE]
//   scripts/multihost --hosts 2 --per-host 1 --link 1gbit -- build/benchmarks/bench_all_gather ...
//          (across hosts: the rows over shared memory are left out)
//
// A sample is `calls` back-to-back calls (16 MiB worth, between 1 and 16) after an MPI_Barrier;
// a rank's time is its elapsed MPI_Wtime / calls and the sample's the slowest rank's (MPI_MAX).
// Before every sample (untimed) each rank writes rank + 1 into its part and 7 elsewhere (-0 for
// the sums); after it every rank checks that it holds every rank's part. The median of --reps
// samples after --warmup untimed ones. Rank 0 prints and writes the JSON.
//
// Columns (GB = 1e9 bytes, sizes in MiB = 2^20 bytes, S = buffer bytes, N = processes):
//   time ms          median time of one call
//   received GB/s    (N-1)/N * S / time: the others' parts, what a gather must bring each rank
//   x sum            the same transport's -0-padded sum's time / this row's time
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "bench_common.hpp"
#include "bench_mpi_common.hpp"

#include <strata/distribute/collective/process_group.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
    std::vector<double> sizes_mib{0.0625, 1, 16, 64};
    int reps = 11;
    int warmup = 2;
    std::string json;
};

void declare_flags(CLI::App& app, Options& o) {
    app.add_option("--sizes-mb", o.sizes_mib, "buffer sizes in MiB, comma-separated, fractions allowed")
        ->delimiter(',')->check(cli::number(0, 1 << 14))->capture_default_str();
    app.add_option("--reps", o.reps, "timed samples per figure; the median is reported")
        ->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed samples first")->transform(cli::integer(0, 1'000'000))->capture_default_str();
    app.add_option("--json", o.json, "also write the figures as JSON to FILE (rank 0)");
}

struct Row {
    double mib = 0;
    std::string method;
    double seconds = 0, vs_sum = 0;
};

int run(const Options& opt, int rank, int size) {
    namespace coll = strata::distribute::collective;
    bench::Machine machine;
    machine.hardware_threads = long(std::thread::hardware_concurrency());
    if (rank == 0) {
        std::printf("all-gather across %d processes (float, in place, even parts): MPI_Allgatherv and strata's ProcessGroup\n", size);
        std::printf("cpu: %s, %ld hardware threads\n", machine.cpu.c_str(), machine.hardware_threads);
        std::printf("median of %d samples after %d warm-up; GB = 1e9 bytes; received = (N-1)/N * bytes / time\n", opt.reps, opt.warmup);
        std::printf("load average before: %s\n", machine.load_before.c_str());
        if (size == 1) std::printf("note: one process holds every part, nothing crosses: run it under mpirun -np 2 or more\n");
        std::printf("\n");
    }
    // Across hosts (a cluster, or scripts/multihost) no shared-memory group spans the ranks: the
    // shm rows are left out.
    const int hosts = bench::count_hosts(size);
    const bool one_host = hosts == 1;
    std::optional<coll::ProcessGroup> shm;
    if (one_host) shm.emplace(MPI_COMM_WORLD, 1, coll::ProcessGroupOptions{.transport = coll::Transport::SharedMemory, .fake_hosts = 0});
    coll::ProcessGroup mpi(MPI_COMM_WORLD, 1, {.transport = coll::Transport::Mpi, .fake_hosts = 0});
    std::vector<std::string> methods = {"MPI_Allgatherv", "strata mpi sum", "strata mpi gather"};
    if (one_host) methods.insert(methods.begin() + 1, {"strata shm sum", "strata shm gather"});
    else if (rank == 0) std::printf("the processes are on %d hosts: no shared-memory rows\n\n", hosts);
    if (rank == 0) std::printf("%4s %9s %-18s %10s %14s %7s\n", "N", "MiB", "method", "time ms", "received GB/s", "x sum");
    std::vector<Row> rows;
    for (const double mib : opt.sizes_mib) {
        const std::size_t elements = bench::floats_in_mib(mib);
        std::vector<std::int64_t> counts(static_cast<std::size_t>(size));
        std::vector<int> icounts(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
        for (int q = 0; q < size; ++q) {
            counts[std::size_t(q)] = std::int64_t(elements) / size + (q < std::int64_t(elements) % size ? 1 : 0);
            icounts[std::size_t(q)] = int(counts[std::size_t(q)]);
            displs[std::size_t(q)] = q == 0 ? 0 : displs[std::size_t(q - 1)] + icounts[std::size_t(q - 1)];
        }
        const std::size_t first = std::size_t(displs[std::size_t(rank)]), last = first + std::size_t(counts[std::size_t(rank)]);
        std::vector<float> buf(elements);
        const long calls = bench::calls_per_sample(elements * sizeof(float));
        double sum_seconds = 0;
        for (const auto& m : methods) {
            const bool padded = m.find(" sum") != std::string::npos;
            auto fill = [&] {
                for (std::size_t i = 0; i < elements; ++i) buf[i] = i >= first && i < last ? float(rank + 1) : padded ? -0.0f : 7.0f;
            };
            auto once = [&] {
                if (m == "MPI_Allgatherv")
                    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data(), icounts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
                else if (m == "strata shm gather") shm->all_gather(0, std::span<float>(buf), std::span<const std::int64_t>(counts));
                else if (m == "strata mpi gather") mpi.all_gather(0, std::span<float>(buf), std::span<const std::int64_t>(counts));
                else (m == "strata shm sum" ? *shm : mpi).all_reduce(0, std::span<float>(buf));
            };
            std::vector<double> slowest;
            for (int s = 0; s < opt.warmup + opt.reps; ++s) {
                fill();
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                // The sum's later calls add the gathered buffer to itself N-fold; only the first
                // call's result is checked (the time is the same either way).
                for (long c = 0; c < calls; ++c) once();
                const double mine = (MPI_Wtime() - t0) / double(calls);
                double worst = 0;
                MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (s >= opt.warmup) slowest.push_back(worst);
            }
            // Checked once per method and size, outside the timing: one call on a fresh fill.
            fill();
            once();
            for (int q = 0; q < size; ++q) {
                const std::size_t b = std::size_t(displs[std::size_t(q)]), e = b + std::size_t(counts[std::size_t(q)]);
                if (b < e && (buf[b] != float(q + 1) || buf[e - 1] != float(q + 1))) {
                    std::fprintf(stderr, "rank %d: %s at %g MiB: rank %d's part holds %g\n", rank, m.c_str(), mib, q, double(buf[b]));
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
            Row r{mib, m, bench::median(slowest), 0};
            if (padded) sum_seconds = r.seconds;
            r.vs_sum = m.find(" gather") != std::string::npos && sum_seconds > 0 ? sum_seconds / r.seconds : 0;
            if (rank == 0) {
                const double received = double(elements * sizeof(float)) * (size - 1) / size;
                std::printf("%4d %9.4g %-18s %10.3f %14.2f %7s\n", size, mib, m.c_str(), r.seconds * 1e3, received / r.seconds * 1e-9,
                            r.vs_sum > 0 ? bench::format("%.2f", r.vs_sum).c_str() : "");
                std::fflush(stdout);
            }
            rows.push_back(r);
        }
    }
    if (rank == 0) {
        machine.load_after = bench::load_average();
        std::printf("\nload average after: %s\n", machine.load_after.c_str());
        if (!opt.json.empty()) {
            cli::Json j;
            j["benchmark"] = "all_gather";
            j["processes"] = size;
            j["hosts"] = hosts;
            j["dtype"] = "float32";
            j["machine"] = machine.json();
            j["reps"] = opt.reps;
            j["warmup"] = opt.warmup;
            cli::Json jr = cli::Json::array();
            for (const auto& r : rows) {
                cli::Json e;
                e["mib"] = r.mib;
                e["method"] = r.method;
                e["seconds"] = r.seconds;
                e["received_gbps"] = double(bench::floats_in_mib(r.mib) * sizeof(float)) * (size - 1) / size / r.seconds * 1e-9;
                e["speedup_vs_padded_sum"] = r.vs_sum;
                jr.push_back(e);
            }
            j["rows"] = jr;
            bench::write_json(opt.json, j);
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    return bench::mpi_main(argc, argv, "The all-gather across processes: strata's against the -0-padded sum it replaced and MPI_Allgatherv.",
                           "bench_all_gather", [&](CLI::App& app) { declare_flags(app, opt); },
                           [&](int rank, int size) { return run(opt, rank, size); });
}
