// tools/strata_train --strategy multi_worker_mirrored, for one model (-DSTRATA_TRAIN_MODEL=NAME;
// see strata_train_model.hpp), run by mpirun (or srun): every process runs the same program and
// reads the same global batches; --replicas is per process. A translation unit of its own: it
// needs MPI, and a build without MPI leaves it out (tools/meson.build; the driver then says the
// build has no MPI).
#include "strata_train_model.hpp"

#include <strata/distribute/multi_worker_mirrored.hpp>

#include <cstdio>

namespace strata_train {

template <class M>
Report train_multi_worker(const Job& job, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace sc = strata::distribute::collective;
    const Flags& f = job.flags;
    const sc::Transport transport = f.transport == "mpi"             ? sc::Transport::Mpi
                                    : f.transport == "shared_memory" ? sc::Transport::SharedMemory
                                    : f.transport == "hierarchical"  ? sc::Transport::Hierarchical
                                                                     : sc::Transport::Auto;
    // (The flags every process must share are compared when the processes join: run() gave
    // them to set_job_settings.)
    sd::MultiWorkerOptions mw{.transport = transport};
    sd::MultiWorkerMirrored<> s(f.replicas, {.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)}, mw);
    replicas_in_sync = s.num_replicas_in_sync();
    Report rep = [&] {
        if constexpr (has_sync_net<M>())
            if (f.sync_bn) return train<typename M::SyncNet>(s, job);  // --sync-batch-norm
        return train<typename M::Net>(s, job);
    }();
    const auto& pg = s.process_group();
    if (pg.rank() == 0 && pg.transport() == sc::Transport::Hierarchical) {
        const auto c = pg.cross_host_stats();  // rank 0 leads host 0
        std::printf("%-28s %d hosts; %lld all-reduces, %.1f MiB from this host, %.3f s (%.3f ms each)\n", "cross-host stage",
                    pg.num_hosts(), (long long)c.calls, double(c.bytes) / double(1 << 20), c.seconds,
                    c.calls > 0 ? c.seconds / double(c.calls) * 1e3 : 0.0);
    }
    return rep;
}
template Report train_multi_worker<Model>(const Job&, int&);

}  // namespace strata_train
