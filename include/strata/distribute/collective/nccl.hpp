#pragma once
/// \file strata/distribute/collective/nccl.hpp
/// All-reduce across the GPUs of one process through NCCL (ncclCommInitAll + ncclAllReduce).
///
/// Compiled only when the translation unit defines STRATA_WITH_NCCL (any compiler, with the
/// CUDA and NCCL include paths; nccl.h must then exist) or is compiled by nvcc
/// (`__CUDACC__`) where <nccl.h> can be found; otherwise this header declares nothing, so it
/// is harmless to include everywhere. STRATA_HAS_NCCL is defined to 1 when it is compiled.
/// Link with -lnccl and the CUDA runtime. For replicas that share one memory use ReplicaGroup
/// (all_reduce.hpp).

#if defined(STRATA_WITH_NCCL) || (defined(__CUDACC__) && __has_include(<nccl.h>))
#define STRATA_HAS_NCCL 1

#include <strata/core/error.hpp>
#include <strata/distribute/collective/common.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "strata/distribute/collective/nccl.hpp needs NCCL >= 2.10 (for ncclAvg, ReduceOp::Mean)"
#endif

namespace strata::distribute::collective {

namespace detail {

/// Throws DistributedError (DeviceError for CUDA and system failures) naming the call, NCCL's
/// error string and, when there is one, NCCL's last error message.
inline void nccl_check(ncclResult_t result, const char* call, ncclComm_t comm = nullptr) {
    if (result == ncclSuccess) return;
    std::string msg = std::string(call) + " failed: " + ncclGetErrorString(result);
    if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
        msg += std::string(" (") + last + ")";
    if (result == ncclUnhandledCudaError || result == ncclSystemError) throw DeviceError(msg);
    throw DistributedError(msg);
}

/// Throws DeviceError naming the call and cudaGetErrorString.
inline void cuda_check(cudaError_t result, const char* call) {
    if (result == cudaSuccess) return;
    throw DeviceError(std::string(call) + " failed: " + cudaGetErrorName(result) + ": " +
                      cudaGetErrorString(result));
}

template <Reducible T>
constexpr ncclDataType_t nccl_type_of = std::same_as<T, float> ? ncclFloat32 : ncclFloat64;

}  // namespace detail

/// One NCCL communicator per local GPU, created together by ncclCommInitAll (RAII).
///
/// Represents: a clique of the listed devices of this process; member i drives devices()[i].
/// Requires: device ids distinct and in [0, cudaGetDeviceCount()) (DeviceError otherwise);
/// at least one device (ValueError).
/// Ensures: the communicators are destroyed (or aborted, if NCCL reported an asynchronous
/// error) on destruction; every failure is a DistributedError or DeviceError carrying
/// ncclGetErrorString / cudaGetErrorString.
///
/// \code
///   NcclCommunicator comm({0, 1});
///   float* bufs[2] = {d0, d1};  cudaStream_t streams[2] = {s0, s1};
///   comm.all_reduce(std::span<float* const>(bufs), n, ReduceOp::Sum,
///                   std::span<const cudaStream_t>(streams));
///   comm.synchronize(std::span<const cudaStream_t>(streams), std::chrono::seconds(60));
/// \endcode
class NcclCommunicator {
public:
    explicit NcclCommunicator(std::vector<int> devices) : devices_(std::move(devices)) {
        STRATA_CHECK(!devices_.empty(), ValueError, "NcclCommunicator: no devices given");
        int count = 0;
        detail::cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
        for (std::size_t i = 0; i < devices_.size(); ++i) {
            const int d = devices_[i];
            STRATA_CHECK(d >= 0 && d < count, DeviceError, "NcclCommunicator: device ", d,
                         " does not exist; ", count, " CUDA devices are visible");
            STRATA_CHECK(std::count(devices_.begin(), devices_.end(), d) == 1, ValueError,
                         "NcclCommunicator: device ", d, " is listed more than once");
        }
        comms_.assign(devices_.size(), nullptr);
        detail::nccl_check(ncclCommInitAll(comms_.data(), static_cast<int>(devices_.size()),
                                           devices_.data()),
                           "ncclCommInitAll");
    }

    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;
    NcclCommunicator(NcclCommunicator&& other) noexcept
        : devices_(std::move(other.devices_)), comms_(std::move(other.comms_)) {
        other.comms_.clear();
    }
    NcclCommunicator& operator=(NcclCommunicator&& other) noexcept {
        if (this != &other) {
            release();
            devices_ = std::move(other.devices_);
            comms_ = std::move(other.comms_);
            other.comms_.clear();
        }
        return *this;
    }
    ~NcclCommunicator() { release(); }

