#pragma once
/// \file strata/loss/losses.hpp
/// Losses: MeanSquaredError, SparseCategoricalCrossentropy, CategoricalCrossentropy, with
/// Keras's definitions. Each one computes, for a batch of predictions and targets, the sum of
/// the per-example losses and the gradient of (sum / denominator) w.r.t. the predictions.
///
/// The denominator is the number of examples in the *global* batch, not the replica's slice:
/// that is what makes N replicas' summed gradients equal one device's gradient on the whole
/// batch (also when the global batch does not divide evenly).
///
/// With a Softmax last layer, the cross-entropies are fused with it: the loss receives the
/// logits, computes log-softmax stably (the row maximum is subtracted) and the gradient
/// softmax(z) − target directly.
///
/// `Custom` is a loss of your own: a name and two per-example functions (docs/extending.md).

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "strata/tensor/tensor_all.hpp"

namespace strata::loss {

/// Mean squared error: mean over the last axis of (y_pred − y_true)², averaged over examples.
struct MeanSquaredError {
    static constexpr const char* name = "mean_squared_error";
};

/// Cross-entropy against integer class ids (labels hold the class id as a number).
/// `from_logits`: the model outputs logits, not probabilities (Keras's flag). With a Softmax
/// last layer, the fused path is used whatever this flag says.
struct SparseCategoricalCrossentropy {
    static constexpr const char* name = "sparse_categorical_crossentropy";
    bool from_logits = false;
};

/// Cross-entropy against target distributions (one-hot or soft labels), one row per example.
struct CategoricalCrossentropy {
    static constexpr const char* name = "categorical_crossentropy";
    bool from_logits = false;
};

/// A user-defined loss: a name and two functions of one example, which the library applies row
/// by row and averages over the global batch like the built-in losses.
///
/// Requires: `loss(y_pred, y_true)` returns the example's loss; `gradient(y_pred, y_true, grad)`
/// writes d loss / d y_pred into `grad`. The three spans have the model's output size per
/// example (targets have the output's shape, as for MeanSquaredError), in float64 whatever the
/// model's element type. Under a distribution strategy the replicas call them concurrently,
/// so they must not modify shared state.
/// Ensures: the loss sees the model's output as it is (after a Softmax last layer, the
/// probabilities: no fused path), and accuracy is computed as for the built-in dense targets.
/// Host places only: on a CUDA place, `loss_and_grad` throws a DeviceError (the functions
/// are host code).
///
///     strata::loss::Custom huber{
///         .name = "huber",
///         .loss = [](auto p, auto t) { double d = p[0] - t[0]; return std::abs(d) <= 1 ? 0.5 * d * d : std::abs(d) - 0.5; },
///         .gradient = [](auto p, auto t, auto g) { g[0] = std::clamp(p[0] - t[0], -1.0, 1.0); }};
///     model.compile(huber, strata::optim::Adam{});
struct Custom {
    /// The name errors print (Keras's `loss.name`), e.g. "huber".
    std::string name;
    /// The loss of one example.
    std::function<double(std::span<const double> y_pred, std::span<const double> y_true)> loss;
    /// d loss / d y_pred of one example, written into `grad` (it arrives zeroed).
    std::function<void(std::span<const double> y_pred, std::span<const double> y_true, std::span<double> grad)> gradient;
};

/// Any of the losses; `Model::compile` takes one.
using Loss = std::variant<SparseCategoricalCrossentropy, CategoricalCrossentropy, MeanSquaredError, Custom>;

/// How the loss sees the model's output.
enum class Input {
    Probabilities,  ///< y_pred is a probability distribution (or any value for MSE)
    Logits,         ///< y_pred holds logits (fused softmax, or from_logits)
};

namespace detail {
// Keras clips probabilities to [eps, 1 - eps] before the logarithm.
inline constexpr double prob_epsilon = 1e-7;

// The row's maximum and log(sum(exp(z - max))): log-softmax is z - (max + log_sum), stable for
// any logits. Shared by the cross-entropies' fused paths.
template <class T>
struct RowLse {
    T max, sum_exp;
    STRATA_HD T log_sum_exp() const { using std::log; return max + log(sum_exp); }
    STRATA_HD T softmax(T z) const { using std::exp; return exp(z - max) / sum_exp; }
};
template <class T>
STRATA_HD RowLse<T> row_lse(const T* z, std::int64_t n) {
    using std::exp;
    T m = z[0];
    for (std::int64_t c = 1; c < n; ++c) m = z[c] > m ? z[c] : m;
    T s = 0;
    for (std::int64_t c = 0; c < n; ++c) s += exp(z[c] - m);
    return {m, s};
}

// Token t of a cross-entropy row functor (SparseCeRow, CategoricalCeRow): its loss
// `row.one(t, scale)` times its weight. A token weighed 0 adds nothing and gets no gradient (its
// loss is not even computed, so a padded token's target cannot make a NaN).
template <class Row, class T>
STRATA_HD T weighed_token(const Row& row, std::int64_t t, T scale) {
    if (!row.token_weight) return row.one(t, scale);
    const T w = row.token_weight[t];
    if (w == T(0)) {
        for (std::int64_t c = 0; c < row.classes; ++c) row.grad[t * row.classes + c] = T(0);
        return T(0);
    }
    return w * row.one(t, scale * w);
}
// Example r of a functor whose examples are one token each (several: TokenLosses, below).
template <class Row>
STRATA_HD void token_rows(const Row& row, std::int64_t r) {
    row.row_loss[r] = weighed_token(row, r, row.inv_denom);
}

// One example's row (or, with `tokens` > 1, its `tokens` rows of `classes`: a per-token softmax
// against per-token ids, whose loss is the mean over the tokens, as Keras averages a [n, K]
// loss over every token).
template <class T>
struct SparseCeRow {
    const T* pred;
    const T* target;
    T* grad;
    T* row_loss;
    std::int64_t classes;
    T inv_denom;
    bool logits;
    std::int64_t tokens = 1;
    const T* token_weight = nullptr;  ///< per token (per row of classes): its weight; 0 leaves it out (the token mask)
    STRATA_HD T one(std::int64_t row, T scale) const {
        using std::exp;
        using std::log;
        const T* z = pred + row * classes;
        T* g = grad + row * classes;
        const auto label = std::int64_t(target[row]);
        if (logits) {
            const auto lse = row_lse(z, classes);
            for (std::int64_t c = 0; c < classes; ++c) g[c] = (lse.softmax(z[c]) - (c == label ? T(1) : T(0))) * scale;
            return lse.log_sum_exp() - z[label];
        } else {
            const T eps = T(prob_epsilon);
            for (std::int64_t c = 0; c < classes; ++c) g[c] = 0;
            T p = z[label];
            const bool clipped = p < eps || p > T(1) - eps;
            p = p < eps ? eps : (p > T(1) - eps ? T(1) - eps : p);
            g[label] = clipped ? T(0) : -scale / p;
            return -log(p);
        }
    }
    STRATA_HD void operator()(std::int64_t r) const { token_rows(*this, r); }
};

// One example's row of `classes` values, or with `tokens` > 1 its `tokens` rows of `classes`
// (the output's last axis): each its own distribution against its own target row, the
// example's loss the mean over its tokens (Keras' categorical_crossentropy is over axis -1, and
// a [n, K] loss is averaged over every token). `token_weight` as SparseCeRow's.
template <class T>
struct CategoricalCeRow {
    const T* pred;
    const T* target;
    T* grad;
    T* row_loss;
    std::int64_t classes;
    T inv_denom;
    bool logits;
    std::int64_t tokens = 1;
    const T* token_weight = nullptr;
    STRATA_HD T one(std::int64_t row, T scale) const {
        using std::exp;
        using std::log;
        const T* z = pred + row * classes;
        const T* t = target + row * classes;
        T* g = grad + row * classes;
        if (logits) {
            const auto lse = row_lse(z, classes);
            T tsum = 0;
            for (std::int64_t c = 0; c < classes; ++c) tsum += t[c];
            T loss = 0;
            for (std::int64_t c = 0; c < classes; ++c) {
                loss += t[c] * (lse.log_sum_exp() - z[c]);
                g[c] = (lse.softmax(z[c]) * tsum - t[c]) * scale;
            }
            return loss;
        }
        // Keras normalises the predictions to sum to 1, then clips.
        const T eps = T(prob_epsilon);
        T psum = 0;
        for (std::int64_t c = 0; c < classes; ++c) psum += z[c];
        T loss = 0, dot = 0;
        for (std::int64_t c = 0; c < classes; ++c) {
            const T q = z[c] / psum;
            const T qc = q < eps ? eps : (q > T(1) - eps ? T(1) - eps : q);
            loss -= t[c] * log(qc);
            // d/dz_c of -sum_j t_j log(z_j / psum) = -t_c / z_c + tsum / psum (unclipped)
            g[c] = (q == qc) ? -t[c] / z[c] : T(0);
            dot += t[c];
        }
        for (std::int64_t c = 0; c < classes; ++c) g[c] = (g[c] + dot / psum) * scale;
        return loss;
    }
    STRATA_HD void operator()(std::int64_t r) const { token_rows(*this, r); }
};

// The mean of (pred - target)² over an example's values; with `tokens` > 1 and `token_weight`,
// the mean over its tokens (rows of cols / tokens values, the output's last axis) of each
// token's mean times its weight (Keras' mean over axis -1, then the masked mean over tokens).
// Without weights the two are the same number.
template <class T>
struct MseRow {
    const T* pred;
    const T* target;
    T* grad;
    T* row_loss;
    std::int64_t cols;
    T inv_denom;
    std::int64_t tokens = 1;
    const T* token_weight = nullptr;
    STRATA_HD void operator()(std::int64_t r) const {
        const T* p = pred + r * cols;
        const T* t = target + r * cols;
        T* g = grad + r * cols;
        if (!token_weight) {
            T s = 0;
            const T k = T(2) / T(cols) * inv_denom;
            for (std::int64_t c = 0; c < cols; ++c) {
                const T d = p[c] - t[c];
                s += d * d;
                g[c] = k * d;
            }
            row_loss[r] = s / T(cols);
            return;
        }
        row_loss[r] = token(r);  // one token an example (several: MseTokens, below)
    }
    // Token `i` (of the n·tokens): its gradient, and its mean times its weight (0 when weighed 0).
    STRATA_HD T token(std::int64_t i) const {
        const std::int64_t width = cols / tokens;
        const T w = token_weight[i];
        const T* p = pred + i * width;
        const T* t = target + i * width;
        T* g = grad + i * width;
        if (w == T(0)) {
            for (std::int64_t c = 0; c < width; ++c) g[c] = T(0);
            return T(0);
        }
        const T scale = T(2) / T(width * tokens) * inv_denom * w;
        T s = 0;
        for (std::int64_t c = 0; c < width; ++c) {
            const T d = p[c] - t[c];
            s += d * d;
            g[c] = scale * d;
        }
        return w * s / T(width);
    }
};

// The GPU's shape of a per-token loss ([n, K, classes] outputs): one index per token rather than
// per example, so that a batch of n examples is n·K parallel rows, not n serial loops over K
// (at n = 128 a GPU would run 128 threads). Each token's (weighed) loss goes to `token_loss`, then
// MeanOfTokens sums an example's K of them in token order, the same arithmetic as token_rows, so
// both shapes give the same bits. The host uses it too: n·K rows balance its cores as well.
template <class Row>
struct TokenLosses {
    Row row;
    decltype(row.inv_denom) scale;  // inv_denom / tokens
    decltype(row.grad) token_loss;
    STRATA_HD void operator()(std::int64_t i) const { token_loss[i] = weighed_token(row, i, scale); }
};
template <class T>
struct MseTokens {
    MseRow<T> row;
    T* token_loss;
    STRATA_HD void operator()(std::int64_t i) const { token_loss[i] = row.token(i); }
};
template <class T>
struct MeanOfTokens {
    const T* token_loss;
    T* row_loss;
    std::int64_t tokens;
    STRATA_HD void operator()(std::int64_t r) const {
        T s = 0;
        for (std::int64_t k = 0; k < tokens; ++k) s += token_loss[r * tokens + k];
        row_loss[r] = s / T(tokens);
    }
};

// Keras's sample weights (keras/src/losses/loss.py, reduce_weighted_values): each example's
// loss, and so its gradient, is multiplied by its weight; the reduction stays
// "sum_over_batch_size", i.e. the weighted sum divided by the examples, not by the weights.
template <class T>
struct WeightRow {
    const T* weights;
    T* grad;
    T* row_loss;
    std::int64_t cols;
    STRATA_HD void operator()(std::int64_t r) const {
        const T w = weights[r];
        row_loss[r] *= w;
        for (std::int64_t c = 0; c < cols; ++c) grad[r * cols + c] *= w;
    }
};

// Row by row in float64, serially: user functions need not be thread-safe within one replica.
template <class T>
void custom_rows(const Custom& l, const T* pred, const T* target, T* grad, T* row_loss, std::int64_t n,
                 std::int64_t cols, T inv_denom) {
    thread_local std::vector<double> buf;
    buf.resize(std::size_t(3 * cols));
    const std::span<double> p(buf.data(), std::size_t(cols)), t(buf.data() + cols, std::size_t(cols)),
        g(buf.data() + 2 * cols, std::size_t(cols));
    for (std::int64_t r = 0; r < n; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
            p[std::size_t(c)] = double(pred[r * cols + c]);
            t[std::size_t(c)] = double(target[r * cols + c]);
            g[std::size_t(c)] = 0.0;
        }
        row_loss[r] = T(l.loss(p, t));
        l.gradient(p, t, g);
        for (std::int64_t c = 0; c < cols; ++c) grad[r * cols + c] = T(g[std::size_t(c)]) * inv_denom;
    }
}

struct LossScratchTag {};

}  // namespace detail

