#pragma once
/// \file strata/metrics/metric.hpp
/// The metrics `Model::compile` takes by name, as Keras does, and the counts behind the ones
/// beyond accuracy: top-k accuracy for class ids, precision and recall for one binary output
/// (per example, or per token of an output [K, 1]).
///
///     model.compile(loss, optimizer, {"accuracy", strata::metrics::sparse_top_k_categorical_accuracy(3)});
///     model.compile(strata::loss::MeanSquaredError{}, optimizer, {"precision", "recall"});   // one output
///
/// Each is the ratio of counts summed over the epoch (or the evaluated pass), so that replicas'
/// shares add up: Keras's streaming metrics.

#include <cstdint>
#include <string>
#include <utility>

#include "strata/tensor/tensor_all.hpp"

namespace strata::metrics {

/// A metric by its Keras name: "accuracy" (also "acc", "sparse_categorical_accuracy",
/// "categorical_accuracy"), "sparse_top_k_categorical_accuracy" (k = 5, Keras's default),
/// "precision", "recall". `k` is read by the top-k metric only.
struct Metric {
    std::string name;
    int k = 5;
    Metric(const char* n) : name(n) {}          // NOLINT: implicit, so that {"accuracy"} reads as in Keras
    Metric(std::string n) : name(std::move(n)) {}  // NOLINT
};

/// Keras's SparseTopKCategoricalAccuracy(k): the share of examples whose class id is among the
/// k highest outputs.
inline Metric sparse_top_k_categorical_accuracy(int k = 5) {
    Metric m("sparse_top_k_categorical_accuracy");
    m.k = k;
    return m;
}

/// What the metrics beyond accuracy count, summed over examples.
struct Counts {
    std::int64_t in_top_k = 0;         ///< rows whose class is in the top k
    std::int64_t top_k_rows = 0;       ///< rows counted for the top k: examples, or tokens of per-token ids
    std::int64_t true_positives = 0;   ///< prediction > 0.5 and target > 0.5 (binary)
    std::int64_t false_positives = 0;  ///< prediction > 0.5, target <= 0.5
    std::int64_t false_negatives = 0;  ///< prediction <= 0.5, target > 0.5
    Counts& operator+=(const Counts& o) {
        in_top_k += o.in_top_k;
        top_k_rows += o.top_k_rows;
        true_positives += o.true_positives;
        false_positives += o.false_positives;
        false_negatives += o.false_negatives;
        return *this;
    }
};

/// Keras's Precision()/Recall() with their default threshold 0.5; 0 when the denominator is 0
/// (Keras divides with divide_no_nan).
inline double precision(const Counts& c) {
    const auto d = c.true_positives + c.false_positives;
    return d ? double(c.true_positives) / double(d) : 0.0;
}
inline double recall(const Counts& c) {
    const auto d = c.true_positives + c.false_negatives;
    return d ? double(c.true_positives) / double(d) : 0.0;
}

namespace detail {
struct CountsScratchTag {};
template <class T>
struct RowTopK {
    const T* pred;
    const T* target;
    T* flags;
    std::int64_t cols;
    std::int64_t k;
    const T* mask = nullptr;  ///< per row (token): 0 leaves it out (the token mask), or null
    // tf.math.in_top_k (what Keras's sparse_top_k_categorical_accuracy calls on TensorFlow):
    // classes tied with the target's output at the boundary count as in the top k, i.e. the
    // target is in when fewer than k classes score strictly higher.
    STRATA_HD void operator()(std::int64_t r) const {
        if (mask && mask[r] == T(0)) {  // padding: not a row of the metric (its target is not read)
            flags[r] = T(0);
            return;
        }
        const T* p = pred + r * cols;
        const T mine = p[std::int64_t(target[r])];
        std::int64_t higher = 0;
        for (std::int64_t c = 0; c < cols; ++c) higher += p[c] > mine ? 1 : 0;
        flags[r] = T(higher < k ? 1 : 0);
    }
};
template <class T>
struct RowBinary {
    const T* pred;
    const T* target;
    T* flags;  // 3 per row: tp, fp, fn
    const T* mask = nullptr;  ///< per row (token): 0 leaves it out (the token mask), or null
    STRATA_HD void operator()(std::int64_t r) const {
        if (mask && mask[r] == T(0)) {  // padding: counts nothing (its target is not read)
            flags[3 * r] = flags[3 * r + 1] = flags[3 * r + 2] = T(0);
            return;
        }
        const bool p = pred[r] > T(0.5), t = target[r] > T(0.5);
        flags[3 * r] = T(p && t ? 1 : 0);
        flags[3 * r + 1] = T(p && !t ? 1 : 0);
        flags[3 * r + 2] = T(!p && t ? 1 : 0);
    }
};
template <class T, class P>
std::int64_t sum_flags(T* flags, std::int64_t n, std::int64_t stride, std::int64_t offset) {
    std::int64_t s = 0;
    if constexpr (place::host_accessible_v<P>) {
        for (std::int64_t i = 0; i < n; ++i) s += flags[i * stride + offset] > T(0.5);
    } else {
        std::vector<T> h(std::size_t(n * stride));
        copy(TensorView<T, P>(flags, Shape{n * stride}), TensorView<T, place::Host>(h.data(), Shape{n * stride}));
        for (std::int64_t i = 0; i < n; ++i) s += h[std::size_t(i * stride + offset)] > T(0.5);
    }
    return s;
}
}  // namespace detail

/// Sizes the per-thread scratch of count_in_top_k and count_binary on P for batches of up to
/// `examples` of `tokens` rows (or binary values) each, on the calling thread (Model::build).
template <class T, class P>
void reserve_counts_scratch(std::int64_t examples, std::int64_t tokens) {
    const std::int64_t rows = examples * (tokens > 1 ? tokens : 1);
    if (examples > 0) strata::detail::scratch<T, P, detail::CountsScratchTag>(3 * rows);
}

/// Rows of `pred` whose class id is among the k highest outputs: `pred` [n, classes] against
/// `target` [n], or, with `tokens` > 1, `pred` [n, tokens, classes] against per-token ids
/// [n, tokens] (every token a row: Keras' sparse_top_k_categorical_accuracy on a [n, K] match).
/// `mask` (one per row, on P; the token mask of an Embedding with mask_zero): the rows weighed 0
/// are left out, so the count is of the tokens that count (the caller divides by those).
template <class T, class P>
std::int64_t count_in_top_k(const TensorView<T, P>& pred, const TensorView<T, P>& target, int k, std::int64_t tokens = 1,
                            const T* mask = nullptr) {
    const std::int64_t rows = pred.dim(0) * tokens;
    if (rows == 0) return 0;
    STRATA_CHECK(target.size() == rows, ShapeError, "sparse_top_k_categorical_accuracy: ", rows, " rows of predictions (shape ",
                 pred.shape(), ", ", tokens, " token(s) an example) need as many class ids, got ", target.size());
    T* flags = strata::detail::scratch<T, P, detail::CountsScratchTag>(rows);
    place::for_each_n<P>(rows, detail::RowTopK<T>{pred.data(), target.data(), flags, pred.size() / rows, k, mask});
    return detail::sum_flags<T, P>(flags, rows, 1, 0);
}

/// True positives, false positives and false negatives of one binary output per example
/// (`pred` and `target` [n] or [n, 1]), or per token (`pred` and `target` [n, K, 1]: each of
/// the n·K values its own decision, as Keras' Precision and Recall count every value), at the
/// threshold 0.5. `mask` (one per value, on P; the token mask of an Embedding with mask_zero):
/// the values weighed 0 are left out.
template <class T, class P>
Counts count_binary(const TensorView<T, P>& pred, const TensorView<T, P>& target, const T* mask = nullptr) {
    const std::int64_t n = pred.size();
    Counts c;
    if (n == 0) return c;
    STRATA_CHECK(target.size() == n, ShapeError, "precision/recall: predictions of shape ", pred.shape(),
                 " need as many targets, got ", target.shape());
    T* flags = strata::detail::scratch<T, P, detail::CountsScratchTag>(3 * n);
    place::for_each_n<P>(n,
                       detail::RowBinary<T>{pred.data(), target.data(), flags, mask});
    c.true_positives = detail::sum_flags<T, P>(flags, n, 3, 0);
    c.false_positives = detail::sum_flags<T, P>(flags, n, 3, 1);
    c.false_negatives = detail::sum_flags<T, P>(flags, n, 3, 2);
    return c;
}

#if STRATA_INSTANCES
// The host's metric counts, compiled once in the compiled part.
STRATA_TEMPLATE std::int64_t count_in_top_k<float, place::Host>(const TensorView<float, place::Host>&,
                                                                const TensorView<float, place::Host>&, int,
                                                                std::int64_t, const float*);
STRATA_TEMPLATE std::int64_t count_in_top_k<double, place::Host>(const TensorView<double, place::Host>&,
                                                                 const TensorView<double, place::Host>&, int, std::int64_t,
                                                                 const double*);
STRATA_TEMPLATE Counts count_binary<float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&,
                                                       const float*);
STRATA_TEMPLATE Counts count_binary<double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&,
                                                        const double*);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE std::int64_t count_in_top_k<float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, int,
                                                                     std::int64_t, const float*);
STRATA_CUDA_TEMPLATE std::int64_t count_in_top_k<double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, int,
                                                                      std::int64_t, const double*);
STRATA_CUDA_TEMPLATE Counts count_binary<float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&,
                                                            const float*);
STRATA_CUDA_TEMPLATE Counts count_binary<double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&,
                                                             const double*);
#endif

}  // namespace strata::metrics
