#pragma once
/// \file strata/nn/layer_normalization.hpp
/// `LayerNormalization<Options>`: Keras' layer normalization (Ba, Kiros, Hinton, "Layer
/// normalization", 2016) over the last axis of each example, with Keras' defaults (epsilon
/// 1e-3, center and scale) and variable names (`gamma`, `beta`, each of the last axis' size).
///
/// For each row r (one example's last axis: an example of [16, 32] is 16 rows of 32 features),
///     y = gamma · (x − mean_r) / sqrt(var_r + epsilon) + beta,
/// with the row's mean and biased variance. Unlike batch normalization, nothing depends on the
/// other examples of the batch: training and inference compute the same thing, there are no
/// moving statistics, and replicas need not agree on anything but the variables.
///
/// Statistics are computed in double, two-pass: the mean first, then the mean of (x − mean)²
/// (no cancellation, whatever the offset of the row). Backward, with x̂ = (x − mean) · rstd,
/// g = gamma · dy and rstd = 1 / sqrt(var + epsilon):
///     dx = rstd · (g − mean_c(g) − x̂ · mean_c(g · x̂)),  dgamma = Σ_rows dy · x̂,  dbeta = Σ_rows dy.
/// The forward keeps each row's mean and rstd (two doubles a row) for backward.
///
/// Places: on the host one row per index of the parallel loop (a row is short, its sums serial
/// in double), and the gamma/beta gradients as 64 fixed blocks of rows combined in order (the
/// result does not depend on the thread count); on Cuda the row statistics and the column sums
/// are reduce.hpp's tuned axis reduction (`cuda_reduce::axis_with`, [rows, C] reduced along C,
/// then along the rows), with the element passes as one thread per value.

#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/layer.hpp"
#include "strata/tensor/reduce.hpp"

