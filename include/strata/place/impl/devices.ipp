#pragma once
/// \file strata/place/impl/devices.ipp
/// The definitions behind strata/place/devices.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "strata/place/devices.hpp"

namespace strata::place {
namespace detail {

struct DeviceSlot {
    LogicalDevice device;
    MemoryPolicy policy = MemoryPolicy::Direct;
    DeviceAllocator* allocator = nullptr;  // made on the first DeviceScope; owned by the state
    void* stream = nullptr;                // a logical GPU's stream, made on its first DeviceScope
};

struct DeviceState {
    std::mutex mu;
    std::optional<std::vector<PhysicalDevice>> physical;  // probed once, until reset_devices
    std::optional<std::set<int>> visible_gpus;            // physical indices; none = all
    std::map<std::string, std::vector<LogicalDeviceConfiguration>, std::less<>> logical;  // cores resolved
    std::set<std::string, std::less<>> growth;            // physical devices with memory growth
    bool initialized = false;
    std::string initialized_by;
    std::vector<std::unique_ptr<DeviceSlot>> slots;       // made at initialisation
    // Every allocator ever made. A retired one stays alive, because blocks it gave out may
    // still come back to it from any thread.
    std::vector<std::unique_ptr<DeviceAllocator>> allocators;
    std::atomic<int> active_scopes{0};
    std::atomic<bool> log_placement{false};
    std::atomic<bool> soft_placement{true};
    std::mutex sink_mu;
    std::function<void(std::string_view)> sink;
    CudaHooks cuda;
};

// Never destroyed: scopes and tensors may outlive main's statics.
STRATA_DECL DeviceState& device_state() {
    static DeviceState* s = new DeviceState;
    return *s;
}

STRATA_DECL void register_cuda_hooks(const CudaHooks& hooks) {
    auto& s = device_state();
    std::lock_guard lock(s.mu);
    s.cuda = hooks;
    s.physical.reset();
}

STRATA_DECL DeviceScope*& current_scope() noexcept {
    thread_local DeviceScope* scope = nullptr;
    return scope;
}

STRATA_DECL std::size_t host_memory_bytes() {
    std::ifstream meminfo("/proc/meminfo");
    std::string line;
    while (std::getline(meminfo, line)) {
        unsigned long long kib = 0;
        if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kib) == 1) return std::size_t(kib) * 1024;
    }
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) return std::size_t(pages) * std::size_t(page);
#endif
    return 0;
}

STRATA_DECL std::string host_description() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0) {
            if (auto colon = line.find(':'); colon != std::string::npos) {
                auto first = line.find_first_not_of(" \t", colon + 1);
                if (first != std::string::npos) return line.substr(first);
            }
        }
    }
    return "host CPU";
}

STRATA_DECL std::string physical_name(DeviceKind k, int index) {
    return std::string("/physical_device:") + kind_name(k) + ":" + std::to_string(index);
}
STRATA_DECL std::string logical_name(DeviceKind k, int index) {
    return std::string("/device:") + kind_name(k) + ":" + std::to_string(index);
}

STRATA_DECL const std::vector<PhysicalDevice>& physical_locked(DeviceState& s) {
    if (!s.physical) {
        std::vector<PhysicalDevice> v;
        v.push_back({physical_name(DeviceKind::Cpu, 0), DeviceKind::Cpu, 0, hardware_threads(),
                     host_memory_bytes(), host_description()});
        const int gpus = s.cuda.device_count ? s.cuda.device_count() : 0;
        for (int i = 0; i < gpus; ++i) {
            PhysicalDevice d{physical_name(DeviceKind::Gpu, i), DeviceKind::Gpu, i, 0, 0, {}};
            s.cuda.describe(i, d.description, d.memory_bytes);
            v.push_back(std::move(d));
        }
        s.physical = std::move(v);
    }
    return *s.physical;
}

template <class Device>
std::string join_names(const std::vector<Device>& devices) {
    std::string out;
    for (const auto& d : devices) out += (out.empty() ? "" : ", ") + d.name;
    return out.empty() ? "none" : out;
}

STRATA_DECL const PhysicalDevice& find_physical_locked(DeviceState& s, const PhysicalDevice& d, const char* what) {
    const auto& all = physical_locked(s);
    for (const auto& p : all)
        if (p.name == d.name) return p;
    throw_error<DeviceError>(what, ": ", d.name.empty() ? "(a device with no name)" : d.name,
                             " is not a physical device of this machine; available: ", join_names(all));
}

