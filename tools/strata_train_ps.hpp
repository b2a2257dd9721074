#pragma once
// The parameter server's options from strata_train's flags: shared by the host unit
// (strata_train_ps.cpp) and the GPU unit (strata_train_gpu.cu), which both train one
// ParameterServer<Place, sync::Any> with them.
#include "strata_train.hpp"

#include <strata/distribute/parameter_server.hpp>

namespace strata_train {

// The rule, K and B are run-time knobs (sync::Any): one instantiation for every sync mode.
inline strata::distribute::ParameterServerOptions ps_options(const Flags& f) {
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
    return o;
}

}  // namespace strata_train
