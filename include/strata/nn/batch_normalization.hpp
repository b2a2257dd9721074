#pragma once
/// \file strata/nn/batch_normalization.hpp
/// `BatchNormalization<Options>`: Keras' batch normalization over the last (channel) axis, with
/// Keras' defaults (momentum 0.99, epsilon 1e-3, center and scale) and its moving statistics as
/// variables that are not trained; and `SyncBatchNormalization`, its `synchronized=True` form,
/// whose statistics are those of the whole global batch however it is split among replicas.
///
/// Training: each channel is normalized by the mean and (biased) variance of the batch over
/// every other axis (N·H·W values for images),
///     y = gamma · (x − mean) / sqrt(var + epsilon) + beta,
/// and the moving statistics move towards the batch's: moving = momentum · moving +
/// (1 − momentum) · batch (Keras' formula: the variance is the biased one, as Keras 3's; PyTorch
/// keeps the unbiased one). Inference (`evaluate`, `predict`): the moving statistics in place of
/// the batch's. A fresh layer's are mean 0, variance 1, so an untrained model normalizes by
/// sqrt(1 + epsilon), never by a zero variance.
///
/// How the moving statistics are updated: they live in the flat parameter buffer (after gamma and
/// beta, Keras' order: gamma, beta, moving_mean, moving_variance), marked not trainable
/// (ParamInfo::trainable). Backward writes the batch's mean and variance, weighted by this
/// replica's share of the global batch, into their gradient slots; the strategy sums gradients
/// as it always does, and the optimizer applies the moving average there
/// (optim::MovingAverageRange). So every strategy carries them like any variable (one copy per
/// replica or a central one, checkpoints, backups, broadcasts), updates them where it updates
/// the parameters, and replicas never disagree about them.
///
/// Statistics are accumulated in double, shifted by the moving mean (every replica holds the
/// same one): sums of (x − K) and (x − K)² lose no digits to cancellation once K is near the
/// batch mean.
///
/// Synchronized: per channel, the count, the shifted sum and the shifted sum of squares
/// (2C + 1 doubles) are summed over every replica in one all-reduce in forward (Keras' three
/// sums, batched), and sum(dy) and sum(dy · x̂) (2C doubles) in one in backward: N replicas on
/// the shards of a global batch compute what one device computes on the whole batch, for any
/// split (a shard may be empty; a batch need not divide). The unsynchronized layer normalizes
/// each replica's shard by its own statistics (Keras' default, and dlib's).

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/layer.hpp"
#include "strata/tensor/reduce.hpp"

