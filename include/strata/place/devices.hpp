#pragma once
/// \file strata/place/devices.hpp
/// What TensorFlow's `tf.config` gives, in C++: list the physical devices (the host and, in
/// programs with a translation unit compiled by nvcc, each GPU); restrict the visible GPUs;
/// split a physical device into logical (virtual) devices, each with its share of host cores or
/// its own CUDA stream and memory limit; choose a memory policy (grow on demand, or a fixed
/// amount up front); resolve device names with soft placement; log where work is placed; and
/// make a logical device current on a thread (`DeviceScope`).
///
/// \code
/// namespace pd = strata::place;
/// auto cpu = pd::list_physical_devices(pd::DeviceKind::Cpu).front();
/// pd::set_logical_device_configuration(cpu, {{.cores = 1}, {.cores = 1}});   // two replicas
/// for (const auto& d : pd::list_logical_devices()) std::puts(d.name.c_str()); // /device:CPU:0, :1
/// {
///     pd::DeviceScope scope("/device:CPU:1");   // this thread: 1 OpenMP thread, CPU:1's memory
///     strata::Tensor<float> t({256, 256});
/// }
/// \endcode
///
/// The configuration rule (saner than TensorFlow's): devices can be configured (visible devices,
/// logical split, memory growth) until they are *initialised*, which happens at the first
/// `DeviceScope` or at `initialize_devices()` (what strategies call when they are built).
/// Listing devices does not initialise them. Configuring afterwards throws DeviceError saying
/// what initialised them; `reset_devices()` starts over (tests use it).
///
/// GPUs are found when any translation unit of the program was compiled by nvcc: that unit
/// registers the CUDA calls at start-up, so host-compiled units see the GPUs too. Where
/// `cudaGetDeviceCount` fails (no driver, no GPU), the list simply has no GPU.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/detail/dependent_false.hpp"
#include "strata/place/memory.hpp"
#include "strata/place/place.hpp"
#include "strata/place/threads.hpp"

#if STRATA_HAS_OPENMP
#include <omp.h>
#endif
#if STRATA_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::place {

//==== Devices ====

/// The kind of a device: the host's CPUs or a GPU.
enum class DeviceKind { Cpu, Gpu };

/// "CPU" or "GPU", as device names spell it.
inline const char* kind_name(DeviceKind k) { return k == DeviceKind::Cpu ? "CPU" : "GPU"; }

/// A device of this machine, as `list_physical_devices` reports it.
///
/// - `name`: "/physical_device:CPU:0" or "/physical_device:GPU:<index>";
/// - `index`: its index among the devices of its kind (the CUDA device ordinal for a GPU);
/// - `cores`: hardware threads of the host (0 for a GPU);
/// - `memory_bytes`: host RAM, or a GPU's total memory;
/// - `description`: the CPU model, or the GPU's name, compute capability and SM count.
struct PhysicalDevice {
    std::string name;
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;
    int cores = 0;
    std::size_t memory_bytes = 0;
    std::string description;
    bool operator==(const PhysicalDevice&) const = default;
};

/// A memory size in bytes, for `MemoryLimit`: `Bytes{4096}`.
struct Bytes {
    std::size_t value = 0;
};

/// A memory size in megabytes as tf.config counts them, 2^20 bytes each (TensorFlow's
/// `memory_limit=1024` is `Megabytes{1024}`, 1 GiB).
struct Megabytes {
    std::size_t value = 0;
};

