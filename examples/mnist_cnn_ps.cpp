// examples/mnist_cnn --strategy parameter_server: the six sync modes in one instantiation, the
// mode, K and B chosen at run time (sync::Any). A translation unit of its own: see mnist_cnn.hpp.
#include "mnist_cnn.hpp"

#include <strata/distribute/launcher.hpp>
#include <strata/distribute/parameter_server.hpp>
#ifdef MNIST_CNN_HAVE_MPI
#include <strata/distribute/parameter_server_mpi.hpp>  // the same job across the processes of mpirun / srun
#endif

namespace mnist_example {

// One instantiation for every sync mode: the rule, K and B are run-time knobs (sync::Any).
Report train_parameter_server(const Flags& f, const strata::data::Mnist& mnist) {
    namespace sd = strata::distribute;
    namespace ss = strata::sync;
    sd::ParameterServerOptions o;
    if (f.shards > 0) o.partitioner = sd::FixedShards{f.shards};
    o.clock = f.clock == "virtual" ? sd::Clock::Virtual : sd::Clock::Real;
    o.stragglers = sd::Stragglers::parse(f.straggler);
    o.straggler_seed = f.seed;
    o.cores_per_worker = f.threads;
    o.timeout = std::chrono::milliseconds(f.timeout_ms);  // a worker that does not report within it is named
    if (f.sync == "sync") o.rule = ss::Rule::Synchronous;
    else if (f.sync == "ksync") o.rule = ss::Rule::KSync;
    else if (f.sync == "kbatch_sync") o.rule = ss::Rule::KBatchSync;
    else if (f.sync == "kasync") o.rule = ss::Rule::KAsync;
    else if (f.sync == "kbatch_async") o.rule = ss::Rule::KBatchAsync;
    else o.rule = ss::Rule::Asynchronous;
    const bool k_mode = *o.rule != ss::Rule::Synchronous && *o.rule != ss::Rule::Asynchronous;
    o.k = k_mode ? f.k : 0;
    o.staleness_bound = *o.rule == ss::Rule::Asynchronous ? f.staleness : -1;
#ifdef MNIST_CNN_HAVE_MPI
    if (sd::launch_info().size > 1) o.processes = sd::parameter_server_processes(f.workers, f.servers, o.timeout);
#endif
    sd::ParameterServer<strata::place::Host, ss::Any> s(f.workers, f.servers, o);
    return train(s, f, mnist);
}

}  // namespace mnist_example