namespace strata::nn {

/// BatchNormalization's settings, Keras' names and defaults.
struct BatchNormOptions {
    double momentum = 0.99;
    double epsilon = 1e-3;
    bool center = true;        ///< learn beta (an offset)
    bool scale = true;         ///< learn gamma (a factor)
    bool synchronized = false; ///< statistics over every replica's share of the global batch
};

namespace detail {
template <BatchNormOptions O, class In, class T, class P>
class BatchNormImpl;
}

/// Batch normalization over the last axis (channels last):
///
/// \code
/// using Net = Sequential<Input<28, 28, 1>, Conv2D<32, 3, Linear, false>, BatchNormalization<>, Activation<ReLU>, ...>;
/// using Tuned = BatchNormalization<BatchNormOptions{.momentum = 0.9, .epsilon = 1e-5}>;
/// \endcode
template <BatchNormOptions O = BatchNormOptions{}>
struct BatchNormalization {
    static_assert(O.momentum >= 0 && O.momentum <= 1, "strata::nn::BatchNormalization: momentum must be in [0, 1]");
    static_assert(O.epsilon > 0, "strata::nn::BatchNormalization: epsilon must be > 0");
    static constexpr const char* name = "BatchNormalization";
    static constexpr const char* keras_name = "batch_normalization";
    static constexpr BatchNormOptions options = O;
    template <class In, class T, class P>
    using bind = detail::BatchNormImpl<O, In, T, P>;
};

/// Keras' `BatchNormalization(synchronized=True)`: the statistics of the whole global batch,
/// combined over every replica of Mirrored, CentralStorage and MultiWorkerMirrored. A strategy
/// whose replicas do not step together (ParameterServer) refuses it at compile time.
template <double Momentum = 0.99, double Epsilon = 1e-3>
using SyncBatchNormalization = BatchNormalization<BatchNormOptions{.momentum = Momentum, .epsilon = Epsilon, .synchronized = true}>;

namespace detail {

// Each place gets its own shape of the layer's elementwise passes (as Conv2D's bias and
// activation): on the host one unit is a block of whole rows of [rows, C], whose channel is the
// position in the row (no division per element; the per-channel coefficients are copied to local
// arrays once a block, so the compiler sees they cannot alias the output and vectorises the row
// loop); on a GPU one thread is one element, its channel i % C with C a compile-time constant (a
// multiply, not a 64-bit division). -ffp-contract=off keeps the two bitwise equal.

/// Host: per channel, the shifted sums of one block of rows: partial[b][c] = Σ (x − K_c),
/// partial[b][C + c] = Σ (x − K_c)² (or, for backward, Σ dy and Σ dy · x̂). The blocks are a
/// function of the shape only, so the result does not depend on the thread count.
template <class T, std::int64_t C>
struct BnBlockSums {
    const T* x;        // [rows, C]
    const T* dy;       // backward: [rows, C]; forward: nullptr
    const T* shift;    // forward: K (the moving mean), [C]
    const double* mean;    // backward: the batch mean, [C]
    const double* invstd;  // backward: [C]
    double* partial;   // [blocks, 2C]
    std::int64_t rows, block_rows;
    void operator()(std::int64_t b) const {
        double s1[C], s2[C], k[C], m[C], is[C];
        for (std::int64_t c = 0; c < C; ++c) {
            s1[c] = 0;
            s2[c] = 0;
            if (dy) {
                m[c] = mean[c];
                is[c] = invstd[c];
            } else {
                k[c] = double(shift[c]);
            }
        }
        const std::int64_t r0 = b * block_rows, r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
        for (std::int64_t r = r0; r < r1; ++r) {
            const T* xr = x + r * C;
            if (!dy) {
                for (std::int64_t c = 0; c < C; ++c) {
                    const double d = double(xr[c]) - k[c];
                    s1[c] += d;
                    s2[c] += d * d;
                }
            } else {
                const T* gr = dy + r * C;
                for (std::int64_t c = 0; c < C; ++c) {
                    const double g = double(gr[c]);
                    s1[c] += g;
                    s2[c] += g * (double(xr[c]) - m[c]) * is[c];
                }
            }
        }
        double* out = partial + b * 2 * C;
        for (std::int64_t c = 0; c < C; ++c) {
            out[c] = s1[c];
            out[C + c] = s2[c];
        }
    }
};

/// Rows of [rows, C] per host unit of the elementwise passes: about 4096 values.
template <std::int64_t C>
inline constexpr std::int64_t bn_block_rows = C >= 4096 ? 1 : 4096 / C;

/// y = x · a + b per channel (forward). BnAffineRows: the host's, a block of rows per unit;
/// BnAffine: one element per index (a GPU's).
template <class T, std::int64_t C>
struct BnAffineRows {
    const T* x;
    T* y;
    const T* a;
    const T* b;
    std::int64_t rows;
    void operator()(std::int64_t u) const {
        T la[C], lb[C];
        for (std::int64_t c = 0; c < C; ++c) {
            la[c] = a[c];
            lb[c] = b[c];
        }
        constexpr std::int64_t block = bn_block_rows<C>;
        const std::int64_t r1 = (u + 1) * block < rows ? (u + 1) * block : rows;
        for (std::int64_t r = u * block; r < r1; ++r) {
            const T* xr = x + r * C;
            T* yr = y + r * C;
            for (std::int64_t c = 0; c < C; ++c) yr[c] = xr[c] * la[c] + lb[c];
        }
    }
};
template <class T, std::int64_t C>
struct BnAffine {
    const T* x;
    T* y;
    const T* a;
    const T* b;
    template <class I>
    STRATA_HD void operator()(I i) const {
        const I c = i % I(C);
        y[i] = x[i] * a[c] + b[c];
    }
};

/// dx = a · (dy − s1 − x̂ · s2) with x̂ = (x − mean) · invstd (backward; s1 and s2 already divided
/// by the count). `coef` is [5C]: a = gamma·invstd, mean, invstd, s1, s2. BnInputGradRows: the
/// host's; BnInputGrad: one element per index (a GPU's).
template <class T, std::int64_t C>
struct BnInputGradRows {
    const T* x;
    const T* dy;
    T* dx;
    const T* coef;
    std::int64_t rows;
    void operator()(std::int64_t u) const {
        T a[C], m[C], is[C], s1[C], s2[C];
        for (std::int64_t c = 0; c < C; ++c) {
            a[c] = coef[c];
            m[c] = coef[C + c];
            is[c] = coef[2 * C + c];
            s1[c] = coef[3 * C + c];
            s2[c] = coef[4 * C + c];
        }
        constexpr std::int64_t block = bn_block_rows<C>;
        const std::int64_t r1 = (u + 1) * block < rows ? (u + 1) * block : rows;
        for (std::int64_t r = u * block; r < r1; ++r) {
            const T* xr = x + r * C;
            const T* gr = dy + r * C;
            T* dr = dx + r * C;
            for (std::int64_t c = 0; c < C; ++c) {
                const T xhat = (xr[c] - m[c]) * is[c];
                dr[c] = a[c] * (gr[c] - s1[c] - xhat * s2[c]);
            }
        }
    }
};
template <class T, std::int64_t C>
struct BnInputGrad {
    const T* x;
    const T* dy;
    T* dx;
    const T* coef;
    template <class I>
    STRATA_HD void operator()(I i) const {
        const I c = i % I(C);
        const T xhat = (x[i] - coef[I(C) + c]) * coef[2 * I(C) + c];
        dx[i] = coef[c] * (dy[i] - coef[3 * I(C) + c] - xhat * coef[4 * I(C) + c]);
    }
};

#if STRATA_HAS_CUDA && defined(__CUDACC__)
// The GPU's loads for the per-channel sums (reduce.hpp's tuned column reduction, fused): the
// element i of [rows, C] is channel i % C.
template <class T, std::int64_t C>
struct BnLoadShifted {
    const T* x;
    const T* shift;
    bool square;
    __device__ double operator()(std::int64_t i) const {
        const double d = double(x[i]) - double(shift[i % C]);
        return square ? d * d : d;
    }
};
template <class T, std::int64_t C>
struct BnLoadGrad {
    const T* x;
    const T* dy;
    const T* coef;  // mean at [C, 2C), invstd at [2C, 3C)
    bool times_xhat;
    __device__ double operator()(std::int64_t i) const {
        const std::int64_t c = i % C;
        const double g = double(dy[i]);
        return times_xhat ? g * (double(x[i]) - double(coef[C + c])) * double(coef[2 * C + c]) : g;
    }
};
#endif

template <BatchNormOptions O, class In, class T, class P>
class BatchNormImpl {
public:
    using input_shape = In;
    using output_shape = In;
    static constexpr std::int64_t C = In::dims[In::rank - 1];
    /// Values per channel per example (H·W for images).
    static constexpr std::int64_t spatial = In::size / C;
    static constexpr std::int64_t gamma_at = 0;
    static constexpr std::int64_t beta_at = O.scale ? C : 0;
    static constexpr std::int64_t mean_at = beta_at + (O.center ? C : 0);
    static constexpr std::int64_t var_at = mean_at + C;
    static constexpr std::int64_t num_params = var_at + C;
    static constexpr bool synchronizes_replicas = O.synchronized;
    /// Its passes read the statistics back to the host (a step with it is not captured as a CUDA graph).
    static constexpr bool host_round_trips = true;

