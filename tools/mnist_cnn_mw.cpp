// tools/mnist_cnn --strategy multi_worker_mirrored, run by mpirun (or srun): every process
// runs the same program and reads the same global batches; --replicas is per process. A
// translation unit of its own: it needs MPI, and a build without MPI leaves it out (see
// examples/meson.build and the fallback in mnist_cnn.cpp).
#include "mnist_cnn.hpp"

#include <strata/distribute/multi_worker_mirrored.hpp>

#include <cstdio>
#include <string>

namespace mnist_example {

int multi_worker_rank() { return strata::distribute::collective::mpi::world_rank(); }

Report train_multi_worker(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace sc = strata::distribute::collective;
    const sc::Transport transport = f.transport == "mpi"             ? sc::Transport::Mpi
                                    : f.transport == "shared_memory" ? sc::Transport::SharedMemory
                                    : f.transport == "hierarchical"  ? sc::Transport::Hierarchical
                                                                     : sc::Transport::Auto;
    // (The flags every process must share are compared when the processes join: main() gave
    // them to set_job_settings.)
    sd::MultiWorkerOptions mw{.transport = transport};
    sd::MultiWorkerMirrored<> s(f.replicas, {.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)}, mw);
    replicas_in_sync = s.num_replicas_in_sync();
    Report rep = train(s, f, mnist);
    const auto& pg = s.process_group();
    if (pg.rank() == 0 && pg.transport() == sc::Transport::Hierarchical) {
        const auto c = pg.cross_host_stats();  // rank 0 leads host 0
        std::printf("%-28s %d hosts; %lld all-reduces, %.1f MiB from this host, %.3f s (%.3f ms each)\n", "cross-host stage",
                    pg.num_hosts(), (long long)c.calls, double(c.bytes) / double(1 << 20), c.seconds,
                    c.calls > 0 ? c.seconds / double(c.calls) * 1e3 : 0.0);
    }
    return rep;
}

int end_job_with_lost_ranks(const std::string& why, int status) {
    std::fprintf(stderr, "mnist_cnn: %s: ending the job (MPI_Abort, exit status %d) so that no process waits for it\n", why.c_str(),
                 status);
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    return status;
}

}  // namespace mnist_example