    /// Number of devices (members).
    [[nodiscard]] int size() const noexcept { return static_cast<int>(comms_.size()); }
    [[nodiscard]] const std::vector<int>& devices() const noexcept { return devices_; }
    /// Member i's raw communicator, for NCCL calls this class does not wrap.
    [[nodiscard]] ncclComm_t comm(int i) const { return comms_.at(static_cast<std::size_t>(i)); }

    /// Enqueues an in-place all-reduce of `count` elements: buffers[i] is device memory on
    /// devices()[i], reduced on streams[i]. Returns once enqueued (asynchronous, as NCCL);
    /// wait with synchronize() or on the streams. Mean uses ncclAvg.
    /// Requires buffers.size() == streams.size() == size() (ShapeError).
    template <Reducible T>
    void all_reduce(std::span<T* const> buffers, std::size_t count, ReduceOp op,
                    std::span<const cudaStream_t> streams) {
        all_reduce(std::span<const T* const>(buffers.data(), buffers.size()), buffers, count, op,
                   streams);
    }

    /// Out-of-place variant: reduces send[i] into recv[i] (they may be equal).
    template <Reducible T>
    void all_reduce(std::span<const T* const> send, std::span<T* const> recv, std::size_t count,
                    ReduceOp op, std::span<const cudaStream_t> streams) {
        check_members(send.size(), "send buffers");
        check_members(recv.size(), "receive buffers");
        check_members(streams.size(), "streams");
        const ncclRedOp_t nccl_op = op == ReduceOp::Mean ? ncclAvg : ncclSum;
        detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
        ncclResult_t first = ncclSuccess;
        for (std::size_t i = 0; i < comms_.size() && first == ncclSuccess; ++i)
            first = ncclAllReduce(send[i], recv[i], count, detail::nccl_type_of<T>, nccl_op,
                                  comms_[i], streams[i]);
        // Close the group whatever happened, so that NCCL's group state is not left open.
        const ncclResult_t end = ncclGroupEnd();
        detail::nccl_check(first, "ncclAllReduce");
        detail::nccl_check(end, "ncclGroupEnd");
    }

    /// Throws if NCCL reported an asynchronous error on any member (e.g. a peer failure).
    void check_async() const {
        for (std::size_t i = 0; i < comms_.size(); ++i) {
            ncclResult_t async = ncclSuccess;
            detail::nccl_check(ncclCommGetAsyncError(comms_[i], &async), "ncclCommGetAsyncError");
            if (async != ncclSuccess && async != ncclInProgress)
                detail::nccl_check(async, ("NCCL on device " + std::to_string(devices_[i])).c_str(),
                                   comms_[i]);
        }
    }

    /// Waits until every stream is idle, polling NCCL's asynchronous errors. A stream still
    /// busy after `timeout` makes it abort the communicators (this object is unusable after)
    /// and throw DistributedError naming the devices that did not finish: a stuck collective
    /// is an error, not a hang. Requires streams.size() == size().
    void synchronize(std::span<const cudaStream_t> streams,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
        check_members(streams.size(), "streams");
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            std::string busy;
            for (std::size_t i = 0; i < streams.size(); ++i) {
                const cudaError_t q = cudaStreamQuery(streams[i]);
                if (q == cudaErrorNotReady) {
                    busy += (busy.empty() ? "" : ", ") + std::to_string(devices_[i]);
                    continue;
                }
                detail::cuda_check(q, "cudaStreamQuery");
            }
            check_async();
            if (busy.empty()) return;
            if (std::chrono::steady_clock::now() > deadline) {
                abort_all();
                throw DistributedError("nccl all_reduce: device(s) " + busy +
                                       " did not finish within " +
                                       std::to_string(timeout.count()) +
                                       " ms; the communicators were aborted");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

private:
    void check_members(std::size_t got, const char* what) const {
        STRATA_CHECK(got == comms_.size(), ShapeError, "NcclCommunicator: ", got, " ", what,
                     " given for ", comms_.size(), " devices");
    }

    void abort_all() noexcept {
        for (auto& c : comms_)
            if (c != nullptr) {
                ncclCommAbort(c);
                c = nullptr;
            }
    }

    void release() noexcept {
        for (auto& c : comms_) {
            if (c == nullptr) continue;
            ncclResult_t async = ncclSuccess;
            if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async == ncclSuccess)
                ncclCommDestroy(c);
            else
                ncclCommAbort(c);
            c = nullptr;
        }
        comms_.clear();
    }

    std::vector<int> devices_;
    std::vector<ncclComm_t> comms_;
};

}  // namespace strata::distribute::collective

#endif  // STRATA_WITH_NCCL || (__CUDACC__ && <nccl.h>)