    static std::vector<ParamInfo> param_info() {
        std::vector<ParamInfo> p;
        // float32 under a mixed policy: the statistics and affine transform are float32 arithmetic.
        if (O.scale) p.push_back({"gamma", Shape{C}, gamma_at, true, 0, true});
        if (O.center) p.push_back({"beta", Shape{C}, beta_at, true, 0, true});
        p.push_back({"moving_mean", Shape{C}, mean_at, false, O.momentum, true});
        p.push_back({"moving_variance", Shape{C}, var_at, false, O.momentum, true});
        return p;
    }

    void init(T* params, std::uint64_t, std::uint64_t) const {
        if (O.scale) fill(TensorView<T, P>(params + gamma_at, Shape{C}), T(1));
        if (O.center) fill(TensorView<T, P>(params + beta_at, Shape{C}), T(0));
        fill(TensorView<T, P>(params + mean_at, Shape{C}), T(0));
        fill(TensorView<T, P>(params + var_at, Shape{C}), T(1));
    }

    void reserve(std::int64_t, bool) { coef_.resize(Shape{5 * C}); }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t rows = x.dim(0) * spatial;
        coef_.resize(Shape{5 * C});
        trained_ = mode.training;
        if (!mode.training) {
            // y = x · a + b with a = gamma / sqrt(moving_var + eps), b = beta − moving_mean · a.
            host_params(params);
            for (std::int64_t c = 0; c < C; ++c) {
                const double a = gamma(c) / std::sqrt(p_[var_at + c] + O.epsilon);
                a_[c] = T(a);
                b_[c] = T(beta(c) - p_[mean_at + c] * a);
            }
            put_coefficients(2);
            if (rows > 0) affine(rows, x.data(), y.data());
            return;
        }
        rows_ = rows;
        stats_.assign(std::size_t(2 * C + 1), 0.0);
        stats_[0] = double(rows);
        if (rows > 0) column_sums(rows, x.data(), nullptr, params + mean_at, stats_.data() + 1);
        if (O.synchronized && mode.replica_sum) mode.replica_sum(std::span<double>(stats_));
        host_params(params);
        batch_statistics(mode);
        for (std::int64_t c = 0; c < C; ++c) {
            const double a = gamma(c) * invstd_[c];
            a_[c] = T(a);
            b_[c] = T(beta(c) - mean_[c] * a);
        }
        put_coefficients(2);
        if (rows > 0) affine(rows, x.data(), y.data());
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        const std::int64_t rows = x.dim(0) * spatial;
        std::vector<double>& g = gsum_;
        g.assign(std::size_t(2 * C), 0.0);
        if (!trained_) {
            // After an inference forward: the layer is the affine map x · a + b (moving statistics).
            host_params(params);
            for (std::int64_t c = 0; c < C; ++c) {
                mean_[c] = p_[mean_at + c];
                invstd_[c] = 1.0 / std::sqrt(p_[var_at + c] + O.epsilon);
                var_[c] = p_[var_at + c];
            }
            count_ = 0;  // no statistics: the moving ones stay (see the weight below)
        }
        // coef_ = [a, mean, invstd, s1/N, s2/N] (the last two filled below).
        for (std::int64_t c = 0; c < C; ++c) {
            a_[c] = T(gamma(c) * invstd_[c]);
            mean_t_[c] = T(mean_[c]);
            invstd_t_[c] = T(invstd_[c]);
        }
        put_coefficients(3);
        if (rows > 0) column_sums(rows, x.data(), dy.data(), nullptr, g.data());
        write_parameter_grads(grads, g, mode);
        if (!trained_) {
            for (std::int64_t c = 0; c < 2 * C; ++c) g[std::size_t(c)] = 0;  // inference: dx = a · dy
        } else {
            if (O.synchronized && mode.replica_sum) mode.replica_sum(std::span<double>(g));
            const double inv_n = count_ > 0 ? 1.0 / count_ : 0.0;
            for (auto& v : g) v *= inv_n;
        }
        for (std::int64_t c = 0; c < C; ++c) {
            s1_[c] = T(g[std::size_t(c)]);
            s2_[c] = T(g[std::size_t(C + c)]);
        }
        put_coefficients(5);
        if (!dx.empty() && rows > 0)
            input_grad(rows, x.data(), dy.data(), dx.data());
    }

