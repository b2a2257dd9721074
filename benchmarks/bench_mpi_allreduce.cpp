// bench_mpi_allreduce: all-reduce (sum, float, in place) across processes, with the same sizes,
// method and columns as bench_allreduce, so the two tables can be read side by side. Three
// implementations, each timed on the same buffers in the same run:
//   MPI_Allreduce        the MPI library's own (Open MPI: its tuned collective over shared memory)
//   strata shm           strata's ProcessGroup, shared-memory transport (MultiWorkerMirrored's
//                        cross-process stage on one host: an MPI-3 shared window, direct
//                        reduce-scatter + all-gather through per-rank staging buffers)
//   strata mpi           strata's ProcessGroup, MPI transport (arrival check, then its ring of
//                        point-to-point steps from --ring-min-kb on, MPI_Iallreduce below it)
//   strata hier          strata's ProcessGroup, hierarchical transport over --fake-hosts H hosts of
//                        N/H consecutive ranks (shared memory inside a host, the MPI transport
//                        between the H leaders, broadcast back inside); its cross-host stage's time
//                        per call is printed below the table (and written as cross_host_ms)
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/benchmarks/bench_mpi_allreduce
//          [--sizes-mb MiB,...] [--reps N] [--warmup N] [--fake-hosts H] [--ring-min-kb K] [--json FILE]
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
#include "bench_mpi_common.hpp"

#include <strata/distribute/collective/process_group.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
    std::vector<double> sizes_mib{1, 16, 64};
    int reps = 11;
    int warmup = 2;
    std::size_t chunk_kib = 512;
    int fake_hosts = 0;  // 0: 2 when the processes divide by 2, else 1
    long ring_min_kib = long(strata::distribute::collective::ProcessGroupOptions{}.ring_min_bytes >> 10);  // -1: never
    std::string json;
};

