#pragma once
/// \file strata/train/place_step.hpp
/// What a Model's compute unit does that depends on its place, and nothing else: how its share
/// of a batch reaches the place (`UnitStaging`), and whether and how a whole training step runs
/// as one captured graph with its loss read back without a wait (`StepCapture`). train/model.hpp
/// holds one of each per unit and calls them the same way on every place; it has no branch on
/// the place.
///
/// | place                       | UnitStaging                                | StepCapture          |
/// |-----------------------------|--------------------------------------------|----------------------|
/// | host-accessible (Host)      | the batch read where it lies (float), or   | none (`possible` is  |
/// |                             | converted once (double)                    | false)               |
/// | a device (Cuda)             | through pinned memory, queued on the unit's| a CUDA graph, the    |
/// |                             | stream; the host does not wait             | loss and correct     |
/// |                             |                                            | count summed on the  |
/// |                             |                                            | device (nvcc only)   |

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "strata/place/cuda_graph.hpp"
#include "strata/place/place.hpp"
#include "strata/tensor/tensor.hpp"
#if STRATA_HAS_CUDA
#include "strata/metrics/accuracy.hpp"
#include "strata/tensor/reduce.hpp"
#endif

namespace strata::train::detail {

/// A unit's staging buffers for its share of a batch: the input, the targets and the examples'
/// weights, as the unit's place reads them. Once reserve() has sized them for a share, staging
/// a share no larger allocates nothing.
template <class T, class P, bool HostAccessible = place::host_accessible_v<P>>
class UnitStaging;

/// Host-accessible places: a float model reads the dataset's floats in place; a double model
/// converts them once into its own buffer.
template <class T, class P>
class UnitStaging<T, P, true> {
public:
    void reserve(const Shape& input, std::int64_t target_values, std::int64_t examples) {
        target_.resize(Shape{target_values});
        weights_.resize(Shape{examples});
        if constexpr (!std::is_same_v<T, float>) x_.resize(input);
    }
    TensorView<T, P> input(const float* src, const Shape& shape) {
        if constexpr (std::is_same_v<T, float>) {
            return TensorView<T, P>(const_cast<float*>(src), shape);
        } else {
            x_.resize(shape);
            for (std::int64_t i = 0; i < shape.size(); ++i) x_.data()[i] = T(src[i]);
            return x_.view();
        }
    }
    template <class Y>
    TensorView<T, P> target(const Y* src, const Shape& shape) {
        target_.resize(shape);
        for (std::int64_t i = 0; i < shape.size(); ++i) target_.data()[i] = T(src[i]);
        return target_.view();
    }
    /// The targets the last target() staged, on the host (what class weights are read from).
    const T* target_on_host() const { return target_.data(); }
    /// Host memory for `count` weights, which weights() then hands to the place.
    T* weights_on_host(std::int64_t count) {
        weights_.resize(Shape{count});
        return weights_.data();
    }
    const T* weights(std::int64_t) const { return weights_.data(); }

private:
    Tensor<T, P> x_;  // double models only: the converted input
    Tensor<T, P> target_, weights_;
};

/// Device places: everything goes through pinned host memory (place::detail::StagingBuffer),
/// its copy queued on the unit's stream, so that the host does not wait for the device.
template <class T, class P>
class UnitStaging<T, P, false> {
public:
    void reserve(const Shape& input, std::int64_t target_values, std::int64_t examples) {
        x_.resize(input);
        target_host_.resize(Shape{target_values});
        target_.resize(Shape{target_values});
        weights_host_.resize(Shape{examples});
        weights_.resize(Shape{examples});
    }
    TensorView<T, P> input(const float* src, const Shape& shape) {
        T* h = x_stage_.acquire(std::size_t(shape.size()));
        if constexpr (std::is_same_v<T, float>) std::copy_n(src, shape.size(), h);
        else for (std::int64_t i = 0; i < shape.size(); ++i) h[i] = T(src[i]);
        x_.resize(shape);
        x_stage_.send(x_.data(), std::size_t(shape.size()));
        return x_.view();
    }
    template <class Y>
    TensorView<T, P> target(const Y* src, const Shape& shape) {
        target_host_.resize(shape);
        for (std::int64_t i = 0; i < shape.size(); ++i) target_host_.data()[i] = T(src[i]);
        T* h = target_stage_.acquire(std::size_t(shape.size()));
        std::copy_n(target_host_.data(), shape.size(), h);
        target_.resize(shape);
        target_stage_.send(target_.data(), std::size_t(shape.size()));
        return target_.view();
    }
    const T* target_on_host() const { return target_host_.data(); }
    T* weights_on_host(std::int64_t count) {
        weights_host_.resize(Shape{count});
        return weights_host_.data();
    }
    const T* weights(std::int64_t count) {
        weights_.resize(Shape{count});
        copy(weights_host_.view(), weights_.view());
        return weights_.data();
    }

private:
    Tensor<T, P> x_, target_, weights_;
    Tensor<T, place::Host> target_host_, weights_host_;
    place::detail::StagingBuffer<T> x_stage_, target_stage_;
};

/// What a captured step depends on besides the place's own conditions: the batch size, the loss
/// scale (1 / denominator is a kernel argument), and the buffers its kernels read and write.
struct CaptureKey {
    std::int64_t n = 0;
    double denominator = 1;
    const void* params = nullptr;
    void* grads = nullptr;
    const void* x = nullptr;
    const void* target = nullptr;
};

/// A step's loss sum and correct count, as the captured step returns them.
struct CapturedFigures {
    double loss_sum = 0;
    double correct = 0;
};

/// Whether and how a unit's whole training step (forward, loss, metrics, backward) runs as one
/// captured graph. Places without graphs: `possible` is false and Model never calls run().
template <class T, class P>
class StepCapture {
public:
    static constexpr bool possible = false;
    std::int64_t replays() const { return 0; }
    std::string why_eager() const { return {}; }
    void reset() {}
};

#if STRATA_HAS_CUDA
/// A GPU: the step runs with no wait in the middle. `forward(sink)` queues the forward pass and
/// hands the loss's per-example rows and the outputs to the sink, which sums them into device
/// memory; those two doubles are copied to pinned memory and an event marks it; then
/// `backward()` is queued. The host waits for that event only, so it has the step's loss while
/// backward runs, and the update that follows queues behind it. Captured as a CUDA graph and
/// replayed where place::detail::CudaStepGraph allows (the key names every buffer the kernels
/// use that the allocation count does not cover); the same kernels either way, so the same
/// figures.
template <class T>
class StepCapture<T, place::Cuda> {
public:
    static constexpr bool possible = true;