    /// A replica whose share of the global batch is empty still takes part in the sums the
    /// others wait for (synchronized only), contributing nothing: forward's, then backward's
    /// (Network::join_empty calls them in the order a pass would).
    void join_forward(const T*, const Mode& mode) {
        if constexpr (O.synchronized) {
            stats_.assign(std::size_t(2 * C + 1), 0.0);
            if (mode.replica_sum) mode.replica_sum(std::span<double>(stats_));
        }
    }
    void join_backward(T*, const Mode& mode) {
        if constexpr (O.synchronized) {
            gsum_.assign(std::size_t(2 * C), 0.0);
            if (mode.replica_sum) mode.replica_sum(std::span<double>(gsum_));
        }
    }

    /// The last training forward's batch statistics (for tests): mean and biased variance.
    std::span<const double> batch_mean() const { return mean_; }
    std::span<const double> batch_variance() const { return var_; }

private:
    double gamma(std::int64_t c) const { return O.scale ? p_[gamma_at + c] : 1.0; }
    double beta(std::int64_t c) const { return O.center ? p_[beta_at + c] : 0.0; }

    // The layer's parameters on the host, as doubles (a device place copies its 4C values down).
    void host_params(const T* params) {
        p_.resize(std::size_t(num_params));
        if constexpr (place::host_accessible_v<P>) {
            for (std::int64_t i = 0; i < num_params; ++i) p_[std::size_t(i)] = double(params[i]);
        } else {
            param_host_.resize(std::size_t(num_params));
            copy(TensorView<T, P>(const_cast<T*>(params), Shape{num_params}), TensorView<T, place::Host>(param_host_.data(), Shape{num_params}));
            for (std::int64_t i = 0; i < num_params; ++i) p_[std::size_t(i)] = double(param_host_[std::size_t(i)]);
        }
    }