STRATA_DECL void check_configurable_locked(const DeviceState& s, const char* what) {
    if (s.initialized)
        throw_error<DeviceError>(what, ": the devices were already initialised (by ", s.initialized_by,
                                 "); configure devices before the first DeviceScope or strategy, "
                                 "or call strata::place::reset_devices() first");
}

STRATA_DECL std::vector<LogicalDevice> logical_locked(DeviceState& s) {
    std::vector<LogicalDevice> out;
    if (s.initialized) {
        for (const auto& slot : s.slots) out.push_back(slot->device);
        return out;
    }
    int next[2] = {0, 0};
    for (const auto& p : physical_locked(s)) {
        if (p.kind == DeviceKind::Gpu && s.visible_gpus && !s.visible_gpus->count(p.index)) continue;
        int& index = next[p.kind == DeviceKind::Cpu ? 0 : 1];
        auto it = s.logical.find(p.name);
        if (it == s.logical.end()) {
            out.push_back({logical_name(p.kind, index), p.kind, index, p.index, p.cores, 0});
            ++index;
        } else {
            for (const auto& c : it->second) {
                out.push_back({logical_name(p.kind, index), p.kind, index, p.index, c.cores, c.memory_limit.bytes()});
                ++index;
            }
        }
    }
    return out;
}

STRATA_DECL void initialize_locked(DeviceState& s, std::string_view by) {
    if (s.initialized) return;
    auto devices = logical_locked(s);
    std::vector<std::unique_ptr<DeviceSlot>> slots;
    for (auto& d : devices) {
        auto slot = std::make_unique<DeviceSlot>();
        const auto& phys_name = physical_name(d.kind, d.physical_index);
        slot->policy = s.growth.count(phys_name) ? MemoryPolicy::Growth
                     : d.memory_limit            ? MemoryPolicy::Fixed
                                                 : MemoryPolicy::Direct;
        slot->device = std::move(d);
        slots.push_back(std::move(slot));
    }
    s.slots = std::move(slots);
    s.initialized = true;
    s.initialized_by = std::string(by);
}

STRATA_DECL DeviceAllocator* slot_allocator_locked(DeviceState& s, DeviceSlot& slot) {
    if (!slot.allocator) {
        const Upstream up = slot.device.kind == DeviceKind::Cpu ? host_upstream()
                                                                : Upstream{s.cuda.allocate, s.cuda.deallocate};
        std::unique_ptr<DeviceAllocator> a;
        switch (slot.policy) {
            case MemoryPolicy::Direct: a = std::make_unique<DirectAllocator>(slot.device.name, up); break;
            case MemoryPolicy::Growth:
                a = std::make_unique<CachingPool>(slot.device.name, up, slot.device.memory_limit);
                break;
            case MemoryPolicy::Fixed:
                a = std::make_unique<FixedArena>(slot.device.name, up, slot.device.memory_limit);
                break;
        }
        s.allocators.push_back(std::move(a));
        slot.allocator = s.allocators.back().get();
    }
    return slot.allocator;
}

struct ParsedName {
    DeviceKind kind;
    int index;
};

// "/device:GPU:1", "device:gpu:1", "GPU:1", "/gpu:1", "gpu", "cpu:0", any case.
STRATA_DECL std::optional<ParsedName> parse_device_name(std::string_view name) {
    std::string s;
    for (char c : name)
        if (!std::isspace(static_cast<unsigned char>(c))) s += char(std::tolower(static_cast<unsigned char>(c)));
    std::string_view v = s;
    if (v.starts_with("/")) v.remove_prefix(1);
    if (v.starts_with("device:")) v.remove_prefix(7);
    ParsedName out{DeviceKind::Cpu, 0};
    if (v.starts_with("cpu")) out.kind = DeviceKind::Cpu;
    else if (v.starts_with("gpu")) out.kind = DeviceKind::Gpu;
    else return std::nullopt;
    v.remove_prefix(3);
    if (v.empty()) return out;
    if (v.front() != ':' || v.size() < 2 || v.size() > 10) return std::nullopt;
    v.remove_prefix(1);
    long index = 0;
    for (char c : v) {
        if (c < '0' || c > '9') return std::nullopt;
        index = index * 10 + (c - '0');
    }
    if (index > 1'000'000) return std::nullopt;
    out.index = int(index);
    return out;
}

STRATA_DECL ParsedName parse_or_throw(std::string_view name, const char* what) {
    auto parsed = parse_device_name(name);
    if (!parsed)
        throw_error<ValueError>(what, ": cannot read \"", name,
                                "\" as a device name; expected a form like \"/device:GPU:1\", \"GPU:1\", "
                                "\"/gpu:1\" or \"cpu\"");
    return *parsed;
}

