// Devices in one page (what tf.config does, in C++): list the physical devices, split the host
// into two logical devices, log where two tensors are placed, compare memory growth with a fixed
// memory limit, and watch soft placement answer a request for a GPU that is not there. Where CUDA
// is enabled its GPU half (devices_gpu.cu) adds section 7: two logical GPUs carved from one,
// placement and memory growth on them, a GPU memory limit, and the GPUs hidden.
//
//   ./devices                 readable tables
//   ./devices --json out.json the same facts as JSON
#include <strata/strata.hpp>
#include <strata/place/devices.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../tools/cli.hpp"
#include "devices_common.hpp"

namespace pd = strata::place;
using devices_example::memory_json;
using devices_example::print_memory;

namespace {

constexpr std::size_t MiB = 1024 * 1024;

/// Runs the six sections (seven where the program has its GPU half), printing each; writes the JSON to `json_path` when it is not empty.
int show_devices(const std::string& json_path) {
    cli::Json json;

    // Placement-log lines and soft-placement warnings: printed, and kept for the JSON.
    std::vector<std::string> log_lines;
    pd::set_placement_log_sink([&](std::string_view line) {
        log_lines.emplace_back(line);
        std::printf("  | %.*s\n", int(line.size()), line.data());
    });

    // ---- 1. Physical devices ----
    std::printf("Physical devices\n  %-24s %-4s %-6s %-10s %s\n", "name", "kind", "cores", "memory", "description");
    cli::Json physical_json = cli::Json::array();
    const auto physical = pd::list_physical_devices();
    for (std::size_t i = 0; i < physical.size(); ++i) {
        const auto& d = physical[i];
        std::printf("  %-24s %-4s %-6d %-10s %s\n", d.name.c_str(), pd::kind_name(d.kind), d.cores,
                    pd::format_bytes(d.memory_bytes).c_str(), d.description.c_str());
        physical_json.push_back({{"name", d.name}, {"kind", pd::kind_name(d.kind)}, {"index", d.index}, {"cores", d.cores},
                                 {"memory_bytes", d.memory_bytes}, {"description", d.description}});
    }
    json["physical_devices"] = physical_json;

    // ---- 2. Two logical host devices, with memory growth ----
    const pd::PhysicalDevice cpu = pd::list_physical_devices(pd::DeviceKind::Cpu).front();
    const auto over = strata::hardware_threads() >= 2 ? pd::Oversubscribe::No : pd::Oversubscribe::Yes;
    pd::set_logical_device_configuration(cpu, {{}, {}}, over);  // each gets half the cores
    pd::set_memory_growth(cpu, true);
    const auto logical = pd::list_logical_devices();
    std::printf("\nLogical devices (the host split in two, memory growth on)\n  %-16s %-9s %-6s %s\n", "name",
                "physical", "cores", "memory limit");
    cli::Json logical_json = cli::Json::array();
    for (std::size_t i = 0; i < logical.size(); ++i) {
        const auto& d = logical[i];
        std::printf("  %-16s %-9d %-6d %s\n", d.name.c_str(), d.physical_index, d.cores,
                    d.memory_limit ? pd::format_bytes(d.memory_limit).c_str() : "none");
        logical_json.push_back({{"name", d.name}, {"kind", pd::kind_name(d.kind)}, {"physical_index", d.physical_index},
                                {"cores", d.cores}, {"memory_limit", d.memory_limit}});
    }
    json["logical_devices"] = logical_json;

    // ---- 3. The placement log, while two tensors are placed on the two logical devices ----
    std::printf("\nPlacement log\n");
    pd::set_log_device_placement(true);
    strata::Tensor<float> a, b;
    {
        pd::DeviceScope on(logical[0]);
        a = strata::Tensor<float>({512, 512});
        pd::log_placement("tensor a", pd::current_device());
    }
    {
        pd::DeviceScope on(logical[1]);
        b = strata::Tensor<float>({256, 256});
        pd::log_placement("tensor b", pd::current_device());
    }
    pd::set_log_device_placement(false);
    json["placement_log"] = log_lines;

    // ---- 4. Memory growth: a 1 MiB buffer made and freed 100 times takes 1 MiB once ----
    {
        pd::DeviceScope on(logical[1]);
        for (int step = 0; step < 100; ++step) strata::Tensor<float> scratch({256 * 1024});
    }
    const auto growth_cpu0 = pd::memory_info(logical[0]);
    const auto growth_cpu1 = pd::memory_info(logical[1]);
    std::printf("\nMemory growth (a caching pool per logical device)\n");
    print_memory("/device:CPU:0 (tensor a, 1 MiB)", growth_cpu0);
    print_memory("/device:CPU:1 (tensor b + 100 x 1 MiB)", growth_cpu1);
    json["memory_growth"] = {{"/device:CPU:0", memory_json(growth_cpu0)}, {"/device:CPU:1", memory_json(growth_cpu1)}};
    a = strata::Tensor<float>();
    b = strata::Tensor<float>();

    // ---- 5. A fixed limit: the whole limit reserved up front, the overflow an error ----
    pd::reset_devices();  // configuration is frozen once used; start over
    pd::set_logical_device_configuration(cpu, {{.memory_limit = pd::Megabytes{256}}, {.memory_limit = pd::Megabytes{64}}}, over);
    const auto fixed = pd::find_device("/device:CPU:0");
    std::string overflow;
    pd::MemoryInfo on_entry, after;
    {
        pd::DeviceScope on(fixed);
        on_entry = pd::memory_info(fixed);
        strata::Tensor<std::uint8_t> weights({200 * MiB}), activations({30 * MiB});
        try {
            strata::Tensor<std::uint8_t> one_more({64 * MiB});
        } catch (const strata::DeviceError& e) {
            overflow = e.what();
        }
        after = pd::memory_info(fixed);
    }
    std::printf("\nFixed memory limit (an arena reserved on first use)\n");
    print_memory("/device:CPU:0 on entering its scope", on_entry);
    print_memory("/device:CPU:0 holding 200 + 30 MiB", after);
    std::printf("  asking for 64 MiB more: %s\n", overflow.c_str());
    json["fixed_limit"] = {{"device", fixed.name}, {"on_entry", memory_json(on_entry)}, {"holding_230_MiB", memory_json(after)},
                           {"error", overflow}};

    // ---- 6. Soft placement ----
    std::printf("\nSoft placement\n");
    const std::size_t before = log_lines.size();
    const pd::LogicalDevice placed = pd::find_device("/device:GPU:3");
    const std::string warning = log_lines.size() > before ? log_lines.back() : "";
    pd::set_soft_device_placement(false);
    std::string strict_error;
    try {
        pd::find_device("/device:GPU:3");
    } catch (const strata::DeviceError& e) {
        strict_error = e.what();
    }
    pd::set_soft_device_placement(true);
    std::printf("  /device:GPU:3 with soft placement    -> %s\n", placed.name.c_str());
    std::printf("  /device:GPU:3 without soft placement -> %s\n", strict_error.empty() ? "(found)" : strict_error.c_str());
    json["soft_placement"] = {{"requested", "/device:GPU:3"}, {"placed_on", placed.name}, {"warning", warning},
                              {"error_without_soft_placement", strict_error}};

    // ---- 7. GPUs: the GPU half of this program (devices_gpu.cu), where nvcc built it ----
#ifdef DEVICES_HAVE_CUDA
    json["gpus"] = devices_example::gpu_sections(log_lines);
#else
    std::printf("\nGPUs\n  this build has no CUDA (nvcc was not found, or -Dcuda=disabled): the GPU sections are not in it\n");
    json["gpus"] = {{"none", "built without CUDA"}};
#endif

    pd::set_placement_log_sink({});
    if (!json_path.empty()) {
        cli::write_json(json_path, json);
        std::printf("\nwrote %s\n", json_path.c_str());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Devices in one page: physical and logical devices, placement, memory policies.", "devices"};
    std::string json_path;
    app.add_option("--json", json_path, "also write what was found as JSON to FILE");
    return cli::run(app, argc, argv, [&] { return show_devices(json_path); });
}
