// mwm_step: the seed CNN's training step under MultiWorkerMirrored, timed as cost_model times
// Mirrored's (step_timing.hpp), for cost_model's processes x replicas rows.
//
//   mpirun --allow-run-as-root --oversubscribe -np N build/benchmarks/mwm_step --replicas R
//          [--batch 128] [--steps N] [--reps N] [--bucket-bytes B] [--transport auto|shared_memory|mpi]
//          [--json FILE]
//
// Every process runs the same steps on the same synthetic global batch; a sample's figures
// are the slowest process's (MPI_MAX), the median over samples is reported by rank 0.
#include <strata/strata.hpp>
#include <strata/distribute/multi_worker_mirrored.hpp>

#include "../tools/mnist_cnn_net.hpp"
#include "bench_common.hpp"
#include "step_timing.hpp"

#include <cstdio>
#include <string>

namespace {

struct Options {
    int replicas = 1;
    std::int64_t batch = 128;
    int steps = 8;
    int reps = 9;
    std::size_t bucket_bytes = std::size_t(4) << 20;
    std::string transport = "auto";
    std::string json;
};

int run(const Options& opt) {
    namespace sd = strata::distribute;
    sd::MultiWorkerOptions mw;
    mw.transport = opt.transport == "mpi"             ? sd::collective::Transport::Mpi
                   : opt.transport == "shared_memory" ? sd::collective::Transport::SharedMemory
                                                      : sd::collective::Transport::Auto;
    sd::MultiWorkerMirrored<> strategy(opt.replicas, {.bucket_bytes = opt.bucket_bytes}, mw);
    const auto t = bench::time_steps<mnist_example::Net>(strategy, opt.batch, opt.steps, opt.reps, [](double* parts) {
        MPI_Allreduce(MPI_IN_PLACE, parts, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    });
    if (!strategy.is_chief()) return 0;
    std::printf("MultiWorkerMirrored: %d processes x %d replicas (%s transport), global batch %lld, bucket %zu bytes\n",
                strategy.num_workers(), opt.replicas, std::string(sd::collective::to_string(strategy.process_group().transport())).c_str(),
                (long long)opt.batch, opt.bucket_bytes);
    std::printf("step %.3f ms  (compute %.3f, apply %.3f, join %.3f; slowest process, median of %d samples of %d steps)\n",
                t.step * 1e3, t.compute * 1e3, t.apply * 1e3, t.join * 1e3, opt.reps, opt.steps);
    if (!opt.json.empty()) {
        cli::Json j;
        j["benchmark"] = "mwm_step";
        j["processes"] = strategy.num_workers();
        j["replicas"] = opt.replicas;
        j["transport"] = std::string(sd::collective::to_string(strategy.process_group().transport()));
        j["batch"] = opt.batch;
        j["bucket_bytes"] = opt.bucket_bytes;
        j["cores_per_replica"] = strategy.devices()[0].cores;
        j["step_seconds"] = cli::finite_or_null(t.step);
        j["compute_seconds"] = cli::finite_or_null(t.compute);
        j["apply_seconds"] = cli::finite_or_null(t.apply);
        j["join_seconds"] = cli::finite_or_null(t.join);
        bench::write_json(opt.json, j);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CLI::App app{"The seed CNN's MultiWorkerMirrored step, timed (for cost_model).", "mwm_step"};
    Options opt;
    app.add_option("--replicas", opt.replicas, "local replicas per process")->transform(cli::integer(1, 64))->capture_default_str();
    app.add_option("--batch", opt.batch, "global batch")->transform(cli::integer<std::int64_t>(1, 65536))->capture_default_str();
    app.add_option("--steps", opt.steps, "steps per sample")->transform(cli::integer(1, 100000))->capture_default_str();
    app.add_option("--reps", opt.reps, "samples; the median is reported")->transform(cli::integer(1, 1000))->capture_default_str();
    app.add_option("--bucket-bytes", opt.bucket_bytes, "StrategyOptions::bucket_bytes")
        ->transform(cli::integer<std::size_t>(0, std::size_t(1) << 40))->capture_default_str();
    app.add_option("--transport", opt.transport, "MultiWorkerOptions::transport between the processes")
        ->check(cli::one_of({"auto", "shared_memory", "mpi"}))->capture_default_str();
    app.add_option("--json", opt.json, "also write the figures as JSON to FILE (rank 0)");
    const int status = cli::run(app, argc, argv, [&] { return run(opt); }, rank == 0);
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (status == 1 && size > 1) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
    return status;
}