/// Computes the loss of `pred` ([n, ...]) against `target` and writes
/// d(sum of per-example losses / denominator) / d pred into `grad` (same shape as pred).
/// Returns the sum of the n per-example losses (a double on the host).
///
/// `target` holds class ids as numbers ([n]) for SparseCategoricalCrossentropy, and the same
/// shape as `pred` otherwise. Sequences: with `pred` [n, K, classes] (rank >= 3; the axes before
/// the last flattened) and `target` [n, K] (K > 1), each token's row is its own softmax against
/// its own id, and an example's loss is the mean over its K tokens (so the batch's loss is the
/// mean over every token, Keras' reduction of a [n, K] loss). CategoricalCrossentropy works
/// along the last axis the same way (each of the K rows of `classes` its own distribution
/// against its own target row; Keras' axis=-1), and MeanSquaredError is the mean over the last
/// axis, then over the K tokens (the mean over every value). Class ids must have been checked
/// to be in range by the caller (the Model does, with a clear error, before the data reach a
/// device).
///
/// `weights`, when not null, points to n per-example weights on the place P (Keras's
/// sample_weight): each example's loss and gradient are multiplied by its weight, and the
/// weighted losses are summed.
///
/// `token_weights`, when not null (every built-in loss; not Custom, whose functions see a whole
/// example), points to one weight per token (per row of the last axis of `pred`; for
/// SparseCategoricalCrossentropy, per class id of `target`) on P: each token's loss and gradient
/// are multiplied by its weight, and a token weighed 0 is left out (its loss is not computed,
/// its gradient is 0, its target is not read). Model passes the token mask of an Embedding with
/// mask_zero this way, scaled so that the batch's loss is the mean over the tokens that count
/// (Keras' masked reduction).
template <class T, class P>
const T* loss_rows_and_grad(const Loss& loss, const TensorView<T, P>& pred, const TensorView<T, P>& target,
                            const TensorView<T, P>& grad, double denominator, Input input, const T* weights,
                            const T* token_weights = nullptr);

