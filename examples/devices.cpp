// Devices in one page (what tf.config does, in C++): list the physical devices, split the host
// into two logical devices, log where two tensors are placed, compare memory growth with a fixed
// memory limit, and watch soft placement answer a request for a GPU that is not there.
//
//   ./devices                 readable tables
//   ./devices --json out.json the same facts as JSON
#include <strata/strata.hpp>
#include <strata/place/devices.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"

namespace pd = strata::place;

namespace {

constexpr std::size_t MiB = 1024 * 1024;

using example::json_quote;

std::string memory_json(const pd::MemoryInfo& m) {
    std::ostringstream os;
    os << "{\"current\": " << m.current << ", \"peak\": " << m.peak << ", \"reserved\": " << m.reserved
       << ", \"limit\": " << m.limit << "}";
    return os.str();
}

void print_memory(const char* what, const pd::MemoryInfo& m) {
    std::printf("  %-40s current %-10s peak %-10s reserved %-10s limit %s\n", what,
                pd::format_bytes(m.current).c_str(), pd::format_bytes(m.peak).c_str(),
                pd::format_bytes(m.reserved).c_str(), m.limit ? pd::format_bytes(m.limit).c_str() : "none");
}

}  // namespace

int main(int argc, char** argv) {
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    std::ostringstream json;
    json << "{\n";

    // Placement-log lines and soft-placement warnings: printed, and kept for the JSON.
    std::vector<std::string> log_lines;
    pd::set_placement_log_sink([&](std::string_view line) {
        log_lines.emplace_back(line);
        std::printf("  | %.*s\n", int(line.size()), line.data());
    });

    // ---- 1. Physical devices ----
    std::printf("Physical devices\n  %-24s %-4s %-6s %-10s %s\n", "name", "kind", "cores", "memory", "description");
    json << "  \"physical_devices\": [";
    const auto physical = pd::list_physical_devices();
    for (std::size_t i = 0; i < physical.size(); ++i) {
        const auto& d = physical[i];
        std::printf("  %-24s %-4s %-6d %-10s %s\n", d.name.c_str(), pd::kind_name(d.kind), d.cores,
                    pd::format_bytes(d.memory_bytes).c_str(), d.description.c_str());
        json << (i ? ",\n    " : "\n    ") << "{\"name\": " << json_quote(d.name) << ", \"kind\": " << json_quote(pd::kind_name(d.kind))
             << ", \"index\": " << d.index << ", \"cores\": " << d.cores << ", \"memory_bytes\": " << d.memory_bytes
             << ", \"description\": " << json_quote(d.description) << "}";
    }
    json << "\n  ],\n";

    // ---- 2. Two logical host devices, with memory growth ----
    const pd::PhysicalDevice cpu = pd::list_physical_devices(pd::DeviceKind::Cpu).front();
    const auto over = strata::hardware_threads() >= 2 ? pd::Oversubscribe::No : pd::Oversubscribe::Yes;
    pd::set_logical_device_configuration(cpu, {{}, {}}, over);  // each gets half the cores
    pd::set_memory_growth(cpu, true);
    const auto logical = pd::list_logical_devices();
    std::printf("\nLogical devices (the host split in two, memory growth on)\n  %-16s %-9s %-6s %s\n", "name",
                "physical", "cores", "memory limit");
    json << "  \"logical_devices\": [";
    for (std::size_t i = 0; i < logical.size(); ++i) {
        const auto& d = logical[i];
        std::printf("  %-16s %-9d %-6d %s\n", d.name.c_str(), d.physical_index, d.cores,
                    d.memory_limit ? pd::format_bytes(d.memory_limit).c_str() : "none");
        json << (i ? ",\n    " : "\n    ") << "{\"name\": " << json_quote(d.name) << ", \"kind\": " << json_quote(pd::kind_name(d.kind))
             << ", \"physical_index\": " << d.physical_index << ", \"cores\": " << d.cores
             << ", \"memory_limit\": " << d.memory_limit << "}";
    }
    json << "\n  ],\n";

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
    json << "  \"placement_log\": [";
    for (std::size_t i = 0; i < log_lines.size(); ++i) json << (i ? ", " : "") << json_quote(log_lines[i]);
    json << "],\n";

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
    json << "  \"memory_growth\": {\"/device:CPU:0\": " << memory_json(growth_cpu0)
         << ", \"/device:CPU:1\": " << memory_json(growth_cpu1) << "},\n";
    a = strata::Tensor<float>();
    b = strata::Tensor<float>();

    // ---- 5. A fixed limit: the whole limit reserved up front, the overflow an error ----
    pd::reset_devices();  // configuration is frozen once used; start over
    pd::set_logical_device_configuration(cpu, {{.memory_limit = 256 * MiB}, {.memory_limit = 64 * MiB}}, over);
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
    json << "  \"fixed_limit\": {\"device\": " << json_quote(fixed.name) << ", \"on_entry\": " << memory_json(on_entry)
         << ", \"holding_230_MiB\": " << memory_json(after) << ", \"error\": " << json_quote(overflow) << "},\n";

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
    json << "  \"soft_placement\": {\"requested\": \"/device:GPU:3\", \"placed_on\": " << json_quote(placed.name)
         << ", \"warning\": " << json_quote(warning) << ", \"error_without_soft_placement\": " << json_quote(strict_error)
         << "}\n}\n";

    pd::set_placement_log_sink({});
    if (!json_path.empty()) {
        std::ofstream out(json_path);
        out << json.str();
        if (!out) {
            std::fprintf(stderr, "devices: cannot write %s\n", json_path.c_str());
            return 1;
        }
        std::printf("\nwrote %s\n", json_path.c_str());
    }
}