/// The memory limit of a logical device, always given with its unit: `Megabytes{1024}` (as
/// tf.config's `memory_limit=1024`) or `Bytes{n}`; `{}` is no limit. A bare number does not
/// compile, since TensorFlow reads it as megabytes and strata used to read it as bytes.
///
///     pd::set_logical_device_configuration(gpu, {{.memory_limit = pd::Megabytes{1024}},
///                                                {.memory_limit = pd::Megabytes{1024}}});
class MemoryLimit {
public:
    /// No limit.
    constexpr MemoryLimit() = default;
    /// A limit of `b.value` bytes (0: no limit).
    constexpr MemoryLimit(Bytes b) : bytes_(b.value) {}  // NOLINT: implicit, the unit is in the type
    /// A limit of `m.value` × 2^20 bytes (0: no limit); ValueError when that overflows size_t.
    constexpr MemoryLimit(Megabytes m) : bytes_(m.value << 20) {  // NOLINT
        if (m.value > (std::numeric_limits<std::size_t>::max() >> 20))
            throw_error<ValueError>("MemoryLimit: Megabytes{", m.value, "} does not fit in a size_t of bytes (at most ",
                                    std::numeric_limits<std::size_t>::max() >> 20, " megabytes)");
    }
    template <class N>
        requires std::is_arithmetic_v<N>
    MemoryLimit(N) {  // NOLINT
        static_assert(strata::detail::dependent_false<N>,
                      "strata::place::MemoryLimit: a bare number has no unit; write strata::place::Megabytes{1024} "
                      "(tf.config's memory_limit=1024) or strata::place::Bytes{n}");
    }
    /// The limit in bytes, 0 for none.
    constexpr std::size_t bytes() const { return bytes_; }
    /// Whether there is a limit.
    constexpr explicit operator bool() const { return bytes_ != 0; }
    constexpr bool operator==(const MemoryLimit&) const = default;

private:
    std::size_t bytes_ = 0;
};

/// One logical device to carve out of a physical device (`set_logical_device_configuration`).
///
/// - `cores`: host devices only: the OpenMP threads its work runs with; 0 = an even share of
///   the cores the other logical devices of the host leave. Must be 0 for a GPU.
/// - `memory_limit`: what this logical device may hold, with its unit: `Megabytes{256}` (as
///   tf.config's `memory_limit=256`) or `Bytes{n}`; `{}` (the default) = no limit. With a limit
///   and no memory growth the whole limit is reserved up front (policy Fixed).
struct LogicalDeviceConfiguration {
    int cores = 0;
    MemoryLimit memory_limit{};
};

/// Whether the logical host devices may together ask for more cores than the hardware has.
enum class Oversubscribe { No, Yes };

/// A device strategies place replicas and variables on.
///
/// - `name`: "/device:CPU:<index>" or "/device:GPU:<index>" (logical GPUs are numbered across
///   the visible GPUs: two logical GPUs on GPU 0 are GPU:0 and GPU:1, GPU 1's first is GPU:2);
/// - `index`: its index among the logical devices of its kind;
/// - `physical_index`: the physical device it is carved from;
/// - `cores`: OpenMP threads of a host device (0 for a GPU);
/// - `memory_limit`: its memory limit in bytes, 0 for none.
struct LogicalDevice {
    std::string name;
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;
    int physical_index = 0;
    int cores = 0;
    std::size_t memory_limit = 0;
    bool operator==(const LogicalDevice&) const = default;
};

class DeviceScope;

namespace detail {

// The CUDA calls, registered by translation units compiled by nvcc (see the end of this file).
// Plain function pointers with void* streams, so this struct has one layout in every unit.
struct CudaHooks {
    int (*device_count)() noexcept = nullptr;
    void (*describe)(int device, std::string& description, std::size_t& memory) = nullptr;
    void* (*create_stream)(int device) = nullptr;
    void (*destroy_stream)(void* stream) noexcept = nullptr;
    void (*get_current)(int& device, void*& stream) noexcept = nullptr;
    int (*set_current)(int device, void* stream) noexcept = nullptr;  // 0 or a cudaError_t
    const char* (*error_string)(int error) noexcept = nullptr;
    void* (*allocate)(std::size_t bytes) noexcept = nullptr;
    void (*deallocate)(void* p) noexcept = nullptr;
};

STRATA_DECL void register_cuda_hooks(const CudaHooks& hooks);

}  // namespace detail

