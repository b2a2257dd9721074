// bench_hier_model: the two-level cost model of the hierarchical all-reduce (docs/scaling.md,
// "Two levels"), checked against the hierarchical transport in the same run.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 build/benchmarks/bench_hier_model
//          [--sizes-mb 16,64] [--reps 7] [--warmup 1] [--cores C] [--json FILE]
//
// The processes are declared to be 2 hosts of N/2 (fake_hosts = 2; N even, at least 4). Every
// sample times, one after the other, each level alone and then the whole:
//   T_shm    the shared-memory all-reduce of host 0's ranks, the other host idle
//   T_bcast  the shared-memory broadcast from host 0's leader to its ranks, the other host idle
//   T_mpi    the MPI all-reduce (arrival check + MPI_Iallreduce) of the 2 leaders, the rest idle
//   T_hier   the hierarchical all-reduce of all N ranks (and, on rank 0, its cross-host stage)
// so that load from other processes on a shared machine hits the calibration and the check
// alike (calibrating in one run and checking in another failed by 46-330% under a changing load).
// The model composes the levels with the share factors of C cores:
//   T_hier = s_in * (T_shm + T_bcast) + s_x * T_mpi,  s_in = max(1, N / C), s_x = max(1, 2 / C)
// (every process works in the intra-host stages, which run on both hosts at once; only the
// leaders between hosts). Medians of --reps samples; rank 0 prints and writes the JSON.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "bench_common.hpp"

#include <strata/distribute/collective/process_group.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace coll = strata::distribute::collective;

struct Options {
    std::vector<double> sizes_mib{16, 64};
    int reps = 7;
    int warmup = 1;
    int cores = 0;  // 0: the hardware threads
    std::string json;
};

