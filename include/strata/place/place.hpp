#pragma once
/// \file strata/place/place.hpp
/// Device placement policies. A place says where a tensor's memory lives and what runs the ops
/// on it (place/algorithm.hpp): `Host` (OpenMP loops, serial when the translation unit has no
/// OpenMP; no Thrust, so a host-only unit does not parse it) and `Cuda` (Thrust's CUDA system on
/// the current stream; only in translation units that nvcc compiles).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "strata/fwd.hpp"
#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/detail/dependent_false.hpp"
#include "strata/place/memory.hpp"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>
#endif

namespace strata::place {

/// Host memory; ops run as OpenMP loops (all threads of the calling thread's OpenMP team size,
/// see strata::set_num_threads), or serially without OpenMP: place/algorithm.hpp.
struct Host {
    using place_tag = Host;
    static constexpr const char* name = "Host";
    static constexpr bool host_accessible = true;

    static void* allocate(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        // Inside a DeviceScope on a host logical device, its memory policy serves the block.
        if (DeviceAllocator* a = detail::current_allocator(MemorySpace::Host)) return a->allocate(bytes);
        // 64-byte alignment: a cache line, and what AVX-512 loads like.
        const std::size_t rounded = (bytes + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, rounded);
        if (!p) throw_error<DeviceError>("Host: out of memory allocating ", bytes, " bytes");
        return p;
    }
    static void deallocate(void* p, std::size_t) noexcept {
        // A block from a device allocator goes back to it, whichever scope or thread frees it.
        if (detail::return_to_owner(p)) return;
        std::free(p);
    }
    /// Host work is synchronous: nothing to wait for.
    static void synchronize() {}
};

#if STRATA_HAS_CUDA
namespace detail {
inline cudaStream_t& current_stream_ref() {
    thread_local cudaStream_t stream = nullptr;
    return stream;
}
}  // namespace detail

/// Throws DeviceError naming the call when a CUDA runtime call fails.
inline void cuda_check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
        // The runtime also keeps the error as this thread's last error: cleared, so that a later
        // call that checks cudaGetLastError (Thrust's launches do) does not report it again as
        // its own (a non-sticky error only; a sticky one stays, as it must).
        (void)cudaGetLastError();
        throw_error<DeviceError>("CUDA: ", what, " failed: ", cudaGetErrorString(status));
    }
}
#endif

/// Whether a `Model` under `OneDevice<Cuda>` may capture its training step (forward, loss,
/// metrics, backward) as a CUDA graph and replay it, instead of launching its ~40 kernels one by
/// one every step (on by default; see train/model.hpp, "CUDA graphs"). A process-wide switch,
/// read at every step: turning it off makes the next step run its kernels one by one.
inline std::atomic<bool>& cuda_graphs_flag() {
    static std::atomic<bool> on{true};
    return on;
}
inline void set_cuda_graphs(bool enable) { cuda_graphs_flag().store(enable); }
inline bool get_cuda_graphs() { return cuda_graphs_flag().load(); }

#if STRATA_HAS_CUDA
namespace detail {
/// Counts the GPU allocations and frees made through Cuda::allocate / deallocate: a captured
/// graph holds device addresses, so it is replayed only while this count is what it was when
/// the graph was captured (no buffer can have moved).
inline std::atomic<std::uint64_t>& cuda_allocation_count() {
    static std::atomic<std::uint64_t> n{0};
    return n;
}
}  // namespace detail
#endif

