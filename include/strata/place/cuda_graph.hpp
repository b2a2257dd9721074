#pragma once
/// \file strata/place/cuda_graph.hpp
/// `detail::CudaStepGraph`: a unit of GPU work (a training step's forward, loss, metrics and
/// backward) captured once as a CUDA graph and replayed, so that a step costs one launch
/// instead of one per kernel (issue 18: at batch 128 the seed CNN's ~40 kernels take 0.31 ms on
/// an H200, their launches and waits as long again).
///
/// A graph holds what the capture saw: device addresses, launch shapes, every scalar argument.
/// It is replayed only when all of that is certain to hold again:
/// - the caller's `Key` is the one captured (batch size, loss scale, the buffers it names);
/// - no GPU allocation or free has happened since the capture (place::detail::
///   cuda_allocation_count), so no buffer the kernels use can have moved;
/// - the caller guarantees the rest (train/model.hpp uses it only for networks without random
///   layers, without sample weights or host-read metrics, keeps the optimizer's update, whose
///   learning rate and step count change, outside the graph, and resets it when the model is
///   compiled again).
/// A key is captured only the second time it is seen in a row, after an eager run has made
/// every buffer (cuBLAS's workspace, the reductions' scratch) exist. A capture that fails (a call
/// that cannot be captured) turns graphs off for this object; keys that keep changing (more
/// than `max_captures` captures that are each replayed fewer than 4 times) do too. Either way
/// the work runs eagerly: the figures are the same, only slower.
///
/// Only in translation units compiled by nvcc; elsewhere the class is declared, not defined.

#include <cstdint>
#include <exception>
#include <string>

#include "strata/place/place.hpp"

namespace strata::place::detail {

class CudaStepGraph;
class CudaEvent;

#if STRATA_HAS_CUDA
/// An event the host can wait on, recorded in a stream or, as an external event, inside a
/// captured graph (cudaEventRecordExternal), where the host waits for that node of each replay:
/// a step's loss is read as soon as it is copied back, while its backward pass goes on.
class CudaEvent {
public:
    CudaEvent() = default;
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    ~CudaEvent() {
        if (e_) (void)cudaEventDestroy(e_);
    }
    /// Records on this thread's stream; inside a capture, as an external event node of the graph
    /// (cudaEventRecordExternal, which is refused outside a capture).
    void record() {
        if (!e_) cuda_check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate");
        const cudaStream_t s = Cuda::stream();
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cuda_check(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing");
        if (status == cudaStreamCaptureStatusActive)
            cuda_check(cudaEventRecordWithFlags(e_, s, cudaEventRecordExternal), "cudaEventRecordWithFlags (in a capture)");
        else
            cuda_check(cudaEventRecord(e_, s), "cudaEventRecord");
    }
    /// Waits until the work before the last record (or the recorded node of the last replay) is done.
    void wait() const {
        if (e_) cuda_check(cudaEventSynchronize(e_), "cudaEventSynchronize");
    }

private:
    cudaEvent_t e_ = nullptr;
};

class CudaStepGraph {
public:
    /// What a captured graph depends on besides the allocation count: the batch size, the loss
    /// scale (1 / denominator is a kernel argument) and up to six buffers the caller passes.
    struct Key {
        std::int64_t n = -1;
        double denominator = 0;
        const void* buffers[6] = {};
        bool operator==(const Key& o) const {
            for (int i = 0; i < 6; ++i)
                if (buffers[i] != o.buffers[i]) return false;
            return n == o.n && denominator == o.denominator;
        }
    };
    static constexpr int max_captures = 16;

    CudaStepGraph() = default;
    CudaStepGraph(const CudaStepGraph&) = delete;
    CudaStepGraph& operator=(const CudaStepGraph&) = delete;
    ~CudaStepGraph() {
        drop();
        if (before_) (void)cudaEventDestroy(before_);
        if (after_) (void)cudaEventDestroy(after_);
        if (own_) (void)cudaStreamDestroy(own_);
    }

