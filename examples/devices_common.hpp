// What examples/devices.cpp and its GPU half (devices_gpu.cu) both print: memory statistics as a
// table row and as JSON.
#pragma once
#include <strata/place/devices.hpp>

#include <cstdio>

#include "../tools/cli.hpp"

namespace devices_example {

namespace pd = strata::place;

inline cli::Json memory_json(const pd::MemoryInfo& m) {
    return {{"current", m.current}, {"peak", m.peak}, {"reserved", m.reserved}, {"limit", m.limit}};
}

inline void print_memory(const char* what, const pd::MemoryInfo& m) {
    std::printf("  %-40s current %-10s peak %-10s reserved %-10s limit %s\n", what,
                pd::format_bytes(m.current).c_str(), pd::format_bytes(m.peak).c_str(),
                pd::format_bytes(m.reserved).c_str(), m.limit ? pd::format_bytes(m.limit).c_str() : "none");
}

/// Section 7, the GPUs (devices_gpu.cu, compiled by nvcc where CUDA is enabled): two logical
/// GPUs carved from the first, each with its own stream and memory limit; the placement log;
/// memory growth and a limit's overflow on a GPU; a fixed limit reserved up front; the GPUs
/// hidden with set_visible_devices. Prints as it goes and returns the facts as JSON; `log_lines`
/// is where the placement-log sink collects.
cli::Json gpu_sections(std::vector<std::string>& log_lines);

}  // namespace devices_example