/// GPU memory; ops run on Thrust's CUDA system on this thread's current stream (its policy(),
/// which place/algorithm.hpp passes to every algorithm).
/// Only usable in translation units compiled by nvcc.
struct Cuda {
    using place_tag = Cuda;
    static constexpr const char* name = "Cuda";
    static constexpr bool host_accessible = false;

#if STRATA_HAS_CUDA
    /// The stream ops of this thread are queued on (a replica sets its own).
    static cudaStream_t stream() { return detail::current_stream_ref(); }
    static void set_stream(cudaStream_t s) { detail::current_stream_ref() = s; }
    /// No stream synchronisation after each algorithm (Thrust's `par` waits for every kernel,
    /// which exposed a launch latency per op: issue 18). Work is stream-ordered; code that hands
    /// device memory to another stream or thread synchronises first (Cuda::synchronize, as the
    /// device paths do), and host reads go through copy(), which waits for its copy.
    static auto policy() { return thrust::cuda::par_nosync.on(stream()); }
    static void* allocate(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        detail::cuda_allocation_count().fetch_add(1, std::memory_order_relaxed);
        // Inside a DeviceScope on a logical GPU, its memory policy serves the block.
        if (DeviceAllocator* a = detail::current_allocator(MemorySpace::Gpu)) return a->allocate(bytes);
        void* p = nullptr;
        cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
        return p;
    }
    static void deallocate(void* p, std::size_t) noexcept {
        if (p) detail::cuda_allocation_count().fetch_add(1, std::memory_order_relaxed);
        if (detail::return_to_owner(p)) return;
        cudaFree(p);
    }
    static void synchronize() { cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }
#endif
};

namespace detail {
/// Pinned (page-locked) host memory that stages host data for a device place: the host writes
/// into it, then `send` queues the copy to device memory on this thread's stream and returns at
/// once; the next `acquire` waits for that copy only (an event), not for the stream. A pageable
/// source would make every copy synchronous (the driver stages it) and keep the GPU waiting on
/// the host each step (issue 18). Defined for nvcc's units; empty elsewhere.
template <class T>
class StagingBuffer;
#if STRATA_HAS_CUDA
template <class T>
class StagingBuffer {
public:
    StagingBuffer() = default;
    StagingBuffer(const StagingBuffer&) = delete;
    StagingBuffer& operator=(const StagingBuffer&) = delete;
    ~StagingBuffer() {
        if (event_) (void)cudaEventDestroy(event_);
        if (host_) (void)cudaFreeHost(host_);
    }
    /// Host memory for `n` values, once the copy that last read it has completed.
    T* acquire(std::size_t n) {
        if (event_) cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize (a host-to-device staging copy)");
        if (n > capacity_) {
            if (host_) cuda_check(cudaFreeHost(host_), "cudaFreeHost");
            host_ = nullptr;
            capacity_ = 0;
            void* p = nullptr;
            cuda_check(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocPortable), "cudaHostAlloc (a staging buffer)");
            host_ = static_cast<T*>(p);
            capacity_ = n;
        }
        return host_;
    }
    /// Queues the copy of the first `n` values acquired to device memory `dst` on this thread's
    /// stream, and returns without waiting for it.
    void send(T* dst, std::size_t n) {
        if (n == 0) return;
        cuda_check(cudaMemcpyAsync(dst, host_, n * sizeof(T), cudaMemcpyHostToDevice, Cuda::stream()),
                   "cudaMemcpyAsync (host to device, staged)");
        if (!event_) cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
        cuda_check(cudaEventRecord(event_, Cuda::stream()), "cudaEventRecord");
    }

private:
    T* host_ = nullptr;
    std::size_t capacity_ = 0;
    cudaEvent_t event_ = nullptr;
};
#endif
}  // namespace detail

/// Satisfied by the placement policies (`Host`, `Cuda`, and user places with a `place_tag`).
template <class P>
concept Place = requires { typename P::place_tag; } && std::is_same_v<typename P::place_tag, P>;

/// Whether host code may read and write memory of place `P` directly.
template <class P>
inline constexpr bool host_accessible_v = P::host_accessible;

/// Fails to compile, with a sentence, when `P` cannot be used in this translation unit.
template <class P>
constexpr void require_usable() {
    static_assert(Place<P>, "strata: not a place; use strata::place::Host or strata::place::Cuda");
    if constexpr (std::is_same_v<P, Cuda>) {
        static_assert(STRATA_HAS_CUDA || strata::detail::dependent_false<P>,
                      "strata::place::Cuda can only be used in a translation unit compiled by nvcc "
                      "(a .cu file); use strata::place::Host in host-compiled code");
    }
}

}  // namespace strata::place