template <class T, class P>
double loss_and_grad(const Loss& loss, const TensorView<T, P>& pred, const TensorView<T, P>& target,
                     const TensorView<T, P>& grad, double denominator, Input input, const T* weights = nullptr,
                     const T* token_weights = nullptr) {
    const std::int64_t n = pred.dim(0);
    const T* rows = loss_rows_and_grad(loss, pred, target, grad, denominator, input, weights, token_weights);
    if (n == 0) return 0.0;
    // n values: summed on the host in a fixed order (n is a batch, small), no allocation.
    if constexpr (place::host_accessible_v<P>) {
        double s = 0;
        for (std::int64_t i = 0; i < n; ++i) s += double(rows[i]);
        return s;
    } else {
        return double(sum(TensorView<T, P>(const_cast<T*>(rows), Shape{n})));
    }
}

/// Sizes loss_rows_and_grad's per-thread scratch on P for batches of up to `examples` on the
/// calling thread (Model::build, on each replica's thread: the first step then allocates nothing).
/// `tokens`: the rows of the output's last axis an example holds (a per-token loss keeps each
/// token's loss too).
template <class T, class P>
void reserve_scratch(std::int64_t examples, std::int64_t tokens = 1) {
    if (examples > 0) strata::detail::scratch<T, P, detail::LossScratchTag>(examples * (tokens > 1 ? 1 + tokens : 1));
}

