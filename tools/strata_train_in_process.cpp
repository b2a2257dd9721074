// tools/strata_train --strategy one_device | mirrored | central_storage: the strategies of one
// process, for one model (-DSTRATA_TRAIN_MODEL=NAME; see strata_train_model.hpp). A translation
// unit of its own, so that it compiles beside the command line (see strata_train.hpp).
#define STRATA_TRAIN_DEFINES_NETWORK  // this unit compiles the network's passes
#include "strata_train_model.hpp"

// The network's passes for every host strategy of the model, compiled here once
// (strata_train_model.hpp declares them in the model's other units).
template class strata::nn::Network<strata_train::Net, float, strata::place::Host>;
#if STRATA_TRAIN_SYNC_NET
template class strata::nn::Network<strata_train::SyncNet, float, strata::place::Host>;
#endif

namespace strata_train {

template <class M>
Report train_in_process(const Job& job, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    using Net = typename M::Net;
    const Flags& f = job.flags;
    const sd::StrategyOptions opts{.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)};
    if (f.strategy == "one_device") {
        sd::OneDevice<> s(f.threads);
        replicas_in_sync = 1;
        return train<Net>(s, job);
    }
    // --sync-batch-norm: the network's form whose statistics span every replica.
    auto train_net = [&](auto& s) {
        if constexpr (has_sync_net<M>())
            if (f.sync_bn) return train<typename M::SyncNet>(s, job);
        return train<Net>(s, job);
    };
    if (f.strategy == "mirrored") {
        sd::Mirrored<> s(f.replicas, opts);
        replicas_in_sync = s.num_replicas_in_sync();
        return train_net(s);
    }
    sd::CentralStorage<> s(f.replicas, opts);
    replicas_in_sync = s.num_replicas_in_sync();
    return train_net(s);
}
template Report train_in_process<Model>(const Job&, int&);

}  // namespace strata_train
