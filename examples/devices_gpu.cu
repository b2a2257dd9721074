// The GPU half of examples/devices (section 7): nvcc compiles it wherever CUDA is enabled
// (examples/meson.build), and its presence in the program is also what lets
// list_physical_devices see GPUs (place/devices.hpp registers the CUDA calls from every unit
// nvcc compiles). Where no GPU is usable, the section says so.
#include <strata/place/devices.hpp>
#include <strata/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "devices_common.hpp"

namespace devices_example {

namespace {
constexpr std::size_t MiB = 1024 * 1024;
}

cli::Json gpu_sections(std::vector<std::string>& log_lines) {
    cli::Json json;
    const auto gpus = pd::list_physical_devices(pd::DeviceKind::Gpu);
    std::printf("\nGPUs\n");
    if (gpus.empty()) {
        int count = 0;
        const cudaError_t e = cudaGetDeviceCount(&count);
        const std::string why = e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices";
        std::printf("  none usable here (%s): the GPU sections need one\n", why.c_str());
        json["none"] = why;
        return json;
    }
    const pd::PhysicalDevice gpu = gpus.front();
    std::printf("  %zu GPU(s); the first: %s, %s\n", gpus.size(), gpu.description.c_str(),
                pd::format_bytes(gpu.memory_bytes).c_str());

    // ---- 7a. Two logical GPUs carved from the first, memory growth on ----
    pd::reset_devices();
    pd::set_logical_device_configuration(gpu, {{.memory_limit = pd::Megabytes{1024}}, {.memory_limit = pd::Megabytes{512}}});
    pd::set_memory_growth(gpu, true);
    const auto logical = pd::list_logical_devices(pd::DeviceKind::Gpu);
    std::printf("\nTwo logical GPUs carved from %s (memory growth on)\n  %-16s %-9s %-14s %s\n", gpu.name.c_str(), "name",
                "physical", "memory limit", "stream");
    cli::Json logical_json = cli::Json::array();
    std::vector<cudaStream_t> streams;
    for (const auto& d : logical) {
        pd::DeviceScope on(d);
        streams.push_back(strata::place::Cuda::stream());
        std::printf("  %-16s %-9d %-14s %s\n", d.name.c_str(), d.physical_index, pd::format_bytes(d.memory_limit).c_str(),
                    streams.back() ? "its own" : "the default stream");
        logical_json.push_back({{"name", d.name}, {"physical_index", d.physical_index}, {"memory_limit", d.memory_limit},
                                {"own_stream", streams.back() != nullptr}});
    }
    const bool distinct = streams.size() == 2 && streams[0] != streams[1];
    std::printf("  the two streams are %s\n", distinct ? "distinct: their work does not wait on each other's" : "the same");
    json["logical_gpus"] = logical_json;
    json["distinct_streams"] = distinct;

    // ---- 7b. The placement log and memory growth on the logical GPUs ----
    std::printf("\nPlacement log and memory growth on the logical GPUs\n");
    const std::size_t first_line = log_lines.size();
    pd::set_log_device_placement(true);
    strata::Tensor<float, strata::place::Cuda> c, d;
    {
        pd::DeviceScope on(logical[0]);
        c = strata::Tensor<float, strata::place::Cuda>({64 * 1024 * 1024 / 4});  // 64 MiB
        pd::log_placement("gpu tensor c (64 MiB)", pd::current_device());
    }
    {
        pd::DeviceScope on(logical[1]);
        d = strata::Tensor<float, strata::place::Cuda>({4 * 1024 * 1024 / 4});  // 4 MiB
        pd::log_placement("gpu tensor d (4 MiB)", pd::current_device());
        for (int step = 0; step < 100; ++step) strata::Tensor<float, strata::place::Cuda> scratch({256 * 1024});
    }
    pd::set_log_device_placement(false);
    json["placement_log"] = std::vector<std::string>(log_lines.begin() + std::ptrdiff_t(first_line), log_lines.end());
    const auto gpu0 = pd::memory_info(logical[0]), gpu1 = pd::memory_info(logical[1]);
    print_memory((logical[0].name + " (tensor c)").c_str(), gpu0);
    print_memory((logical[1].name + " (d + 100 x 1 MiB)").c_str(), gpu1);
    std::string overflow;
    {
        pd::DeviceScope on(logical[1]);
        try {
            strata::Tensor<float, strata::place::Cuda> too_big({600 * MiB / 4});
        } catch (const strata::DeviceError& e) {
            overflow = e.what();
        }
    }
    std::printf("  asking %s for 600 MiB: %s\n", logical[1].name.c_str(), overflow.empty() ? "(granted)" : overflow.c_str());
    json["memory_growth"] = {{logical[0].name, memory_json(gpu0)}, {logical[1].name, memory_json(gpu1)}};
    json["over_limit_error"] = overflow;
    c = {};
    d = {};

    // ---- 7c. Memory growth off: a limit is reserved whole on first use ----
    pd::reset_devices();
    pd::set_logical_device_configuration(gpu, {{.memory_limit = pd::Megabytes{256}}});
    const auto fixed = pd::list_logical_devices(pd::DeviceKind::Gpu).front();
    pd::MemoryInfo on_entry, holding;
    {
        pd::DeviceScope on(fixed);
        on_entry = pd::memory_info(fixed);
        strata::Tensor<float, strata::place::Cuda> w({100 * MiB / 4});
        holding = pd::memory_info(fixed);
    }
    std::printf("\nA GPU memory limit with memory growth off (an arena reserved on first use)\n");
    print_memory((fixed.name + " on entering its scope").c_str(), on_entry);
    print_memory((fixed.name + " holding 100 MiB").c_str(), holding);
    json["fixed_limit"] = {{"device", fixed.name}, {"on_entry", memory_json(on_entry)}, {"holding_100_MiB", memory_json(holding)}};

    // ---- 7d. Visible devices: hiding every GPU ----
    pd::reset_devices();
    pd::set_visible_devices({});
    const auto hidden = pd::list_logical_devices();
    std::printf("\nVisible devices: set_visible_devices({}) hides every GPU\n  logical devices now:");
    cli::Json names = cli::Json::array();
    for (const auto& l : hidden) {
        std::printf(" %s", l.name.c_str());
        names.push_back(l.name);
    }
    std::printf("\n");
    json["with_gpus_hidden"] = names;
    pd::reset_devices();
    return json;
}

}  // namespace devices_example
