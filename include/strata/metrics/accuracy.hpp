#pragma once
/// \file strata/metrics/accuracy.hpp
/// Accuracy metrics, computed per example on the place and summed in a fixed order:
/// sparse categorical (argmax == class id), categorical (argmax == argmax of the target) and
/// binary (one output, threshold 0.5), chosen like Keras's "accuracy" from the loss and the
/// output's last axis (binary when it holds one value).
///
/// Sequences: sparse targets of K class ids per example (outputs [n, K, classes], targets
/// [n, K]: a per-token softmax against per-token ids), and dense targets of an output [n, K,
/// classes] (categorical) or [n, K, 1] (binary), count each example as the share of its K
/// tokens predicted right, so the accuracy (the count over the examples) is the mean over every
/// token, as Keras' accuracies average a [n, K] match. With token weights (the
/// token mask of an Embedding with mask_zero), each example counts the weights of its tokens
/// right, not a share: padding counts nothing, and the count over the examples is the number of
/// tokens that count predicted right (the caller divides by the tokens that count).

#include <cstdint>

#include "strata/tensor/tensor_all.hpp"

namespace strata::metrics {

enum class AccuracyKind { SparseCategorical, Categorical, Binary };

namespace detail {
struct MetricScratchTag {};
template <class T>
struct RowCorrect {
    const T* pred;
    const T* target;
    T* flags;
    std::int64_t cols;
    AccuracyKind kind;
    std::int64_t tokens = 1;  ///< rows of the last axis per example (sparse: class ids per example)
    const T* token_weight = nullptr;  ///< each token's weight (a token right counts it), or null: 1
    // Token k of example r: right or not. Sparse: the argmax of its classes is its id;
    // categorical: the argmax of its target row; binary: its one output and target on the same
    // side of 0.5.
    STRATA_HD bool right(std::int64_t r, std::int64_t k) const {
        const std::int64_t classes = cols / tokens;
        const T* p = pred + r * cols + k * classes;
        if (kind == AccuracyKind::Binary) return (p[0] > T(0.5)) == (target[r * cols + k * classes] > T(0.5));
        std::int64_t best = 0;
        for (std::int64_t c = 1; c < classes; ++c)
            if (p[c] > p[best]) best = c;
        if (kind == AccuracyKind::SparseCategorical) return best == std::int64_t(target[r * tokens + k]);
        const T* t = target + r * cols + k * classes;
        std::int64_t want = 0;
        for (std::int64_t c = 1; c < classes; ++c)
            if (t[c] > t[want]) want = c;
        return best == want;
    }
    // Example r of one token (several: TokenCorrect, below): 1 or its weight when right, 0 when
    // wrong or weighed 0 (padding: its target is not read).
    STRATA_HD void operator()(std::int64_t r) const {
        const T w = token_weight ? token_weight[r] : T(1);
        flags[r] = w != T(0) && right(r, 0) ? w : T(0);
    }
};
// The GPU's shape of a per-token count ([n, K, classes] outputs, as the losses' TokenLosses): one
// index per token, each writing its weight when right (or 1; 0 when wrong or weighed 0, its
// target then unread), then each example's sum in token order (ExampleOfTokens): RowCorrect's
// arithmetic, so the same figures.
template <class T>
struct TokenCorrect {
    RowCorrect<T> row;
    T* token_flags;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t r = i / row.tokens, k = i % row.tokens;
        const T w = row.token_weight ? row.token_weight[i] : T(1);
        token_flags[i] = w != T(0) && row.right(r, k) ? w : T(0);
    }
};
template <class T>
struct ExampleOfTokens {
    const T* token_flags;
    T* flags;
    std::int64_t tokens;
    bool weighted;
    STRATA_HD void operator()(std::int64_t r) const {
        double sum = 0;
        for (std::int64_t k = 0; k < tokens; ++k) sum += double(token_flags[r * tokens + k]);
        flags[r] = T(weighted ? sum : sum / double(tokens));
    }
};
// The examples' flags (n) of RowCorrect, on P: per token when an example has several, into the scratch reserve_accuracy_scratch sizes.
template <class T, class P>
T* correct_flags(const TensorView<T, P>& pred, const TensorView<T, P>& target, AccuracyKind kind, std::int64_t tokens,
                 const T* token_weights) {
    const std::int64_t n = pred.dim(0);
    const RowCorrect<T> row{pred.data(), target.data(), nullptr, pred.size() / n, kind, tokens, token_weights};
    if (tokens == 1) {
        T* flags = strata::detail::scratch<T, P, MetricScratchTag>(n);
        place::for_each_n<P>(n, RowCorrect<T>{row.pred, row.target, flags, row.cols, kind, 1, token_weights});
        return flags;
    }
    T* flags = strata::detail::scratch<T, P, MetricScratchTag>(n * (1 + tokens));
    place::for_each_n<P>(n * tokens, TokenCorrect<T>{row, flags + n});
    place::for_each_n<P>(n, ExampleOfTokens<T>{flags + n, flags, tokens, token_weights != nullptr});
    return flags;
}
// The tokens RowCorrect counts per example of `pred` against `target`: the class ids per example
// (sparse), or the rows of the output's last axis (rank >= 3: [n, K, classes] gives K).
template <class V>
std::int64_t accuracy_tokens(const V& pred, const V& target, AccuracyKind kind) {
    const std::int64_t n = pred.dim(0);
    if (n == 0) return 1;
    return kind == AccuracyKind::SparseCategorical ? target.size() / n : last_axis_rows(pred);
}
}  // namespace detail