namespace strata::nn {

/// LayerNormalization's settings, Keras' names and defaults.
struct LayerNormOptions {
    double epsilon = 1e-3;
    bool center = true;  ///< learn beta (an offset per feature)
    bool scale = true;   ///< learn gamma (a factor per feature)
};

namespace detail {
template <LayerNormOptions O, class In, class T, class P>
class LayerNormImpl;
}

/// Layer normalization over the last axis of each example (Keras' `LayerNormalization()`,
/// `axis=-1`): inputs of any rank, [features] or [tokens, features] or an image's [H, W, C].
///
/// \code
/// using Block = Sequential<Input<16, 32>, LayerNormalization<>, ...>;   // 16 tokens of 32 features
/// using Tight = LayerNormalization<LayerNormOptions{.epsilon = 1e-6}>;
/// \endcode
template <LayerNormOptions O = LayerNormOptions{}>
struct LayerNormalization {
    static_assert(O.epsilon > 0, "strata::nn::LayerNormalization: epsilon must be > 0");
    static constexpr const char* name = "LayerNormalization";
    static constexpr const char* keras_name = "layer_normalization";
    static constexpr LayerNormOptions options = O;
    template <class In, class T, class P>
    using bind = detail::LayerNormImpl<O, In, T, P>;
};

/// Describes an expected shape in LayerShapeError messages: a last axis of at least one value.
struct NonEmptyLastAxis {};

namespace detail {

template <class In>
constexpr std::int64_t last_extent() {
    if constexpr (In::rank == 0) return 0;
    else return In::dims[In::rank - 1];
}

/// Host: one row of [rows, C] per index: its mean and variance in double (two passes), then y.
template <class T>
struct LnRowForward {
    const T* x;
    T* y;
    const T* gamma;  // nullptr: 1
    const T* beta;   // nullptr: 0
    double* mean;    // [rows]
    double* rstd;    // [rows]
    std::int64_t C;
    double epsilon;
    void operator()(std::int64_t r) const {
        const T* xr = x + r * C;
        T* yr = y + r * C;
        // Both sums in four partial sums, c mod 4, added in a fixed order at the end: four
        // chains of dependent adds instead of one (the compiler may not reorder them), which
        // took the ViT's layer normalizations from 8% of its step (perf); a row's bits still
        // depend only on the row.
        double s4[4] = {0, 0, 0, 0};
        std::int64_t c4 = C - C % 4;
        for (std::int64_t c = 0; c < c4; c += 4)
            for (int k = 0; k < 4; ++k) s4[k] += double(xr[c + k]);
        double s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
        for (std::int64_t c = c4; c < C; ++c) s += double(xr[c]);
        const double m = s / double(C);
        double q4[4] = {0, 0, 0, 0};
        for (std::int64_t c = 0; c < c4; c += 4)
            for (int k = 0; k < 4; ++k) {
                const double d = double(xr[c + k]) - m;
                q4[k] += d * d;
            }
        double q = (q4[0] + q4[1]) + (q4[2] + q4[3]);
        for (std::int64_t c = c4; c < C; ++c) {
            const double d = double(xr[c]) - m;
            q += d * d;
        }
        const double is = 1.0 / std::sqrt(q / double(C) + epsilon);
        mean[r] = m;
        rstd[r] = is;
        for (std::int64_t c = 0; c < C; ++c) {
            const double v = (double(xr[c]) - m) * is;
            yr[c] = T((gamma ? double(gamma[c]) : 1.0) * v + (beta ? double(beta[c]) : 0.0));
        }
    }
};

/// Host: dx of one row per index.
template <class T>
struct LnRowInputGrad {
    const T* x;
    const T* dy;
    T* dx;
    const T* gamma;
    const double* mean;
    const double* rstd;
    std::int64_t C;
    void operator()(std::int64_t r) const {
        const T* xr = x + r * C;
        const T* gr = dy + r * C;
        T* d = dx + r * C;
        const double m = mean[r], is = rstd[r];
        double s1 = 0, s2 = 0;
        for (std::int64_t c = 0; c < C; ++c) {
            const double g = double(gr[c]) * (gamma ? double(gamma[c]) : 1.0);
            s1 += g;
            s2 += g * (double(xr[c]) - m) * is;
        }
        s1 /= double(C);
        s2 /= double(C);
        for (std::int64_t c = 0; c < C; ++c) {
            const double g = double(gr[c]) * (gamma ? double(gamma[c]) : 1.0);
            d[c] = T(is * (g - s1 - (double(xr[c]) - m) * is * s2));
        }
    }
};

/// Host: Σ dy · x̂ and Σ dy per feature over one block of rows into partial[b][0, 2C).
template <class T>
struct LnBlockParamSums {
    const T* x;
    const T* dy;
    const double* mean;
    const double* rstd;
    double* partial;  // [blocks, 2C]: Σ dy·x̂ then Σ dy
    std::int64_t rows, C, block_rows;
    void operator()(std::int64_t b) const {
        double* sg = partial + b * 2 * C;
        double* sb = sg + C;
        for (std::int64_t c = 0; c < 2 * C; ++c) sg[c] = 0;
        const std::int64_t r0 = b * block_rows, r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
        for (std::int64_t r = r0; r < r1; ++r) {
            const T* xr = x + r * C;
            const T* gr = dy + r * C;
            for (std::int64_t c = 0; c < C; ++c) {
                const double g = double(gr[c]);
                sg[c] += g * (double(xr[c]) - mean[r]) * rstd[r];
                sb[c] += g;
            }
        }
    }
};

/// Any place: y = gamma · (x − mean) · rstd + beta, one value per index.
template <class T>
struct LnApply {
    const T* x;
    T* y;
    const T* gamma;
    const T* beta;
    const double* mean;
    const double* rstd;
    std::int64_t C;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t r = i / C, c = i % C;
        const double v = (double(x[i]) - mean[r]) * rstd[r];
        y[i] = T((gamma ? double(gamma[c]) : 1.0) * v + (beta ? double(beta[c]) : 0.0));
    }
};
/// Any place: rstd = 1 / sqrt(var + epsilon), one row per index (in place).
struct LnVarToRstd {
    double* v;
    double epsilon;
    STRATA_HD void operator()(std::int64_t r) const {
        using std::sqrt;
        v[r] = 1.0 / sqrt(v[r] + epsilon);
    }
};
/// Any place: dx = rstd · (g − s1 − x̂ · s2), one value per index (s1, s2 the row means of g, g·x̂).
template <class T>
struct LnInputGrad {
    const T* x;
    const T* dy;
    T* dx;
    const T* gamma;
    const double* mean;
    const double* rstd;
    const double* s1;
    const double* s2;
    std::int64_t C;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t r = i / C, c = i % C;
        const double g = double(dy[i]) * (gamma ? double(gamma[c]) : 1.0);
        dx[i] = T(rstd[r] * (g - s1[r] - (double(x[i]) - mean[r]) * rstd[r] * s2[r]));
    }
};