STRATA_DECL void emit_line(std::string_view line) {
    auto& s = device_state();
    std::lock_guard lock(s.sink_mu);
    if (s.sink) {
        s.sink(line);
        return;
    }
    std::string whole(line);
    whole += '\n';
    std::fwrite(whole.data(), 1, whole.size(), stderr);  // one write: lines never interleave
}

}  // namespace detail

STRATA_DECL std::vector<PhysicalDevice> list_physical_devices(std::optional<DeviceKind> kind) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    std::vector<PhysicalDevice> out;
    for (const auto& d : detail::physical_locked(s))
        if (!kind || d.kind == *kind) out.push_back(d);
    return out;
}

STRATA_DECL void set_visible_devices(const std::vector<PhysicalDevice>& devices) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    detail::check_configurable_locked(s, "set_visible_devices");
    std::set<int> gpus;
    for (const auto& d : devices) {
        const auto& p = detail::find_physical_locked(s, d, "set_visible_devices");
        if (p.kind == DeviceKind::Gpu) gpus.insert(p.index);
    }
    s.visible_gpus = std::move(gpus);
}

STRATA_DECL std::vector<PhysicalDevice> get_visible_devices(std::optional<DeviceKind> kind) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    std::vector<PhysicalDevice> out;
    for (const auto& d : detail::physical_locked(s)) {
        if (kind && d.kind != *kind) continue;
        if (d.kind == DeviceKind::Gpu && s.visible_gpus && !s.visible_gpus->count(d.index)) continue;
        out.push_back(d);
    }
    return out;
}

STRATA_DECL void set_logical_device_configuration(const PhysicalDevice& device,
                                             std::vector<LogicalDeviceConfiguration> configs,
                                             Oversubscribe oversubscribe) {
    constexpr const char* what = "set_logical_device_configuration";
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    detail::check_configurable_locked(s, what);
    const PhysicalDevice& p = detail::find_physical_locked(s, device, what);
    if (configs.empty()) {
        s.logical.erase(p.name);
        return;
    }
    std::size_t total_limit = 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
        const auto& c = configs[i];
        STRATA_CHECK(c.cores >= 0, ValueError, what, ": logical device ", i, " of ", p.name, " asks for ",
                     c.cores, " cores; expected 0 (an even share) or more");
        STRATA_CHECK(p.kind == DeviceKind::Cpu || c.cores == 0, ValueError, what, ": logical device ", i, " of ",
                     p.name, " asks for ", c.cores, " cores; cores are for host devices, expected 0 for a GPU");
        const std::size_t limit = c.memory_limit.bytes();
        STRATA_CHECK(limit == 0 || limit >= FixedArena::alignment, ValueError, what, ": logical device ", i, " of ",
                     p.name, " has a memory limit of ", limit, " bytes; expected none or at least Bytes{",
                     FixedArena::alignment, "}");
        STRATA_CHECK(total_limit + limit >= total_limit, ValueError, what, ": the memory limits of ", p.name,
                     " add up to more than a size_t holds");
        total_limit += limit;
    }
    if (p.memory_bytes && total_limit > p.memory_bytes)
        throw_error<DeviceError>(what, ": the memory limits of ", p.name, " add up to ", format_bytes(total_limit),
                                 " but it has ", format_bytes(p.memory_bytes));
    if (p.kind == DeviceKind::Cpu) {
        long given = 0;
        int unspecified = 0;
        for (const auto& c : configs) {
            given += c.cores;
            unspecified += c.cores == 0;
        }
        const long needed = given + unspecified;
        if (oversubscribe == Oversubscribe::No && needed > p.cores)
            throw_error<DeviceError>(what, ": ", configs.size(), " logical CPU devices need ", needed, " cores (",
                                     given, " given", unspecified ? " + 1 for each device without a count" : "",
                                     ") but ", p.name, " has ", p.cores,
                                     " hardware threads; give fewer cores or pass Oversubscribe::Yes");
        const long left = std::max(0L, long(p.cores) - given);
        int j = 0;
        for (auto& c : configs) {
            if (c.cores != 0) continue;
            const long share = unspecified ? left / unspecified + (j < left % unspecified ? 1 : 0) : 0;
            c.cores = int(std::max(1L, share));
            ++j;
        }
    }
    s.logical[p.name] = std::move(configs);
}

STRATA_DECL std::vector<LogicalDeviceConfiguration> get_logical_device_configuration(const PhysicalDevice& device) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    const auto& p = detail::find_physical_locked(s, device, "get_logical_device_configuration");
    auto it = s.logical.find(p.name);
    return it == s.logical.end() ? std::vector<LogicalDeviceConfiguration>{} : it->second;
}