/// The physical devices of this machine, the host first, then each GPU by CUDA ordinal;
/// only those of `kind` when given.
///
/// Ensures: exactly one CPU device ("/physical_device:CPU:0", all hardware threads, host RAM);
/// GPUs only when a unit compiled by nvcc is in the program and `cudaGetDeviceCount` succeeds.
///
/// \code
/// for (const auto& d : strata::place::list_physical_devices())
///     std::printf("%s %s\n", d.name.c_str(), d.description.c_str());
/// \endcode
STRATA_DECL std::vector<PhysicalDevice> list_physical_devices(std::optional<DeviceKind> kind = {});

/// Restricts the GPUs strategies may use to those in `devices` (the CPU is always visible,
/// whether listed or not; an empty list hides every GPU). Logical GPUs are renumbered over the
/// visible ones.
///
/// Requires: each device is one `list_physical_devices()` returns (matched by name), else
/// DeviceError naming it and listing the available ones; the devices are not initialised yet.
///
/// \code
/// auto gpus = strata::place::list_physical_devices(strata::place::DeviceKind::Gpu);
/// if (!gpus.empty()) strata::place::set_visible_devices({gpus[0]});  // use only the first GPU
/// \endcode
STRATA_DECL void set_visible_devices(const std::vector<PhysicalDevice>& devices);

/// The visible physical devices (the CPU and the visible GPUs); only those of `kind` when given.
STRATA_DECL std::vector<PhysicalDevice> get_visible_devices(std::optional<DeviceKind> kind = {});

/// Splits `device` into `configs.size()` logical devices (an empty list: back to one).
///
/// - Host: logical device i runs its work with `configs[i].cores` OpenMP threads; those with
///   `cores == 0` share evenly what the others leave (at least one each). Unless `oversubscribe`
///   is `Oversubscribe::Yes`, the cores asked for (one at least for each unspecified device)
///   must not exceed the hardware threads: DeviceError naming both numbers otherwise.
/// - GPU: N logical GPUs, each with its own stream (made on first use) and `memory_limit`;
///   `cores` must be 0.
/// - The memory limits together must fit in the device's memory (when it is known).
///
/// Requires: `device` is a physical device of this machine; the devices are not initialised.
///
/// \code
/// auto cpu = strata::place::list_physical_devices(strata::place::DeviceKind::Cpu).front();
/// strata::place::set_logical_device_configuration(cpu, {{}, {}});  // two halves of the host
/// \endcode
STRATA_DECL void set_logical_device_configuration(const PhysicalDevice& device,
                                             std::vector<LogicalDeviceConfiguration> configs,
                                             Oversubscribe oversubscribe = Oversubscribe::No);

/// The logical configuration set for `device` (cores resolved), or empty when none was set.
STRATA_DECL std::vector<LogicalDeviceConfiguration> get_logical_device_configuration(const PhysicalDevice& device);

/// Turns memory growth on or off for every logical device of `device`: a caching pool that
/// takes memory from the system as it is needed and keeps freed blocks for reuse (capped by a
/// logical device's `memory_limit` when it has one). Off (the default): a logical device with a
/// memory limit reserves the whole limit up front; one without allocates directly.
///
/// Requires: `device` is a physical device of this machine; the devices are not initialised.
///
/// \code
/// for (const auto& g : strata::place::list_physical_devices(strata::place::DeviceKind::Gpu))
///     strata::place::set_memory_growth(g, true);
/// \endcode
STRATA_DECL void set_memory_growth(const PhysicalDevice& device, bool enable);

/// Whether memory growth is on for `device`.
STRATA_DECL bool get_memory_growth(const PhysicalDevice& device);

/// The logical devices: without configuration, one per visible physical device; only those
/// of `kind` when given. Listing does not initialise the devices.
///
/// \code
/// auto replicas = strata::place::list_logical_devices(strata::place::DeviceKind::Cpu);
/// \endcode
STRATA_DECL std::vector<LogicalDevice> list_logical_devices(std::optional<DeviceKind> kind = {});

/// Freezes the device configuration (visible devices, logical split, memory growth) as it is.
/// The first DeviceScope does it too; strategies call it when they are built. `by` says who,
/// for the message a later configuration call throws. Calling it again does nothing.
STRATA_DECL void initialize_devices(std::string_view by = "initialize_devices()");

