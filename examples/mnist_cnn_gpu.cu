// examples/mnist_cnn --device gpu: the in-process strategies with CUDA tensors. Compiled by nvcc
// wherever it is found (examples/meson.build), so that the same binary offers both devices;
// where it is not, mnist_cnn_nogpu.cpp says the program was built without CUDA. Being in the
// program, this unit also registers the CUDA calls that let strata::place list the GPUs.
#include "mnist_cnn.hpp"

namespace mnist_example {

bool built_with_cuda() { return true; }

Report train_on_gpu(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace pd = strata::place;
    using Cuda = pd::Cuda;
    const auto gpus = pd::list_physical_devices(pd::DeviceKind::Gpu);
    if (gpus.empty()) throw strata::DeviceError("--device gpu: no GPU is visible to this process");
    // --logical-gpus N: N logical GPUs carved from the first GPU, each with its own stream and an
    // equal share of --gpu-memory-mb (or of no limit), as tf.config.set_logical_device_configuration.
    if (f.logical_gpus > 0) {
        std::vector<pd::LogicalDeviceConfiguration> parts(std::size_t(f.logical_gpus));
        for (auto& p : parts)
            if (f.gpu_memory_mb > 0) p.memory_limit = pd::Megabytes{std::size_t(f.gpu_memory_mb) / std::size_t(f.logical_gpus)};
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
        return train(s, f, mnist);
    }
    if (f.strategy == "mirrored") {
        sd::Mirrored<Cuda> s(replicas, opts);
        replicas_in_sync = s.num_replicas_in_sync();
        return train(s, f, mnist);
    }
    if (f.strategy == "central_storage") {
        sd::CentralStorage<Cuda> s(replicas, opts);
        replicas_in_sync = s.num_replicas_in_sync();
        return train(s, f, mnist);
    }
    throw strata::ValueError("--device gpu: --strategy " + f.strategy +
                             " does not train on the GPU in this program yet; use --device cpu (one_device, mirrored and "
                             "central_storage train on the GPU)");
}

}  // namespace mnist_example