#if STRATA_HAS_CUDA && defined(__CUDACC__)
// The GPU's loads for the row and column sums (reduce.hpp's axis reduction, fused): element i
// of [rows, C] is row i / C, feature i % C.
template <class T>
struct LnLoadX {
    const T* x;
    __device__ double operator()(std::int64_t i) const { return double(x[i]); }
};
template <class T>
struct LnLoadCentredSquare {
    const T* x;
    const double* mean;
    std::int64_t C;
    __device__ double operator()(std::int64_t i) const {
        const double d = double(x[i]) - mean[i / C];
        return d * d;
    }
};
/// g = gamma · dy, or g · x̂ (times_xhat), or dy · x̂ (the gamma gradient: gamma null).
template <class T>
struct LnLoadGrad {
    const T* x;
    const T* dy;
    const T* gamma;
    const double* mean;
    const double* rstd;
    std::int64_t C;
    bool times_xhat;
    __device__ double operator()(std::int64_t i) const {
        const std::int64_t r = i / C;
        const double g = double(dy[i]) * (gamma ? double(gamma[i % C]) : 1.0);
        return times_xhat ? g * (double(x[i]) - mean[r]) * rstd[r] : g;
    }
};
#endif

template <LayerNormOptions O, class In, class T, class P>
class LayerNormImpl {
    static_assert(LayerShapeError<LayerNormalization<O>, NonEmptyLastAxis, In, (In::rank >= 1 && last_extent<In>() >= 1)>::value,
                  "strata::nn::LayerNormalization: it normalizes the last axis of each example, so the input needs one "
                  "with at least one value (a scalar or an empty last axis has nothing to normalize)");

public:
    using input_shape = In;
    /// Carries the token mask (TokenMask): its output has the input's tokens, each from its own.
    static constexpr TokenMask token_mask = TokenMask::Passes;
    using output_shape = In;
    /// Features: the last axis, which each row normalizes.
    static constexpr std::int64_t C = last_extent<In>() >= 1 ? last_extent<In>() : 1;
    /// Rows per example.
    static constexpr std::int64_t rows_per_example = In::size / C;
    static constexpr std::int64_t gamma_at = 0;
    static constexpr std::int64_t beta_at = O.scale ? C : 0;
    static constexpr std::int64_t num_params = (O.scale ? C : 0) + (O.center ? C : 0);

    static std::vector<ParamInfo> param_info() {
        std::vector<ParamInfo> p;
        // float32 under a mixed policy: the normalization is float32 arithmetic.
        if (O.scale) p.push_back({"gamma", Shape{C}, gamma_at, true, 0, true});
        if (O.center) p.push_back({"beta", Shape{C}, beta_at, true, 0, true});
        return p;
    }

    void init(T* params, std::uint64_t, std::uint64_t) const {
        if (O.scale) fill(TensorView<T, P>(params + gamma_at, Shape{C}), T(1));
        if (O.center) fill(TensorView<T, P>(params + beta_at, Shape{C}), T(0));
    }

