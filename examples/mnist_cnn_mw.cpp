// examples/mnist_cnn --strategy multi_worker_mirrored, run by mpirun (or srun): every process
// runs the same program and reads the same global batches; --replicas is per process. A
// translation unit of its own: it needs MPI, and a build without MPI leaves it out (see
// examples/meson.build and the fallback in mnist_cnn.cpp).
#include "mnist_cnn.hpp"

#include <strata/distribute/multi_worker_mirrored.hpp>

namespace mnist_example {

int multi_worker_rank() { return strata::distribute::collective::mpi::world_rank(); }

Report train_multi_worker(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace sc = strata::distribute::collective;
    const sc::Transport transport = f.transport == "mpi"             ? sc::Transport::Mpi
                                    : f.transport == "shared_memory" ? sc::Transport::SharedMemory
                                                                     : sc::Transport::Auto;
    sd::MultiWorkerMirrored<> s(f.replicas, {.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)},
                                {.transport = transport});
    replicas_in_sync = s.num_replicas_in_sync();
    return train(s, f, mnist);
}

}  // namespace mnist_example