/// What loss_and_grad computes but does not sum: the gradient into `grad`, and each example's
/// (weighted) loss into n values of a scratch buffer on P, returned (null when n is 0). A device
/// place sums them without the host waiting (reduce.hpp's sum_to_device).
template <class T, class P>
const T* loss_rows_and_grad(const Loss& loss, const TensorView<T, P>& pred, const TensorView<T, P>& target,
                            const TensorView<T, P>& grad, double denominator, Input input, const T* weights,
                            const T* token_weights) {
    static_assert(std::is_floating_point_v<T>, "strata::loss: T must be float or double");
    const std::int64_t n = pred.dim(0);
    STRATA_CHECK(grad.size() == pred.size(), ShapeError, "loss: the gradient buffer ", grad.shape(),
                 " does not match the predictions ", pred.shape());
    if (n == 0) return nullptr;
    const std::int64_t cols = pred.size() / n;
    const T inv = T(1.0 / denominator);
    // The examples' losses (n), then with K > 1 tokens an example its tokens' (n·K): the scratch
    // reserve_scratch sizes.
    T* rows = nullptr;
    auto rows_for = [&](std::int64_t tokens) {
        rows = strata::detail::scratch<T, P, detail::LossScratchTag>(n * (tokens > 1 ? 1 + tokens : 1));
        return rows;
    };
    // The rows: one index per example, or with several tokens an example one per token
    // (`per_token`, into rows + n), then each example's mean.
    auto run_rows = [&](const auto& row, const auto& per_token, std::int64_t tokens) {
        if (tokens > 1) {
            place::for_each_n<P>(n * tokens, per_token);
            place::for_each_n<P>(n, detail::MeanOfTokens<T>{rows + n, rows, tokens});
        } else {
            place::for_each_n<P>(n, row);
        }
    };
    std::visit(
        [&](const auto& l) {
            using L = std::decay_t<decltype(l)>;
            if constexpr (std::is_same_v<L, SparseCategoricalCrossentropy>) {
                // One class id per example, or (pred [n, ..., K, classes], target [n, K]) one per
                // token: each of the K rows of classes its own softmax.
                const std::int64_t tokens = target.size() / n;
                const bool per_token = tokens > 1 && target.size() == n * tokens && pred.rank() >= 3 &&
                                       pred.dim(pred.rank() - 1) * tokens == cols;
                STRATA_CHECK(target.size() == n || per_token, ShapeError, "SparseCategoricalCrossentropy: ", n,
                             " predictions of shape ", pred.shape(), " need ", n, " class ids, or one per token (", n,
                             " × the tokens before the class axis), got targets of shape ", target.shape());
                const std::int64_t k = per_token ? tokens : 1;
                const detail::SparseCeRow<T> row{pred.data(), target.data(), grad.data(), rows_for(k), cols / k, inv,
                                                 input == Input::Logits, k, token_weights};
                run_rows(row, detail::TokenLosses<detail::SparseCeRow<T>>{row, inv / T(k), rows + n}, k);
            } else if constexpr (std::is_same_v<L, CategoricalCrossentropy>) {
                STRATA_CHECK(target.size() == pred.size(), ShapeError, "CategoricalCrossentropy: predictions ",
                             pred.shape(), " and targets ", target.shape(), " differ");
                const std::int64_t tokens = last_axis_rows(pred);
                const detail::CategoricalCeRow<T> row{pred.data(), target.data(), grad.data(), rows_for(tokens), cols / tokens,
                                                      inv, input == Input::Logits, tokens, token_weights};
                run_rows(row, detail::TokenLosses<detail::CategoricalCeRow<T>>{row, inv / T(tokens), rows + n}, tokens);
            } else if constexpr (std::is_same_v<L, Custom>) {
                STRATA_CHECK(!token_weights, ValueError, "loss::Custom '", l.name, "': its functions see a whole example, "
                             "and the token mask (an Embedding's mask_zero) weighs each token; a custom loss takes no mask");
                STRATA_CHECK(l.loss && l.gradient, ValueError, "loss::Custom '", l.name, "': both functions are needed, got ",
                             l.loss ? "a loss" : "no loss", " and ", l.gradient ? "a gradient" : "no gradient");
                STRATA_CHECK(target.size() == pred.size(), ShapeError, "loss::Custom '", l.name, "': predictions ",
                             pred.shape(), " and targets ", target.shape(), " differ");
                if constexpr (place::host_accessible_v<P>) {
                    detail::custom_rows(l, pred.data(), target.data(), grad.data(), rows_for(1), n, cols, inv);
                } else {
                    throw_error<DeviceError>("loss::Custom '", l.name, "': user-defined losses run on host places, found the ",
                                             P::name, " place (write a built-in loss, or train on strata::place::Host)");
                }
            } else {
                STRATA_CHECK(target.size() == pred.size(), ShapeError, "MeanSquaredError: predictions ", pred.shape(),
                             " and targets ", target.shape(), " differ");
                // Per token when a mask weighs the tokens (as the cross-entropies); without one, an
                // example's values are one mean.
                const std::int64_t tokens = token_weights ? last_axis_rows(pred) : 1;
                const detail::MseRow<T> row{pred.data(), target.data(), grad.data(), rows_for(tokens), cols, inv,
                                            last_axis_rows(pred), token_weights};
                run_rows(row, detail::MseTokens<T>{row, rows + n}, tokens);
            }
        },
        loss);
    if (weights) place::for_each_n<P>(n, detail::WeightRow<T>{weights, grad.data(), rows, cols});
    return rows;
}

