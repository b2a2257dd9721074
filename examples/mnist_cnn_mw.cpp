// examples/mnist_cnn --strategy multi_worker_mirrored, run by mpirun (or srun): every process
// runs the same program and reads the same global batches; --replicas is per process. A
// translation unit of its own: it needs MPI, and a build without MPI leaves it out (see
// examples/meson.build and the fallback in mnist_cnn.cpp).
#include "mnist_cnn.hpp"

#include <strata/distribute/multi_worker_mirrored.hpp>

#include <string>

namespace mnist_example {

int multi_worker_rank() { return strata::distribute::collective::mpi::world_rank(); }

Report train_multi_worker(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace sc = strata::distribute::collective;
    const sc::Transport transport = f.transport == "mpi"             ? sc::Transport::Mpi
                                    : f.transport == "shared_memory" ? sc::Transport::SharedMemory
                                                                     : sc::Transport::Auto;
    // The flags that change the result or the files written: every process must have the same
    // (checked when the processes join, before anything else crosses processes). --replicas,
    // --transport and --timeout-ms are the strategy's own settings; --threads and --verbose
    // may differ.
    sd::MultiWorkerOptions mw{.transport = transport};
    mw.settings = {{"--batch-size", std::to_string(f.batch_size)},
                   {"--seed", std::to_string(f.seed)},
                   {"--epochs", std::to_string(f.epochs)},
                   {"--steps-per-epoch", std::to_string(f.steps_per_epoch)},
                   {"--load", f.load},
                   {"--save", f.save},
                   {"--json", f.json},
                   {"--plot", f.plot},
                   {"--tensorboard", f.tensorboard},
                   {"--backup-dir", f.backup_dir},
                   {"--backup-every-steps", std::to_string(f.backup_every_steps)},
                   {"--backup-force", f.backup_force ? "given" : ""},
                   {"training images", std::to_string(mnist.train.size())},
                   {"test images", std::to_string(mnist.test.size())}};
    sd::MultiWorkerMirrored<> s(f.replicas, {.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)}, mw);
    replicas_in_sync = s.num_replicas_in_sync();
    return train(s, f, mnist);
}

}  // namespace mnist_example