/// Declares the flags on `app`, with their ranges.
void declare_flags(CLI::App& app, Options& o) {
    app.add_option("--sizes-mb", o.sizes_mib, "buffer sizes in MiB, comma-separated, fractions allowed")
        ->delimiter(',')->check(cli::number(0, 1 << 16))->capture_default_str();
    app.add_option("--reps", o.reps, "timed samples per figure; the median is reported")
        ->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed samples first")->transform(cli::integer(0, 1'000'000))->capture_default_str();
    app.add_option("--chunk-kb", o.chunk_kib, "strata shm: staging bytes per chunk, KiB (ProcessGroupOptions::chunk_bytes)")
        ->transform(cli::integer<std::size_t>(1, 1 << 20))->capture_default_str();
    app.add_option("--fake-hosts", o.fake_hosts, "strata hier: pretend the processes run on H hosts (0: 2 when -np is even)")
        ->transform(cli::integer(0, 1 << 16))->capture_default_str();
    app.add_option("--ring-min-kb", o.ring_min_kib,
                   "strata mpi and hier: buffers of at least K KiB go through the MPI transport's ring, smaller ones "
                   "through MPI_Iallreduce (ProcessGroupOptions::ring_min_bytes); -1: MPI_Iallreduce always")
        ->transform(cli::integer<long>(-1, 1 << 30))->capture_default_str();
    app.add_option("--json", o.json, "also write the figures as JSON to FILE (rank 0)");
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

/// The whole benchmark on this rank: rank 0 prints the table and writes the JSON. Returns the
/// exit status.
int run(const Options& opt, int rank, int size, const char* prog) {
    const unsigned hw = std::thread::hardware_concurrency();
    bench::Machine machine;
    machine.hardware_threads = hw;
    const int real_hosts = bench::count_hosts(size);  // (every rank: a collective)

    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::string lib(version, std::size_t(len));
        lib = lib.substr(0, lib.find_first_of(",\n"));
        std::printf("all-reduce across %d processes: MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM) and strata's ProcessGroup\n", size);
        std::printf("mpi: %s\ncpu: %s, %u hardware threads\n", lib.c_str(), machine.cpu.c_str(), hw);
        if (unsigned(size) > hw)
            std::printf("note: %d processes on %u hardware threads are oversubscribed: processes take turns on the cores\n",
                        size, hw);
        if (real_hosts > 1)
            std::printf("%d processes on %d hosts: no shared-memory group over them all (strata shm left out); strata hier "
                        "over the real hosts%s\n", size, real_hosts, opt.fake_hosts > 0 ? " (--fake-hosts overrides them)" : "");
        bench::print_all_reduce_conventions(opt.reps, opt.warmup, machine.load_before);
        std::printf("%4s %9s %-13s %10s %11s %11s %12s %11s %9s\n", "N", "MiB", "algorithm", "time ms", "algbw GB/s",
                    "busbw GB/s", "memcpy GB/s", "bus/memcpy", "x MPI");
    }

    namespace coll = strata::distribute::collective;
    // The real hosts (MPI_Get_processor_name, as ProcessGroup finds them): on one host the flat
    // transports see it and the hierarchical one a declared layout; across hosts (a cluster, or
    // scripts/multihost) there is no shared-memory group over every rank, and the hierarchical
    // transport takes the real layout unless --fake-hosts says otherwise.
    std::optional<coll::ProcessGroup> shm;
    if (real_hosts == 1)
        shm.emplace(MPI_COMM_WORLD, 1,
                    coll::ProcessGroupOptions{.transport = coll::Transport::SharedMemory, .chunk_bytes = opt.chunk_kib << 10, .fake_hosts = 0});
    const std::size_t ring_min = opt.ring_min_kib < 0 ? SIZE_MAX : std::size_t(opt.ring_min_kib) << 10;
    coll::ProcessGroup mpi(MPI_COMM_WORLD, 1, {.transport = coll::Transport::Mpi, .fake_hosts = 0, .ring_min_bytes = ring_min});
    const int hosts = opt.fake_hosts > 0 ? opt.fake_hosts : real_hosts > 1 ? real_hosts : size % 2 == 0 ? 2 : 1;
    coll::ProcessGroup hier(MPI_COMM_WORLD, 1,
                            {.transport = coll::Transport::Hierarchical, .chunk_bytes = opt.chunk_kib << 10,
                             .fake_hosts = opt.fake_hosts > 0 || real_hosts == 1 ? hosts : 0, .ring_min_bytes = ring_min});
    std::vector<const char*> methods = {"MPI_Allreduce", "strata shm", "strata mpi", "strata hier"};
    if (!shm) methods.erase(methods.begin() + 1);
    struct Cross {
        double mib, ms_per_call, mib_per_call;
    };
    std::vector<Cross> cross;

    std::vector<bench::AllReduceRow> rows;
    for (double mib : opt.sizes_mib) {
        const std::size_t elements = bench::floats_in_mib(mib);
        const std::size_t bytes = elements * sizeof(float);
        if (elements > std::size_t(INT32_MAX)) {
            if (rank == 0) std::fprintf(stderr, "%s: %g MiB is more floats than one MPI_Allreduce count holds\n", prog, mib);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        std::vector<float> buf(elements), dst(rank == 0 ? elements : 0);
        const long calls = bench::calls_per_sample(bytes);
        double mpi_seconds = 0;
        for (const char* method : methods) {
            const std::string m = method;
            auto once = [&] {
                if (m == "MPI_Allreduce") MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                else if (m == "strata shm") shm->all_reduce(0, std::span<float>(buf));
                else if (m == "strata hier") hier.all_reduce(0, std::span<float>(buf));
                else mpi.all_reduce(0, std::span<float>(buf));
            };
            std::vector<double> slowest, copies;
            coll::CrossHostStats cross_before{};
            for (int s = 0; s < opt.warmup + opt.reps; ++s) {
                if (s == opt.warmup) cross_before = hier.cross_host_stats();
                std::fill(buf.begin(), buf.end(), 1.0f);
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                for (long c = 0; c < calls; ++c) once();
                double mine = (MPI_Wtime() - t0) / double(calls), worst = 0;
                if (!bench::sum_of_ones_ok(buf, size, calls)) {
                    std::fprintf(stderr, "rank %d: wrong %s result %g (want %g)\n", rank, method, double(buf[0]),
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
            if (m == "strata hier") {
                const auto after = hier.cross_host_stats();  // rank 0 leads host 0
                const double calls_timed = double(after.calls - cross_before.calls);
                if (calls_timed > 0)
                    cross.push_back({mib, (after.seconds - cross_before.seconds) / calls_timed * 1e3,
                                     double(after.bytes - cross_before.bytes) / calls_timed / double(1 << 20)});
            }

            bench::AllReduceRow r;
            r.participants = size;
            r.mib = mib;
            r.bytes = bytes;
            r.algorithm = m;
            r.seconds = bench::median(slowest);
            r.memcpy_seconds = mem;
            if (m == "MPI_Allreduce") mpi_seconds = r.seconds;
            r.speedup_vs_baseline = mpi_seconds > 0 ? mpi_seconds / r.seconds : 0;
            if (rank == 0) {
                std::printf("%4d %9.4g %-13s %10.3f %11.2f %11.2f %12.2f %11.2f %9.2f\n", size, mib, r.algorithm.c_str(),
                            r.seconds * 1e3, r.algbw(), r.busbw(), r.memcpy_gbps(), r.busbw() / r.memcpy_gbps(),
                            r.speedup_vs_baseline);
                std::fflush(stdout);
            }
            rows.push_back(r);
        }
    }

    if (rank == 0 && !cross.empty()) {
        std::printf("\nstrata hier: %d hosts of %d processes (%s); its cross-host stage (the MPI transport between "
                    "the %d leaders, arrival check included), mean of the timed calls on rank 0:\n", hosts, size / hosts,
                    real_hosts > 1 && opt.fake_hosts == 0 ? "real" : "declared", hosts);
        for (const auto& c : cross) std::printf("  %9.4g MiB: %8.3f ms per call, %g MiB sent into it per call\n", c.mib, c.ms_per_call, c.mib_per_call);
    }
    if (rank == 0) {
        machine.load_after = bench::load_average();
        std::printf("\nload average after: %s\n", machine.load_after.c_str());
        if (!opt.json.empty()) {
            cli::Json j;
            j["benchmark"] = "mpi_allreduce";
            j["baseline"] = "MPI_Allreduce";  // speedup_vs_baseline: its time / the row's time
            j["transport"] = "MPI processes";
            j["dtype"] = "float32";
            j["op"] = "sum";
            j["ring_min_bytes"] = opt.ring_min_kib < 0 ? -1.0 : double(ring_min);
            j["machine"] = machine.json();
            j["reps"] = opt.reps;
            j["warmup"] = opt.warmup;
            j["conventions"] = bench::all_reduce_conventions_json("bytes copied / time, one thread, rank 0");
            cli::Json json_rows = cli::Json::array();
            for (const auto& r : rows) json_rows.push_back(r.json(hw));
            j["rows"] = json_rows;
            j["hier_hosts"] = hosts;
            j["real_hosts"] = real_hosts;
            cli::Json cj = cli::Json::array();
            for (const auto& c : cross) {
                cli::Json e;
                e["mib"] = c.mib;
                e["cross_host_ms"] = c.ms_per_call;
                e["cross_host_mib_per_call"] = c.mib_per_call;
                cj.push_back(e);
            }
            j["hier_cross_host"] = cj;
            bench::write_json(opt.json, j);
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    return bench::mpi_main(argc, argv, "MPI_Allreduce across processes, the baseline for bench_allreduce.", "bench_mpi_allreduce",
                           [&](CLI::App& app) { declare_flags(app, opt); },
                           [&](int rank, int size) { return run(opt, rank, size, argv[0]); });
}