#if STRATA_INSTANCES
// The host's losses (every built-in one's row kernels and the Custom rows) are compiled once in
// the compiled part.
STRATA_TEMPLATE double loss_and_grad<float, place::Host>(const Loss&, const TensorView<float, place::Host>&,
                                                         const TensorView<float, place::Host>&,
                                                         const TensorView<float, place::Host>&, double, Input, const float*,
                                                         const float*);
STRATA_TEMPLATE double loss_and_grad<double, place::Host>(const Loss&, const TensorView<double, place::Host>&,
                                                          const TensorView<double, place::Host>&,
                                                          const TensorView<double, place::Host>&, double, Input, const double*,
                                                          const double*);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE double loss_and_grad<float, place::Cuda>(const Loss&, const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, double, Input,
                                                       const float*, const float*);
STRATA_CUDA_TEMPLATE double loss_and_grad<double, place::Cuda>(const Loss&, const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, double,
                                                        Input, const double*, const double*);
STRATA_CUDA_TEMPLATE const float* loss_rows_and_grad<float, place::Cuda>(const Loss&, const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&,
                                                                 double, Input, const float*, const float*);
STRATA_CUDA_TEMPLATE const double* loss_rows_and_grad<double, place::Cuda>(const Loss&, const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&,
                                                                   const TensorView<double, place::Cuda>&, double, Input, const double*,
                                                                   const double*);