STRATA_DECL void set_memory_growth(const PhysicalDevice& device, bool enable) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    detail::check_configurable_locked(s, "set_memory_growth");
    const auto& p = detail::find_physical_locked(s, device, "set_memory_growth");
    if (enable) s.growth.insert(p.name);
    else s.growth.erase(p.name);
}

STRATA_DECL bool get_memory_growth(const PhysicalDevice& device) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    const auto& p = detail::find_physical_locked(s, device, "get_memory_growth");
    return s.growth.count(p.name) != 0;
}

STRATA_DECL std::vector<LogicalDevice> list_logical_devices(std::optional<DeviceKind> kind) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    auto all = detail::logical_locked(s);
    if (!kind) return all;
    std::vector<LogicalDevice> out;
    for (auto& d : all)
        if (d.kind == *kind) out.push_back(std::move(d));
    return out;
}

STRATA_DECL void initialize_devices(std::string_view by) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    detail::initialize_locked(s, by);
}

STRATA_DECL bool devices_initialized() {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    return s.initialized;
}

STRATA_DECL void reset_devices() {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    if (const int n = s.active_scopes.load(); n > 0)
        throw_error<DeviceError>("reset_devices: expected no active DeviceScope, found ", n);
    for (auto& slot : s.slots) {
        if (slot->allocator) slot->allocator->retire();
        if (slot->stream && s.cuda.destroy_stream) s.cuda.destroy_stream(slot->stream);
    }
    s.slots.clear();
    s.physical.reset();
    s.visible_gpus.reset();
    s.logical.clear();
    s.growth.clear();
    s.initialized = false;
    s.initialized_by.clear();
}

//==== Placement: soft placement and the placement log ====

STRATA_DECL void set_soft_device_placement(bool enable) { detail::device_state().soft_placement = enable; }
STRATA_DECL bool get_soft_device_placement() { return detail::device_state().soft_placement; }

STRATA_DECL void set_log_device_placement(bool enable) { detail::device_state().log_placement = enable; }
STRATA_DECL bool get_log_device_placement() { return detail::device_state().log_placement; }

STRATA_DECL void set_placement_log_sink(std::function<void(std::string_view)> sink) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.sink_mu);
    s.sink = std::move(sink);
}

STRATA_DECL void log_placement(std::string_view what, const LogicalDevice& device) {
    if (!get_log_device_placement()) return;
    std::string line(what);
    line += " placed on ";
    line += device.name;
    detail::emit_line(line);
}

STRATA_DECL LogicalDevice find_device(std::string_view name) {
    const auto parsed = detail::parse_or_throw(name, "find_device");
    auto all = list_logical_devices();
    for (auto& d : all)
        if (d.kind == parsed.kind && d.index == parsed.index) return d;
    const std::string wanted = detail::logical_name(parsed.kind, parsed.index);
    if (!get_soft_device_placement())
        throw_error<DeviceError>("find_device: ", wanted, " is not available (soft placement is off); available: ",
                                 detail::join_names(all));
    LogicalDevice fallback = all.front();  // the host's first logical device is always there
    detail::emit_line("strata: soft placement: " + wanted + " is not available; using " + fallback.name);
    return fallback;
}

//==== Making a device current: DeviceScope ====

STRATA_DECL DeviceScope::~DeviceScope() {
    auto& s = detail::device_state();
    detail::current_scope() = prev_scope_;
    detail::current_allocator(space()) = prev_allocator_;
    if (device_.kind == DeviceKind::Gpu) {
        if (s.cuda.set_current) s.cuda.set_current(prev_gpu_, prev_stream_);
    } else {
#if STRATA_HAS_OPENMP
        omp_set_num_threads(prev_threads_);
#endif
    }
    s.active_scopes.fetch_sub(1);
}