    // mean, variance and 1/sqrt(var + eps) from the (summed) count and shifted sums.
    void batch_statistics(const Mode& mode) {
        count_ = stats_[0];
        // The replica's weight in the global batch's statistics: its rows over the global batch's.
        double global_rows = count_;
        if (!(O.synchronized && mode.replica_sum) || mode.partial_statistics)
            global_rows = mode.global_examples > 0 ? double(mode.global_examples * spatial) : double(rows_);
        weight_ = global_rows > 0 ? double(rows_) / global_rows : 0.0;
        for (std::int64_t c = 0; c < C; ++c) {
            const double n = count_ > 0 ? count_ : 1.0;
            const double m1 = stats_[std::size_t(1 + c)] / n, m2 = stats_[std::size_t(1 + C + c)] / n;
            const double var = m2 - m1 * m1 > 0 ? m2 - m1 * m1 : 0.0;
            mean_[c] = p_[mean_at + c] + m1;
            var_[c] = var;
            invstd_[c] = 1.0 / std::sqrt(var + O.epsilon);
        }
    }

    // gamma's and beta's gradients (this replica's sums; the strategy adds the others'), and the
    // moving statistics' slots: the batch's statistic times this replica's weight.
    void write_parameter_grads(T* grads, const std::vector<double>& g, const Mode&) {
        std::vector<T>& h = grad_host_;
        h.assign(std::size_t(num_params), T(0));
        for (std::int64_t c = 0; c < C; ++c) {
            if (O.scale) h[std::size_t(gamma_at + c)] = T(g[std::size_t(C + c)]);
            if (O.center) h[std::size_t(beta_at + c)] = T(g[std::size_t(c)]);
            // After an inference forward no statistic was taken: the slot holds the moving value
            // itself (weight 1), so the update leaves it where it is.
            const double w = trained_ ? weight_ : 1.0;
            h[std::size_t(mean_at + c)] = T(mean_[c] * w);
            h[std::size_t(var_at + c)] = T(var_[c] * w);
        }
        copy(TensorView<T, place::Host>(h.data(), Shape{num_params}), TensorView<T, P>(grads, Shape{num_params}));
    }

    // Writes the first `k` blocks of C coefficients (a_, b_/mean, invstd, s1, s2) to coef_.
    void put_coefficients(int k) {
        host_coef_.resize(std::size_t(5 * C));
        for (std::int64_t c = 0; c < C; ++c) {
            host_coef_[std::size_t(c)] = a_[c];
            host_coef_[std::size_t(C + c)] = k == 2 ? b_[c] : mean_t_[c];
            host_coef_[std::size_t(2 * C + c)] = invstd_t_[c];
            host_coef_[std::size_t(3 * C + c)] = s1_[c];
            host_coef_[std::size_t(4 * C + c)] = s2_[c];
        }
        copy(TensorView<T, place::Host>(host_coef_.data(), Shape{std::int64_t(k) * C}), TensorView<T, P>(coef_.data(), Shape{std::int64_t(k) * C}));
    }