/// Sizes count_correct's per-thread scratch on P for batches of up to `examples` on the calling
/// thread (Model::build, on each replica's thread: the first step then allocates nothing).
/// `tokens`: the rows of the output's last axis an example holds (counted per token).
template <class T, class P>
void reserve_accuracy_scratch(std::int64_t examples, std::int64_t tokens = 1) {
    if (examples > 0) strata::detail::scratch<T, P, detail::MetricScratchTag>(examples * (tokens > 1 ? 1 + tokens : 1));
}


/// Number of examples of `pred` ([n, classes]) whose prediction is right (a whole number); with
/// K > 1 tokens per example (`pred` [n, K, classes] against sparse targets [n, K], or dense ones
/// of pred's shape: each of the K rows of the last axis its own prediction, as Keras' metrics
/// work along axis -1), the sum over the examples of the share of their tokens that are right.
/// For Binary with logits, pass `logits_threshold` semantics by giving probabilities (the Model
/// does). `token_weights` (one per token, on P): the sum of the weights of the tokens right
/// (with a 0/1 mask, the tokens that count predicted right); see the file comment.
template <class T, class P>
double count_correct(const TensorView<T, P>& pred, const TensorView<T, P>& target, AccuracyKind kind,
                     const T* token_weights = nullptr) {
    const std::int64_t n = pred.dim(0);
    if (n == 0) return 0;
    const std::int64_t tokens = detail::accuracy_tokens(pred, target, kind);
    T* flags = detail::correct_flags(pred, target, kind, tokens, token_weights);
    if (token_weights) {  // summed weights (a whole count for a 0/1 mask), in example order
        if constexpr (place::host_accessible_v<P>) {
            double s = 0;
            for (std::int64_t i = 0; i < n; ++i) s += double(flags[i]);
            return s;
        } else {
            return double(sum(TensorView<T, P>(flags, Shape{n})));
        }
    }
    if constexpr (place::host_accessible_v<P>) {
        if (tokens > 1) {
            double s = 0;  // shares of tokens: summed in example order
            for (std::int64_t i = 0; i < n; ++i) s += double(flags[i]);
            return s;
        }
        std::int64_t s = 0;
        for (std::int64_t i = 0; i < n; ++i) s += flags[i] > T(0.5);
        return double(s);
    } else {
        const double s = double(sum(TensorView<T, P>(flags, Shape{n})));
        return tokens > 1 ? s : double(std::int64_t(s + 0.5));
    }
}

#if STRATA_HAS_CUDA
/// count_correct on a GPU without the host waiting: the count (exact in a double) into one
/// double of device memory `out`, queued on this thread's stream (train/model.hpp reads a
/// step's loss and count back together at its end).
template <class T>
void count_correct_to_device(const TensorView<T, place::Cuda>& pred, const TensorView<T, place::Cuda>& target,
                             AccuracyKind kind, double* out) {
    const std::int64_t n = pred.dim(0);
    T* flags = n > 0 ? detail::correct_flags(pred, target, kind, detail::accuracy_tokens(pred, target, kind), static_cast<const T*>(nullptr))
                     : nullptr;
    strata::detail::cuda_reduce::sum_to_device(flags, n, out);
}
#endif

#if STRATA_INSTANCES
// The host's accuracy counts, compiled once in the compiled part.
STRATA_TEMPLATE double count_correct<float, place::Host>(const TensorView<float, place::Host>&,
                                                               const TensorView<float, place::Host>&, AccuracyKind, const float*);
STRATA_TEMPLATE double count_correct<double, place::Host>(const TensorView<double, place::Host>&,
                                                                const TensorView<double, place::Host>&, AccuracyKind, const double*);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE double count_correct<float, place::Cuda>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, AccuracyKind,
                                                              const float*);
STRATA_CUDA_TEMPLATE double count_correct<double, place::Cuda>(const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, AccuracyKind,
                                                               const double*);
STRATA_CUDA_TEMPLATE void count_correct_to_device<float>(const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&,
                                                        AccuracyKind, double*);
STRATA_CUDA_TEMPLATE void count_correct_to_device<double>(const TensorView<double, place::Cuda>&,
                                                         const TensorView<double, place::Cuda>&, AccuracyKind, double*);
#endif

}  // namespace strata::metrics
