// examples/mnist_cnn --strategy parameter_server: the six sync modes, each one instantiation with K
// and B given at run time (sync::dynamic). A translation unit of its own: see mnist_cnn.hpp.
#include "mnist_cnn.hpp"

namespace mnist_example {

// One instantiation per sync mode; K and B are run-time knobs (sync::dynamic).
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
    auto run = [&]<class Sync>(Sync) {
        sd::ParameterServer<strata::place::Host, Sync> s(f.workers, f.servers, o);
        return train(s, f, mnist);
    };
    if (f.sync == "sync") return run(ss::Synchronous{});
    o.k = f.k;
    if (f.sync == "ksync") return run(ss::KSync<ss::dynamic>{});
    if (f.sync == "kbatch_sync") return run(ss::KBatchSync<ss::dynamic>{});
    if (f.sync == "kasync") return run(ss::KAsync<ss::dynamic>{});
    if (f.sync == "kbatch_async") return run(ss::KBatchAsync<ss::dynamic>{});
    o.k = 0;
    o.staleness_bound = f.staleness;
    return run(ss::Asynchronous<ss::dynamic>{});
}

}  // namespace mnist_example
