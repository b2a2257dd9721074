#pragma once
/// \file strata/distribute/collective/host_staged.hpp
/// The cross-process stage of MultiWorkerMirrored<place::Cuda> without NCCL's rule of one GPU per
/// rank: each lane's slice of the gradients leaves its GPU through pinned host memory, is summed
/// over the processes by the ProcessGroup (shared memory on one host, MPI across hosts, the
/// hierarchical transport across several: the host collectives, with their deadlines that name
/// a missing rank by its number), and goes back. What it is for: processes that share a GPU
/// (two logical GPUs of one physical GPU, one per process: NCCL refuses a communicator holding a
/// GPU twice), and GPU jobs where NCCL is not installed. NCCL stays MultiWorkerMirrored's choice
/// where each process's replicas have GPUs of their own (MultiWorkerOptions::device_transport).
///
/// The slice crosses in chunks of `chunk_bytes`, pipelined on the replica's stream: every chunk's
/// copy to the host is queued at once, each followed by an event; chunk k is summed across
/// processes as soon as its event has fired (the later chunks still copying), and its copy back
/// is queued right after its sum. So the copies can overlap the sums: one step should cost about
/// one all-reduce of the slice plus one chunk's copies. Not measured yet (no GPU where it was
/// written); the 4 MiB chunk is a starting point, not a tuned figure.
///
/// Needs MPI (process_group.hpp) and the CUDA runtime (a unit nvcc compiles, STRATA_HAS_CUDA);
/// declares nothing otherwise. STRATA_HAS_HOST_STAGED_STAGE is 1 when compiled.

#include <strata/config.hpp>
#include <strata/distribute/collective/process_group.hpp>

#if STRATA_HAS_CUDA
#define STRATA_HAS_HOST_STAGED_STAGE 1

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <strata/place/place.hpp>

namespace strata::distribute::collective {

class HostStagedStage {
public:
    /// Staging chunks of `chunk_bytes` (4 MiB by default: large enough that each sum across
    /// processes is bandwidth-bound, small enough that the first one starts early).
    explicit HostStagedStage(ProcessGroup& group, std::size_t chunk_bytes = std::size_t(4) << 20)
        : group_(&group), chunk_bytes_(chunk_bytes), lanes_(std::size_t(group.lanes())) {
        STRATA_CHECK(chunk_bytes >= 1024, ValueError, "HostStagedStage: chunk_bytes must be >= 1024, got ", chunk_bytes);
    }
    HostStagedStage(const HostStagedStage&) = delete;
    HostStagedStage& operator=(const HostStagedStage&) = delete;
    ~HostStagedStage() {
        for (auto& l : lanes_) {
            for (auto e : l.events) cudaEventDestroy(e);
            if (l.host) cudaFreeHost(l.host);
        }
    }

    /// Sums `count` elements of device memory `data` over the processes, in place, on lane
    /// `lane` (call on the lane's replica thread, its GPU current); returns when the sum is back
    /// on the GPU. A rank that does not arrive is named after the group's deadline
    /// (DistributedError), as for host memory.
    template <Reducible T>
    void all_reduce(int lane, T* data, std::size_t count) {
        if (count == 0) return;
        Lane& l = lanes_.at(std::size_t(lane));
        const std::size_t bytes = count * sizeof(T);
        reserve(l, bytes);
        const std::size_t per_chunk = std::max<std::size_t>(1, chunk_bytes_ / sizeof(T));
        const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
        reserve_events(l, chunks);
        cudaStream_t s = place::Cuda::stream();
        T* host = static_cast<T*>(l.host);
        for (std::size_t k = 0; k < chunks; ++k) {
            const std::size_t first = k * per_chunk, n = std::min(per_chunk, count - first);
            place::cuda_check(cudaMemcpyAsync(host + first, data + first, n * sizeof(T), cudaMemcpyDeviceToHost, s),
                              "cudaMemcpyAsync (gradients to the host staging buffer)");
            place::cuda_check(cudaEventRecord(l.events[k], s), "cudaEventRecord");
        }
        for (std::size_t k = 0; k < chunks; ++k) {
            const std::size_t first = k * per_chunk, n = std::min(per_chunk, count - first);
            place::cuda_check(cudaEventSynchronize(l.events[k]), "cudaEventSynchronize (a staged chunk)");
            group_->all_reduce(lane, std::span<T>(host + first, n), ReduceOp::Sum,
                               SyncPoint{"all_reduce", "gradients staged through host memory", 0, 0, std::int64_t(k)});
            place::cuda_check(cudaMemcpyAsync(data + first, host + first, n * sizeof(T), cudaMemcpyHostToDevice, s),
                              "cudaMemcpyAsync (the sum back to the GPU)");
        }
        place::cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        l.staged_bytes += 2 * std::int64_t(bytes);
    }

    /// Bytes copied between the GPUs and the staging buffers on `lane` so far (both ways).
    [[nodiscard]] std::int64_t staged_bytes(int lane) const { return lanes_.at(std::size_t(lane)).staged_bytes; }

private:
    struct Lane {
        void* host = nullptr;  // pinned: the copies run asynchronously and at full speed
        std::size_t bytes = 0;
        std::vector<cudaEvent_t> events;
        std::int64_t staged_bytes = 0;
    };
    // Grow-only: the first step sizes the buffer, later ones reuse it.
    static void reserve(Lane& l, std::size_t bytes) {
        if (l.bytes >= bytes) return;
        if (l.host) place::cuda_check(cudaFreeHost(l.host), "cudaFreeHost");
        l.host = nullptr;
        l.bytes = 0;
        place::cuda_check(cudaMallocHost(&l.host, bytes), "cudaMallocHost (the host staging buffer)");
        l.bytes = bytes;
    }
    static void reserve_events(Lane& l, std::size_t n) {
        while (l.events.size() < n) {
            cudaEvent_t e = nullptr;
            place::cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
            l.events.push_back(e);
        }
    }

    ProcessGroup* group_;
    std::size_t chunk_bytes_;
    std::vector<Lane> lanes_;
};

}  // namespace strata::distribute::collective

#endif  // STRATA_HAS_CUDA