    void reserve(std::int64_t n, bool) { stats_.resize(Shape{4 * n * rows_per_example}); }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&) {
        const std::int64_t rows = x.dim(0) * rows_per_example;
        rows_ = rows;
        if (rows == 0) return;
        stats_.resize(Shape{4 * rows});  // grow-only storage
        double* mean = stats_.data();
        double* rstd = mean + rows;
        const T* gamma = O.scale ? params + gamma_at : nullptr;
        const T* beta = O.center ? params + beta_at : nullptr;
        if constexpr (place::host_accessible_v<P>) {
            ::strata::detail::host_shaped_for_each<P>(rows, LnRowForward<T>{x.data(), y.data(), gamma, beta, mean, rstd, C, O.epsilon});
        } else {
#if STRATA_HAS_CUDA && defined(__CUDACC__)
            using ::strata::detail::Reduction;
            namespace cr = ::strata::detail::cuda_reduce;
            cr::axis_with<double>(LnLoadX<T>{x.data()}, mean, rows, C, 1, Reduction::Mean);
            cr::axis_with<double>(LnLoadCentredSquare<T>{x.data(), mean, C}, rstd, rows, C, 1, Reduction::Mean);
            place::for_each_n<P>(rows, LnVarToRstd{rstd, O.epsilon});
            place::for_each_n<P>(rows * C, LnApply<T>{x.data(), y.data(), gamma, beta, mean, rstd, C});
#else
            static_assert(::strata::detail::dependent_false<P>, "strata::nn::LayerNormalization: this place's passes are compiled by nvcc only");
#endif
        }
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode&) {
        const std::int64_t rows = x.dim(0) * rows_per_example;
        STRATA_CHECK(rows == rows_, ValueError, "LayerNormalization: backward on ", x.dim(0),
                     " examples needs the statistics of a forward on the same batch; the last forward had ",
                     rows_ / rows_per_example);
        if (rows == 0) {
            if (num_params > 0) fill(TensorView<T, P>(grads, Shape{num_params}), T(0));
            return;
        }
        const double* mean = stats_.data();
        const double* rstd = mean + rows;
        const T* gamma = O.scale ? params + gamma_at : nullptr;
        if constexpr (place::host_accessible_v<P>) {
            if constexpr (num_params > 0) {
                const std::int64_t blocks = rows < 64 ? rows : 64, block_rows = (rows + blocks - 1) / blocks;
                double* partial = ::strata::detail::scratch<double, place::Host, LnBlockParamSums<T>>(blocks * 2 * C);
                ::strata::detail::host_shaped_for_each<P>(blocks, LnBlockParamSums<T>{x.data(), dy.data(), mean, rstd, partial, rows, C, block_rows});
                for (std::int64_t c = 0; c < C; ++c) {
                    double sg = 0, sb = 0;
                    for (std::int64_t b = 0; b < blocks; ++b) {
                        sg += partial[b * 2 * C + c];
                        sb += partial[b * 2 * C + C + c];
                    }
                    if (O.scale) grads[gamma_at + c] = T(sg);
                    if (O.center) grads[beta_at + c] = T(sb);
                }
            }
            if (!dx.empty())
                ::strata::detail::host_shaped_for_each<P>(rows, LnRowInputGrad<T>{x.data(), dy.data(), dx.data(), gamma, mean, rstd, C});
        } else {
#if STRATA_HAS_CUDA && defined(__CUDACC__)
            using ::strata::detail::Reduction;
            namespace cr = ::strata::detail::cuda_reduce;
            if (O.scale)
                cr::axis_with<T>(LnLoadGrad<T>{x.data(), dy.data(), nullptr, mean, rstd, C, true}, grads + gamma_at, 1, rows, C, Reduction::Sum);
            if (O.center)
                cr::axis_with<T>(LnLoadGrad<T>{x.data(), dy.data(), nullptr, mean, rstd, C, false}, grads + beta_at, 1, rows, C, Reduction::Sum);
            if (!dx.empty()) {
                double* s1 = stats_.data() + 2 * rows;
                double* s2 = s1 + rows;
                cr::axis_with<double>(LnLoadGrad<T>{x.data(), dy.data(), gamma, mean, rstd, C, false}, s1, rows, C, 1, Reduction::Mean);
                cr::axis_with<double>(LnLoadGrad<T>{x.data(), dy.data(), gamma, mean, rstd, C, true}, s2, rows, C, 1, Reduction::Mean);
                place::for_each_n<P>(rows * C, LnInputGrad<T>{x.data(), dy.data(), dx.data(), gamma, mean, rstd, s1, s2, C});
            }
#else
            static_assert(::strata::detail::dependent_false<P>, "strata::nn::LayerNormalization: this place's passes are compiled by nvcc only");
#endif
        }
    }

    /// The last forward's per-row mean and 1 / sqrt(var + epsilon) (for tests; host places).
    std::vector<double> row_statistics() const {
        std::vector<double> out(std::size_t(2 * rows_));
        if (rows_ > 0)
            copy(TensorView<double, P>(const_cast<double*>(stats_.data()), Shape{2 * rows_}),
                 TensorView<double, place::Host>(out.data(), Shape{2 * rows_}));
        return out;
    }

private:
    // mean [rows], rstd [rows], and on Cuda backward's row sums s1, s2 [rows] each.
    Tensor<double, P> stats_;
    std::int64_t rows_ = 0;
};

}  // namespace detail

}  // namespace strata::nn
