// tools/mnist_cnn --strategy one_device | mirrored | central_storage: the strategies of one
// process. A translation unit of its own, so that it compiles beside the command line (see
// mnist_cnn.hpp).
#include "mnist_cnn.hpp"

// The network's passes for every host strategy of the tool, compiled here once (mnist_cnn.hpp
// declares them in the other units).
template class strata::nn::Network<mnist_example::Net, float, strata::place::Host>;

namespace mnist_example {

Report train_in_process(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    const sd::StrategyOptions opts{.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)};
    if (f.strategy == "one_device") {
        sd::OneDevice<> s(f.threads);
        replicas_in_sync = 1;
        return train(s, f, mnist);
    }
    if (f.strategy == "mirrored") {
        sd::Mirrored<> s(f.replicas, opts);
        replicas_in_sync = s.num_replicas_in_sync();
        return train(s, f, mnist);
    }
    sd::CentralStorage<> s(f.replicas, opts);
    replicas_in_sync = s.num_replicas_in_sync();
    return train(s, f, mnist);
}

}  // namespace mnist_example