    /// Runs `body` (GPU work queued on this thread's stream, no host synchronisation inside)
    /// for `key`: replayed, captured then launched, or run eagerly (see the file's comment).
    /// Returns how it ran; why_eager() says why the last eager run was not a graph.
    /// A graph cannot be captured on the legacy default stream (a replica on the caller's thread
    /// has no stream of its own): the graph then lives on a private stream of this object,
    /// ordered after the caller's earlier work and before its later work by two events.
    enum class Ran { Eager, Captured, Replayed };
    template <class Body>
    Ran run(const Key& key, Body&& body) {
        const cudaStream_t caller = Cuda::stream();
        const std::uint64_t count = cuda_allocation_count().load(std::memory_order_relaxed);
        if (off_ || !get_cuda_graphs()) {
            if (!off_) why_ = "graphs are off (place::set_cuda_graphs(false))";
            body();
            return Ran::Eager;
        }
        if (exec_ && key == key_ && count == count_) {
            launch(caller);
            ++replays_;
            return Ran::Replayed;
        }
        if (!(seen_ && key == seen_key_ && count == seen_count_)) {
            // First time in a row for this key: eagerly, which also makes every buffer exist.
            why_ = !seen_ || !(key == seen_key_) ? "the first step of its shape (a graph is captured at the second)"
                                                 : "a GPU buffer was allocated or freed since the last step";
            // On the stream the graph will use, so that what a first use there allocates (cuBLAS's
            // workspace) exists before the capture.
            on_graph_stream(caller, body);
            seen_ = true;
            seen_key_ = key;
            seen_count_ = cuda_allocation_count().load(std::memory_order_relaxed);
            return Ran::Eager;
        }
        if (captures_ >= max_captures && replays_ < 4 * captures_) {
            off_ = true;
            why_ = "the step's shapes or buffers keep changing (capturing would cost more than it saves)";
            body();
            return Ran::Eager;
        }
        const cudaStream_t s = graph_stream(caller);
        cudaGraph_t graph = nullptr;
        {
            CurrentStream on(s);
            cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
            try {
                body();
            } catch (const std::exception& e) {
                (void)cudaStreamEndCapture(s, &graph);
                if (graph) (void)cudaGraphDestroy(graph);
                (void)cudaGetLastError();
                off_ = true;
                why_ = std::string("the step could not be captured: ") + e.what();
            }
        }
        if (off_) {
            body();  // eagerly, on the caller's stream; a real error throws again here
            return Ran::Eager;
        }
        const cudaError_t ended = cudaStreamEndCapture(s, &graph);
        const bool moved = cuda_allocation_count().load(std::memory_order_relaxed) != count;
        cudaGraphExec_t exec = nullptr;
        const cudaError_t made = ended == cudaSuccess && graph && !moved ? cudaGraphInstantiate(&exec, graph, 0) : ended;
        if (graph) (void)cudaGraphDestroy(graph);
        if (ended != cudaSuccess || made != cudaSuccess || moved || !exec) {
            if (exec) (void)cudaGraphExecDestroy(exec);
            (void)cudaGetLastError();
            if (moved) {
                why_ = "a GPU buffer was allocated while the step was captured";
            } else {
                off_ = true;
                why_ = std::string("the captured step could not be made a graph: ") +
                       cudaGetErrorString(ended != cudaSuccess ? ended : made);
            }
            seen_ = false;
            body();
            return Ran::Eager;
        }
        drop();
        exec_ = exec;
        key_ = key;
        count_ = count;
        ++captures_;
        launch(caller);
        return Ran::Captured;
    }

    /// Forgets the captured graph and what was seen (what the caller's step does changed: a
    /// model compiled again with another loss or metrics); graphs are allowed again.
    void reset() {
        drop();
        seen_ = false;
        off_ = false;
        captures_ = 0;
        why_.clear();
    }

    /// Whether graphs are off for this object (a failed capture, or keys that keep changing).
    bool off() const { return off_; }
    int captures() const { return captures_; }
    std::int64_t replays() const { return replays_; }
    /// Why the last step that was not a graph ran eagerly ("" before any).
    const std::string& why_eager() const { return why_; }

private:
    // Makes `s` this thread's stream while it lives (the body's ops, cuBLAS included, follow it).
    struct CurrentStream {
        cudaStream_t before;
        explicit CurrentStream(cudaStream_t s) : before(Cuda::stream()) { Cuda::set_stream(s); }
        ~CurrentStream() { Cuda::set_stream(before); }
    };
    // The stream graphs are captured and replayed on: the caller's, or (the legacy default
    // stream cannot be captured) this object's own, with the two events that order it.
    cudaStream_t graph_stream(cudaStream_t caller) {
        if (caller) return caller;
        if (!own_) {
            cuda_check(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (CUDA graphs)");
            cuda_check(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming), "cudaEventCreate");
            cuda_check(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming), "cudaEventCreate");
        }
        return own_;
    }
    // Runs fn() with the graph's stream current, ordered after the caller's earlier work (the
    // batch's copies) and before its later work (the update, the wait for the loss).
    template <class Fn>
    void on_graph_stream(cudaStream_t caller, Fn&& fn) {
        const cudaStream_t s = graph_stream(caller);
        if (s == caller) {
            fn();
            return;
        }
        cuda_check(cudaEventRecord(before_, caller), "cudaEventRecord");
        cuda_check(cudaStreamWaitEvent(s, before_, 0), "cudaStreamWaitEvent");
        {
            CurrentStream on(s);
            fn();
        }
        cuda_check(cudaEventRecord(after_, s), "cudaEventRecord");
        cuda_check(cudaStreamWaitEvent(caller, after_, 0), "cudaStreamWaitEvent");
    }
    void launch(cudaStream_t caller) {
        on_graph_stream(caller, [&] {
            cuda_check(cudaGraphLaunch(exec_, Cuda::stream()), "cudaGraphLaunch (a captured training step)");
        });
    }
    void drop() noexcept {
        if (exec_) (void)cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
    }
    cudaStream_t own_ = nullptr;
    cudaEvent_t before_ = nullptr, after_ = nullptr;
    std::string why_;
    cudaGraphExec_t exec_ = nullptr;
    Key key_{}, seen_key_{};
    std::uint64_t count_ = 0, seen_count_ = 0;
    bool seen_ = false, off_ = false;
    int captures_ = 0;
    std::int64_t replays_ = 0;
};
#endif

}  // namespace strata::place::detail