void quiet_barrier(MPI_Comm c) {
    MPI_Request r;
    MPI_Ibarrier(c, &r);
    for (int done = 0;;) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (done) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

// Times f on the ranks where `active` (their communicator `c`), the others idle; the slowest
// active rank's seconds. The active ranks start together (an MPI_Barrier among them after the
// quiet one, whose 1 ms polls would otherwise let them start up to 1 ms apart).
template <class F>
double timed(bool active, MPI_Comm c, F&& f) {
    quiet_barrier(MPI_COMM_WORLD);
    double mine = 0;
    if (active) {
        MPI_Barrier(c);
        const double t0 = MPI_Wtime();
        f();
        mine = MPI_Wtime() - t0;
    }
    double worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int run(const Options& opt, int rank, int size) {
    if (size < 4 || size % 2 != 0) {
        if (rank == 0) std::fprintf(stderr, "bench_hier_model: expected an even number of processes >= 4, found %d\n", size);
        return 2;
    }
    const int cores = opt.cores > 0 ? opt.cores : int(std::thread::hardware_concurrency());
    const int g = size / 2;
    const int host = rank / g, local = rank % g;
    MPI_Comm host_comm, leader_comm;
    MPI_Comm_split(MPI_COMM_WORLD, host, rank, &host_comm);
    MPI_Comm_split(MPI_COMM_WORLD, local == 0 ? 0 : MPI_UNDEFINED, rank, &leader_comm);
    coll::ProcessGroup inner(host_comm, 1, {.transport = coll::Transport::SharedMemory, .fake_hosts = 0});
    std::unique_ptr<coll::ProcessGroup> leaders;
    if (local == 0) leaders = std::make_unique<coll::ProcessGroup>(leader_comm, 1, coll::ProcessGroupOptions{.transport = coll::Transport::Mpi, .fake_hosts = 0});
    coll::ProcessGroup hier(MPI_COMM_WORLD, 1, {.transport = coll::Transport::Hierarchical, .fake_hosts = 2});
    const double s_in = std::max(1.0, double(size) / cores), s_x = std::max(1.0, 2.0 / cores);
    bench::Machine machine;
    if (rank == 0)
        std::printf("two-level model: 2 hosts x %d processes (declared), %d cores: s_in = %g, s_x = %g; load average before: %s\n"
                    "%6s %9s %9s %9s | %10s %10s %7s | %10s %10s %7s | %10s %10s %7s\n",
                    g, cores, s_in, s_x, machine.load_before.c_str(), "MiB", "T_shm", "T_bcast", "T_mpi", "inner pred",
                    "inner meas", "err", "cross pred", "cross meas", "err", "hier pred", "hier meas", "err");
    cli::Json rows = cli::Json::array();
    double worst = 0;
    for (double mib : opt.sizes_mib) {
        const std::size_t n = bench::floats_in_mib(mib);
        std::vector<float> buf(n, 1.0f);
        std::vector<double> shm, bc, mpi, whole, cross;
        for (int s = 0; s < opt.warmup + opt.reps; ++s) {
            const double a = timed(host == 0, host_comm, [&] { inner.all_reduce(0, std::span<float>(buf)); });
            const double b = timed(host == 0, host_comm, [&] { inner.broadcast(0, std::span<float>(buf), 0); });
            const double c = timed(local == 0, leader_comm, [&] { leaders->all_reduce(0, std::span<float>(buf)); });
            const auto before = hier.cross_host_stats();
            const double d = timed(true, MPI_COMM_WORLD, [&] { hier.all_reduce(0, std::span<float>(buf)); });
            const double x = hier.cross_host_stats().seconds - before.seconds;  // rank 0's
            std::fill(buf.begin(), buf.end(), 1.0f);
            if (s < opt.warmup) continue;
            shm.push_back(a);
            bc.push_back(b);
            mpi.push_back(c);
            whole.push_back(d);
            cross.push_back(x);
        }
        const double T_shm = bench::median(shm), T_bc = bench::median(bc), T_mpi = bench::median(mpi);
        const double T_hier = bench::median(whole), T_cross = bench::median(cross);
        const double inner_pred = s_in * (T_shm + T_bc), cross_pred = s_x * T_mpi, pred = inner_pred + cross_pred;
        auto err = [](double p, double m) { return (p - m) / m * 100; };
        worst = std::max(worst, std::abs(err(pred, T_hier)));
        if (rank == 0) {
            std::printf("%6g %9.2f %9.2f %9.2f | %10.2f %10.2f %+6.1f%% | %10.2f %10.2f %+6.1f%% | %10.2f %10.2f %+6.1f%%\n", mib,
                        T_shm * 1e3, T_bc * 1e3, T_mpi * 1e3, inner_pred * 1e3, (T_hier - T_cross) * 1e3,
                        err(inner_pred, T_hier - T_cross), cross_pred * 1e3, T_cross * 1e3, err(cross_pred, T_cross), pred * 1e3,
                        T_hier * 1e3, err(pred, T_hier));
            std::fflush(stdout);
            cli::Json r;
            r["mib"] = mib;
            r["shm_s"] = T_shm;
            r["bcast_s"] = T_bc;
            r["mpi_s"] = T_mpi;
            r["hier_s"] = T_hier;
            r["cross_host_s"] = T_cross;
            r["predicted_s"] = pred;
            r["error_percent"] = err(pred, T_hier);
            rows.push_back(r);
        }
    }
    if (rank == 0) {
        machine.load_after = bench::load_average();
        std::printf("largest error of the whole: %.1f%% (%s 15%%); load average after: %s\n", worst,
                    worst <= 15 ? "within" : "NOT within", machine.load_after.c_str());
        if (!opt.json.empty()) {
            cli::Json j;
            j["benchmark"] = "hier_model";
            j["processes"] = size;
            j["hosts"] = 2;
            j["cores"] = cores;
            j["s_in"] = s_in;
            j["s_x"] = s_x;
            j["reps"] = opt.reps;
            j["machine"] = machine.json();
            j["rows"] = rows;
            bench::write_json(opt.json, j);
        }
    }
    leaders.reset();
    if (leader_comm != MPI_COMM_NULL) MPI_Comm_free(&leader_comm);
    MPI_Comm_free(&host_comm);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CLI::App app{"The two-level cost model of the hierarchical all-reduce, checked in one run.", "bench_hier_model"};
    Options opt;
    app.add_option("--sizes-mb", opt.sizes_mib, "buffer sizes in MiB, comma-separated")
        ->delimiter(',')->check(cli::number(0, 1 << 12))->capture_default_str();
    app.add_option("--reps", opt.reps, "timed samples per figure; the median is reported")
        ->transform(cli::integer(1, 100000))->capture_default_str();
    app.add_option("--warmup", opt.warmup, "untimed samples first")->transform(cli::integer(0, 100000))->capture_default_str();
    app.add_option("--cores", opt.cores, "cores the model shares among the processes (0: the hardware threads)")
        ->transform(cli::integer(0, 1 << 16))->capture_default_str();
    app.add_option("--json", opt.json, "also write the figures as JSON to FILE (rank 0)");
    const int status = cli::run(app, argc, argv, [&] { return run(opt, rank, size); }, rank == 0);
    if (status == 1 && size > 1) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
    return status;
}