    // y = x · a + b per channel (a, b: the first two blocks of coef_), shaped for the place.
    void affine(std::int64_t rows, const T* x, T* y) {
        if (rows <= 0) return;
        const T* a = coef_.data();
        if constexpr (place::host_accessible_v<P>) {
            constexpr std::int64_t block = bn_block_rows<C>;
            ::strata::detail::host_shaped_for_each<P>((rows + block - 1) / block, BnAffineRows<T, C>{x, y, a, a + C, rows});
        } else {
            for_each_index<P>(rows * C, BnAffine<T, C>{x, y, a, a + C});
        }
    }

    // dx from dy and the five blocks of coef_, shaped for the place.
    void input_grad(std::int64_t rows, const T* x, const T* dy, T* dx) {
        if (rows <= 0) return;
        if constexpr (place::host_accessible_v<P>) {
            constexpr std::int64_t block = bn_block_rows<C>;
            ::strata::detail::host_shaped_for_each<P>((rows + block - 1) / block, BnInputGradRows<T, C>{x, dy, dx, coef_.data(), rows});
        } else {
            for_each_index<P>(rows * C, BnInputGrad<T, C>{x, dy, dx, coef_.data()});
        }
    }

    // Per-channel sums over the rows of x ([rows, C]) into out[0, 2C), in double: forward
    // (dy == nullptr) Σ (x − K) and Σ (x − K)² with K = `shift`; backward Σ dy and Σ dy · x̂.
    void column_sums(std::int64_t r, const T* x, const T* dy, const T* shift, double* out) {
        if constexpr (place::host_accessible_v<P>) {
            const std::int64_t blocks = r < 64 ? (r > 0 ? r : 1) : 64, block_rows = (r + blocks - 1) / blocks;
            double* partial = tensor_detail_scratch(blocks * 2 * C);
            ::strata::detail::host_shaped_for_each<P>(blocks, BnBlockSums<T, C>{x, dy, shift, mean_.data(), invstd_.data(), partial, r, block_rows});
            for (std::int64_t c = 0; c < 2 * C; ++c) {
                double s = 0;
                for (std::int64_t b = 0; b < blocks; ++b) s += partial[b * 2 * C + c];
                out[c] = s;
            }
        } else {
#if STRATA_HAS_CUDA && defined(__CUDACC__)
            double* dev = ::strata::detail::scratch<double, P, BnLoadShifted<T, C>>(2 * C);
            using ::strata::detail::Reduction;
            namespace cr = ::strata::detail::cuda_reduce;
            if (!dy) {
                cr::axis_with<double>(BnLoadShifted<T, C>{x, shift, false}, dev, 1, r, C, Reduction::Sum);
                cr::axis_with<double>(BnLoadShifted<T, C>{x, shift, true}, dev + C, 1, r, C, Reduction::Sum);
            } else {
                cr::axis_with<double>(BnLoadGrad<T, C>{x, dy, coef_.data(), false}, dev, 1, r, C, Reduction::Sum);
                cr::axis_with<double>(BnLoadGrad<T, C>{x, dy, coef_.data(), true}, dev + C, 1, r, C, Reduction::Sum);
            }
            copy(TensorView<double, P>(dev, Shape{2 * C}), TensorView<double, place::Host>(out, Shape{2 * C}));
#else
            static_assert(::strata::detail::dependent_false<P>, "strata::nn::BatchNormalization: this place's sums are compiled by nvcc only");
#endif
        }
    }
    double* tensor_detail_scratch(std::int64_t n) { return ::strata::detail::scratch<double, place::Host, BnBlockSums<T, C>>(n); }

    Tensor<T, P> coef_;
    std::vector<double> p_, stats_, gsum_;
    std::vector<T> host_coef_, grad_host_, param_host_;
    double count_ = 0, weight_ = 0;
    std::int64_t rows_ = 0;
    bool trained_ = false;
    std::array<double, C> mean_{}, var_{}, invstd_{};
    std::array<T, C> a_{}, b_{}, mean_t_{}, invstd_t_{}, s1_{}, s2_{};
};

}  // namespace detail

}  // namespace strata::nn