/// Whether the device configuration is frozen (see initialize_devices).
STRATA_DECL bool devices_initialized();

/// Back to the start: every GPU visible, one logical device per physical device, memory growth
/// off, not initialised, devices probed again. Memory cached by the device allocators is given
/// back; blocks still held by tensors stay valid and are freed when those tensors are.
/// Placement-log and soft-placement settings are kept.
///
/// Requires: no DeviceScope is alive on any thread (DeviceError with their count otherwise).
STRATA_DECL void reset_devices();

//==== Placement: soft placement and the placement log ====

/// With soft placement on (the default, as in TensorFlow), `find_device` answers a request for
/// a device that is not there with /device:CPU:0 and a one-line warning; off, it throws.
STRATA_DECL void set_soft_device_placement(bool enable);
/// Whether soft placement is on.
STRATA_DECL bool get_soft_device_placement();

/// Turns the placement log on or off (off by default): `log_placement` prints only when on.
STRATA_DECL void set_log_device_placement(bool enable);
/// Whether the placement log is on.
STRATA_DECL bool get_log_device_placement();

/// Where placement-log lines and soft-placement warnings go: `sink` gets each line whole,
/// without its newline, one call at a time. An empty function restores the default, stderr.
///
/// Requires: `sink` does not call log_placement or find_device (it runs under the log's lock).
///
/// \code
/// std::vector<std::string> lines;
/// strata::place::set_placement_log_sink([&](std::string_view l) { lines.emplace_back(l); });
/// \endcode
STRATA_DECL void set_placement_log_sink(std::function<void(std::string_view)> sink);

/// When the placement log is on, writes the line "<what> placed on <device.name>"
/// (e.g. "dense_1/kernel placed on /device:CPU:1"). Thread-safe; lines never interleave.
STRATA_DECL void log_placement(std::string_view what, const LogicalDevice& device);

/// The logical device a name denotes: "/device:GPU:1", "device:GPU:1", "GPU:1", "/gpu:1",
/// "gpu" (index 0), "cpu", any case.
///
/// - A malformed name ("tpu:0", "gpu:x") throws ValueError.
/// - A well-formed name of a device that is not there: with soft placement, /device:CPU:0 and
///   the warning "strata: soft placement: <name> is not available; using /device:CPU:0"; without,
///   DeviceError naming the device and listing the available ones.
///
/// \code
/// auto d = strata::place::find_device("/device:GPU:3");   // /device:CPU:0 on a machine without it
/// \endcode
STRATA_DECL LogicalDevice find_device(std::string_view name);

//==== Making a device current: DeviceScope ====

/// Makes a logical device current on the calling thread until the scope ends (RAII; scopes
/// nest, and each restores what it found).
///
/// - Host device: this thread's OpenMP team size becomes the device's cores
///   (`omp_set_num_threads`), and host tensors allocated here come from the device's allocator.
/// - GPU (needs a unit compiled by nvcc in the program): `cudaSetDevice(physical_index)`,
///   `place::Cuda::set_stream(the logical GPU's own stream)`, and GPU tensors allocated here
///   come from the device's allocator. Host allocations keep the enclosing host device's policy.
/// - `current_device()` returns the device; the first scope initialises the devices; a Fixed
///   policy reserves its arena on entry (DeviceError if the system refuses it).
///
/// Requires: `device` is a logical device of the current configuration (from
/// list_logical_devices or find_device after configuring), else DeviceError.
///
/// \code
/// std::thread replica([] {
///     strata::place::DeviceScope on("/device:CPU:1");
///     strata::Tensor<float> w({128, 64});        // from CPU:1's memory policy
/// });
/// replica.join();
/// \endcode
class DeviceScope {
public:
    explicit DeviceScope(const LogicalDevice& device) { enter(device); }
    /// Resolves `name` with find_device (so soft placement applies) and enters that device.
    explicit DeviceScope(std::string_view name) { enter(find_device(name)); }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

    STRATA_DECL ~DeviceScope();

    /// The device this scope made current.
    const LogicalDevice& device() const noexcept { return device_; }

private:
    MemorySpace space() const noexcept {
        return device_.kind == DeviceKind::Cpu ? MemorySpace::Host : MemorySpace::Gpu;
    }