#endif

/// Whether the loss wants its input as logits when the last activation is `LastIsSoftmax`.
inline Input input_kind(const Loss& loss, bool last_is_softmax) {
    return std::visit(
        [&](const auto& l) {
            using L = std::decay_t<decltype(l)>;
            if constexpr (std::is_same_v<L, MeanSquaredError> || std::is_same_v<L, Custom>) return Input::Probabilities;
            else return (last_is_softmax || l.from_logits) ? Input::Logits : Input::Probabilities;
        },
        loss);
}

/// Whether the loss expects integer class ids as targets.
inline bool sparse_targets(const Loss& loss) { return std::holds_alternative<SparseCategoricalCrossentropy>(loss); }

/// The loss's name, as Keras spells it ("sparse_categorical_crossentropy"), or a Custom's own.
inline const char* name(const Loss& loss) {
    return std::visit(
        [](const auto& l) -> const char* {
            if constexpr (std::is_same_v<std::decay_t<decltype(l)>, Custom>) return l.name.c_str();
            else return std::decay_t<decltype(l)>::name;
        },
        loss);
}

/// The loss and its settings as text ("sparse_categorical_crossentropy(from_logits=false)",
/// "custom 'huber'"): what the processes of a job compare at compile, where a rank with another
/// loss would train other gradients into the same all-reduce.
inline std::string describe(const Loss& loss) {
    return std::visit(
        [](const auto& l) -> std::string {
            using L = std::decay_t<decltype(l)>;
            if constexpr (std::is_same_v<L, Custom>) return "custom '" + l.name + "'";
            else if constexpr (std::is_same_v<L, MeanSquaredError>) return L::name;
            else return std::string(L::name) + (l.from_logits ? "(from_logits=true)" : "(from_logits=false)");
        },
        loss);
}

}  // namespace strata::loss
