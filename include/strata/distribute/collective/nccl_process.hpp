#pragma once
/// \file strata/distribute/collective/nccl_process.hpp
/// The cross-process stage of MultiWorkerMirrored for GPU memory: one NCCL communicator per
/// lane (local replica) spanning the processes of a ProcessGroup, set up the way NCCL's guide
/// and Horovod do it — rank 0 calls ncclGetUniqueId, the id goes to every rank over the process
/// group (MPI or shared memory), and every rank calls ncclCommInitRank with its own GPU current.
/// Needs MPI (process_group.hpp) and NCCL (nccl.hpp's conditions: nvcc, or STRATA_WITH_NCCL);
/// declares nothing otherwise. STRATA_HAS_NCCL_PROCESS is 1 when compiled.
///
/// Every all-reduce is polled against the group's deadline (cudaStreamQuery and
/// ncclCommGetAsyncError): a rank that stalls or dies makes the others abort the communicator
/// and throw DistributedError instead of waiting in the kernel forever (the failure NCCL users
/// report most, NVIDIA/nccl#585). NCCL cannot say which rank is missing; the error says so.

#include <strata/distribute/collective/nccl.hpp>
#include <strata/distribute/collective/process_group.hpp>

#if defined(STRATA_HAS_NCCL)
#define STRATA_HAS_NCCL_PROCESS 1

#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace strata::distribute::collective {

class NcclProcessStage {
public:
    /// Lanes are created later, each by init_lane on its replica's thread.
    NcclProcessStage(ProcessGroup& group, std::chrono::milliseconds timeout)
        : group_(&group), timeout_(timeout), lanes_(std::size_t(group.lanes())) {}
    NcclProcessStage(const NcclProcessStage&) = delete;
    NcclProcessStage& operator=(const NcclProcessStage&) = delete;
    ~NcclProcessStage() {
        for (auto& l : lanes_) {
            if (l.comm == nullptr) continue;
            ncclResult_t async = ncclSuccess;
            if (!l.failed && ncclCommGetAsyncError(l.comm, &async) == ncclSuccess && async == ncclSuccess)
                ncclCommDestroy(l.comm);
            else
                ncclCommAbort(l.comm);
            if (l.stream != nullptr) cudaStreamDestroy(l.stream);
        }
    }

    /// Creates lane `lane`'s communicator across the processes. Call on the lane's thread with
    /// its GPU current, on every rank (ncclCommInitRank waits for all of them; the id's
    /// broadcast has the group's deadline).
    void init_lane(int lane) {
        Lane& l = lanes_.at(std::size_t(lane));
        ncclUniqueId id{};
        if (group_->rank() == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        // The 128-byte id travels as doubles: the broadcast copies bits, it computes nothing.
        std::vector<double> words((sizeof(id) + sizeof(double) - 1) / sizeof(double), 0.0);
        std::memcpy(words.data(), &id, sizeof(id));
        group_->broadcast(lane, std::span<double>(words), 0, SyncPoint{"broadcast", "NCCL unique id"});
        std::memcpy(&id, words.data(), sizeof(id));
        detail::cuda_check(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        detail::nccl_check(ncclCommInitRank(&l.comm, group_->size(), id, group_->rank()), "ncclCommInitRank");
    }

    /// Sums `count` elements of device memory `data` over the processes, in place, on lane
    /// `lane`; returns when the sum is complete (or throws: see the file comment).
    template <Reducible T>
    void all_reduce(int lane, T* data, std::size_t count) {
        Lane& l = lanes_.at(std::size_t(lane));
        STRATA_CHECK(l.comm != nullptr, DistributedError, "NcclProcessStage: lane ", lane, " was not initialized");
        if (count == 0) return;
        detail::nccl_check(ncclAllReduce(data, data, count, detail::nccl_type_of<T>, ncclSum, l.comm, l.stream),
                           "ncclAllReduce", l.comm);
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (int spins = 0;; ++spins) {
            const cudaError_t q = cudaStreamQuery(l.stream);
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) detail::cuda_check(q, "cudaStreamQuery");
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(l.comm, &async);
            if (async != ncclSuccess && async != ncclInProgress) {
                l.failed = true;
                detail::nccl_check(async, "NCCL all_reduce across processes", l.comm);
            }
            if (std::chrono::steady_clock::now() > deadline) {
                l.failed = true;
                ncclCommAbort(l.comm);
                l.comm = nullptr;
                throw_error<DistributedError>("across processes: NCCL all_reduce (lane ", lane, ") did not complete within ",
                                              timeout_.count(), " ms: a rank stalled or died (NCCL cannot tell which); ",
                                              "the communicator was aborted");
            }
            if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

private:
    struct Lane {
        ncclComm_t comm = nullptr;
        cudaStream_t stream = nullptr;
        bool failed = false;
    };
    ProcessGroup* group_;
    std::chrono::milliseconds timeout_;
    std::vector<Lane> lanes_;
};

}  // namespace strata::distribute::collective

#endif  // STRATA_HAS_NCCL