    STRATA_DECL void enter(const LogicalDevice& wanted);

    LogicalDevice device_;
    DeviceScope* prev_scope_ = nullptr;
    DeviceAllocator* prev_allocator_ = nullptr;
    int prev_threads_ = 1;
    int prev_gpu_ = -1;
    void* prev_stream_ = nullptr;
};

/// The device the innermost DeviceScope of this thread made current; /device:CPU:0 outside any.
STRATA_DECL LogicalDevice current_device();

//==== Memory statistics ====

namespace detail {
}  // namespace detail

/// The memory policy `device` has (or will have, before initialisation).
STRATA_DECL MemoryPolicy memory_policy(const LogicalDevice& device);

/// Memory statistics of a logical device (TensorFlow's `get_memory_info`): bytes in use, peak,
/// reserved from the system, and the limit. All zero (but the limit) until a DeviceScope has
/// used the device; only memory allocated inside its scopes is counted.
///
/// \code
/// auto info = strata::place::memory_info(strata::place::find_device("/device:CPU:1"));
/// std::printf("%zu bytes in use, peak %zu\n", info.current, info.peak);
/// \endcode
STRATA_DECL MemoryInfo memory_info(const LogicalDevice& device);

/// memory_info of the device `name` denotes (no soft placement: DeviceError when it is not there).
STRATA_DECL MemoryInfo memory_info(std::string_view name);

/// Sets the peak of `device` to the bytes it has in use now (TensorFlow's reset_memory_stats).
STRATA_DECL void reset_memory_stats(const LogicalDevice& device);

//==== CUDA: registered by every unit nvcc compiles ====

#if STRATA_HAS_CUDA
namespace detail {
inline int cuda_device_count() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver or no GPU: a machine without GPUs, not an error
        return 0;
    }
    return n;
}
inline void cuda_describe(int device, std::string& description, std::size_t& memory) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        (void)cudaGetLastError();
        description = "GPU " + std::to_string(device) + " (properties unavailable)";
        memory = 0;
        return;
    }
    description = strata::detail::concat(p.name, ", compute capability ", p.major, ".", p.minor, ", ",
                                         p.multiProcessorCount, " SMs");
    memory = p.totalGlobalMem;
}
inline void* cuda_create_stream(int device) {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) (void)cudaGetLastError(), previous = -1;
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    const cudaError_t status = cudaStreamCreate(&stream);
    if (previous >= 0) (void)cudaSetDevice(previous);
    cuda_check(status, "cudaStreamCreate");
    return stream;
}
inline void cuda_destroy_stream(void* stream) noexcept {
    if (stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
inline void cuda_get_current(int& device, void*& stream) noexcept {
    if (cudaGetDevice(&device) != cudaSuccess) (void)cudaGetLastError(), device = -1;
    stream = Cuda::stream();
}
inline int cuda_set_current(int device, void* stream) noexcept {
    if (device >= 0) {
        if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return int(e);
    }
    Cuda::set_stream(static_cast<cudaStream_t>(stream));
    return 0;
}
inline const char* cuda_error_string(int e) noexcept { return cudaGetErrorString(cudaError_t(e)); }
inline void* cuda_allocate(std::size_t bytes) noexcept {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    return p;
}
inline void cuda_deallocate(void* p) noexcept { (void)cudaFree(p); }

// Dynamic initialisation at start-up of every nvcc-compiled unit that includes this header, so
// GPUs are listed even by code compiled without nvcc.
inline const bool cuda_hooks_registered = (register_cuda_hooks(CudaHooks{
                                               &cuda_device_count, &cuda_describe, &cuda_create_stream,
                                               &cuda_destroy_stream, &cuda_get_current, &cuda_set_current,
                                               &cuda_error_string, &cuda_allocate, &cuda_deallocate}),
                                           true);
}  // namespace detail
#endif

}  // namespace strata::place

#if STRATA_DEFINITIONS
#include "strata/place/impl/devices.ipp"
#endif