STRATA_DECL void DeviceScope::enter(const LogicalDevice& wanted) {
    auto& s = detail::device_state();
    DeviceAllocator* allocator = nullptr;
    void* stream = nullptr;
    {
        std::lock_guard lock(s.mu);
        detail::initialize_locked(s, "the first DeviceScope, on " + wanted.name);
        detail::DeviceSlot* slot = nullptr;
        for (auto& sl : s.slots)
            if (sl->device.name == wanted.name) slot = sl.get();
        if (!slot)
            throw_error<DeviceError>("DeviceScope: ", wanted.name,
                                     " is not a logical device of the current configuration; available: ",
                                     detail::join_names(detail::logical_locked(s)));
        if (!(slot->device == wanted))
            throw_error<DeviceError>("DeviceScope: the ", wanted.name, " given (", wanted.cores, " cores, limit ",
                                     format_bytes(wanted.memory_limit), ") is not the configured one (",
                                     slot->device.cores, " cores, limit ", format_bytes(slot->device.memory_limit),
                                     "); take devices from list_logical_devices() or find_device()");
        if (slot->device.kind == DeviceKind::Gpu) {
            if (!s.cuda.set_current)
                throw_error<DeviceError>("DeviceScope: ", wanted.name,
                                         " is a GPU, but no unit of this program was compiled by nvcc");
            if (!slot->stream) slot->stream = s.cuda.create_stream(slot->device.physical_index);
            stream = slot->stream;
        }
        allocator = detail::slot_allocator_locked(s, *slot);
        device_ = slot->device;
        // Counted under the lock, so reset_devices cannot retire what this scope uses.
        s.active_scopes.fetch_add(1);
    }
    try {
        if (device_.kind == DeviceKind::Gpu) {
            s.cuda.get_current(prev_gpu_, prev_stream_);
            if (const int e = s.cuda.set_current(device_.physical_index, stream); e != 0)
                throw_error<DeviceError>("DeviceScope: cudaSetDevice(", device_.physical_index, ") for ",
                                         device_.name, " failed: ", s.cuda.error_string(e));
        } else {
#if STRATA_HAS_OPENMP
            prev_threads_ = omp_get_max_threads();
            omp_set_num_threads(std::max(1, device_.cores));
#endif
        }
        try {
            allocator->reserve();
        } catch (...) {
            if (device_.kind == DeviceKind::Gpu) s.cuda.set_current(prev_gpu_, prev_stream_);
#if STRATA_HAS_OPENMP
            else omp_set_num_threads(prev_threads_);
#endif
            throw;
        }
    } catch (...) {
        s.active_scopes.fetch_sub(1);
        throw;
    }
    prev_allocator_ = detail::current_allocator(space());
    detail::current_allocator(space()) = allocator;
    prev_scope_ = detail::current_scope();
    detail::current_scope() = this;
}

STRATA_DECL LogicalDevice current_device() {
    if (const DeviceScope* scope = detail::current_scope()) return scope->device();
    return list_logical_devices(DeviceKind::Cpu).front();
}

//==== Memory statistics ====

namespace detail {
STRATA_DECL const DeviceSlot* find_slot_locked(DeviceState& s, std::string_view name, const char* what) {
    for (const auto& slot : s.slots)
        if (slot->device.name == name) return slot.get();
    throw_error<DeviceError>(what, ": ", name, " is not a logical device; available: ",
                             join_names(logical_locked(s)));
}
}  // namespace detail

STRATA_DECL MemoryPolicy memory_policy(const LogicalDevice& device) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    if (s.initialized) return detail::find_slot_locked(s, device.name, "memory_policy")->policy;
    for (const auto& d : detail::logical_locked(s)) {
        if (d.name != device.name) continue;
        if (s.growth.count(detail::physical_name(d.kind, d.physical_index))) return MemoryPolicy::Growth;
        return d.memory_limit ? MemoryPolicy::Fixed : MemoryPolicy::Direct;
    }
    throw_error<DeviceError>("memory_policy: ", device.name, " is not a logical device; available: ",
                             detail::join_names(detail::logical_locked(s)));
}

STRATA_DECL MemoryInfo memory_info(const LogicalDevice& device) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    if (!s.initialized) {
        for (const auto& d : detail::logical_locked(s))
            if (d.name == device.name) return {0, 0, 0, d.memory_limit};
        throw_error<DeviceError>("memory_info: ", device.name, " is not a logical device; available: ",
                                 detail::join_names(detail::logical_locked(s)));
    }
    const auto* slot = detail::find_slot_locked(s, device.name, "memory_info");
    MemoryInfo info = slot->allocator ? slot->allocator->info() : MemoryInfo{};
    info.limit = slot->device.memory_limit;
    return info;
}

STRATA_DECL MemoryInfo memory_info(std::string_view name) {
    const auto parsed = detail::parse_or_throw(name, "memory_info");
    return memory_info(LogicalDevice{detail::logical_name(parsed.kind, parsed.index), parsed.kind,
                                     parsed.index, 0, 0, 0});
}

STRATA_DECL void reset_memory_stats(const LogicalDevice& device) {
    auto& s = detail::device_state();
    std::lock_guard lock(s.mu);
    if (!s.initialized) return;
    const auto* slot = detail::find_slot_locked(s, device.name, "reset_memory_stats");
    if (slot->allocator) slot->allocator->reset_peak();
}

}  // namespace strata::place