    /// What forward() reports to: the loss's rows, and (when counted) the outputs' correct count.
    class Sink {
    public:
        void loss_rows(const T* rows, std::int64_t n) { strata::detail::cuda_reduce::sum_to_device(rows, n, dev_); }
        void correct(const TensorView<T, place::Cuda>& out, const TensorView<T, place::Cuda>& target, metrics::AccuracyKind kind) {
            metrics::count_correct_to_device(out, target, kind, dev_ + 1);
        }

    private:
        friend class StepCapture;
        explicit Sink(double* dev) : dev_(dev) {}
        double* dev_;
    };

    /// The step; its figures: the loss sum, and the correct count where forward() counted it
    /// (otherwise that double is whatever the device held: the caller knows whether it asked).

    template <class Forward, class Backward>
    CapturedFigures run(const CaptureKey& k, Forward&& forward, Backward&& backward) {
        if (results_.size() != 2) results_.resize(Shape{2});
        double* host = results_stage_.acquire(2);
        double* dev = results_.data();
        auto body = [&] {
            Sink sink(dev);
            forward(sink);
            place::cuda_check(cudaMemcpyAsync(host, dev, 2 * sizeof(double), cudaMemcpyDeviceToHost, place::Cuda::stream()),
                              "cudaMemcpyAsync (a step's loss and correct count)");
            ready_.record();
            backward();
        };
        place::detail::CudaStepGraph::Key key;
        key.n = k.n;
        key.denominator = k.denominator;
        const void* buffers[6] = {k.params, k.grads, k.x, k.target, dev, host};
        for (int i = 0; i < 6; ++i) key.buffers[i] = buffers[i];
        graph_.run(key, body);
        ready_.wait();
        return {host[0], host[1]};
    }
    std::int64_t replays() const { return graph_.replays(); }
    std::string why_eager() const { return graph_.why_eager(); }
    void reset() { graph_.reset(); }

private:
    place::detail::CudaStepGraph graph_;
    Tensor<double, place::Cuda> results_;  // [loss sum, correct count] on the device
    place::detail::StagingBuffer<double> results_stage_;
    place::detail::CudaEvent ready_;  // recorded once they are copied back
};
#endif

}  // namespace strata::train::detail
