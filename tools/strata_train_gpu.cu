// tools/strata_train --device gpu, for one model (-DSTRATA_TRAIN_MODEL=NAME; see
// strata_train_model.hpp): the in-process strategies (and the parameter server's workers) with
// CUDA tensors. Compiled by nvcc wherever it is found (tools/meson.build), so that the same
// binary offers both devices; where it is not, the driver says the program was built without
// CUDA. Being in the program, this unit also registers the CUDA calls that let strata::place
// list the GPUs.
#include "strata_train_model.hpp"
#include "strata_train_ps.hpp"

namespace strata_train {

namespace {

template <class Net>
Report train_cuda(const Job& job, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace pd = strata::place;
    using Cuda = pd::Cuda;
    const Flags& f = job.flags;
    const auto gpus = pd::list_physical_devices(pd::DeviceKind::Gpu);
    if (gpus.empty()) throw strata::DeviceError("--device gpu: no GPU is visible to this process");
    // --logical-gpus N: N logical GPUs carved from the first GPU, each with its own stream and an
    // equal share of --gpu-memory-mb (or of no limit), as tf.config.set_logical_device_configuration.
    // parameter_server: one worker per logical GPU; with fewer GPUs than workers and no
    // --logical-gpus, the first GPU is carved into as many logical GPUs as there are workers.
    const int carve = f.logical_gpus > 0 ? f.logical_gpus
                      : (f.strategy == "parameter_server" && int(gpus.size()) < f.workers) ? f.workers : 0;
    if (carve > 0) {
        std::vector<pd::LogicalDeviceConfiguration> parts(static_cast<std::size_t>(carve));
        for (auto& p : parts)
            if (f.gpu_memory_mb > 0) p.memory_limit = pd::Megabytes{std::size_t(f.gpu_memory_mb) / std::size_t(carve)};
        pd::set_logical_device_configuration(gpus[0], parts);
    } else if (f.gpu_memory_mb > 0) {
        pd::set_logical_device_configuration(gpus[0], {{.memory_limit = pd::Megabytes{std::size_t(f.gpu_memory_mb)}}});
    }
    const int devices = int(pd::list_logical_devices(pd::DeviceKind::Gpu).size());
    const sd::StrategyOptions opts{.timeout = std::chrono::milliseconds(f.timeout_ms)};
    // Mirrored and CentralStorage: one replica per logical GPU unless --replicas says fewer.
    const int replicas = f.replicas_given ? f.replicas : std::max(1, devices);
    if (f.strategy == "one_device") {
        sd::OneDevice<Cuda> s;
        replicas_in_sync = 1;
        return train<Net>(s, job);
    }
    if (f.strategy == "mirrored") {
        sd::Mirrored<Cuda> s(replicas, opts);
        replicas_in_sync = s.num_replicas_in_sync();
        return train<Net>(s, job);
    }
    if (f.strategy == "central_storage") {
        sd::CentralStorage<Cuda> s(replicas, opts);
        replicas_in_sync = s.num_replicas_in_sync();
        return train<Net>(s, job);
    }
    if (f.strategy == "parameter_server") {
        // Workers compute on the logical GPUs; every sync mode through one instantiation (sync::Any).
        sd::ParameterServer<Cuda, strata::sync::Any> s(f.workers, f.servers, ps_options(f));
        replicas_in_sync = f.workers;
        return train<Net>(s, job);
    }
    throw strata::ValueError("--device gpu: --strategy " + f.strategy +
                             " does not train on the GPU in this program yet; use --device cpu (one_device, mirrored, "
                             "central_storage and parameter_server train on the GPU)");
}

}  // namespace

template <class M>
Report train_on_gpu(const Job& job, int& replicas_in_sync) {
    // A model whose layers have no CUDA kernels (on_gpu() false) compiles nothing here; the
    // driver never calls it (its entry has no GPU trainer).
    if constexpr (on_gpu<M>()) return train_cuda<typename M::Net>(job, replicas_in_sync);
    else throw strata::ValueError("--device gpu: --model " + job.flags.model + " does not train on the GPU yet");
}
template Report train_on_gpu<Model>(const Job&, int&);

}  // namespace strata_train
