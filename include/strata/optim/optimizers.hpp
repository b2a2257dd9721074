#pragma once
/// \file strata/optim/optimizers.hpp
/// Optimizers with Keras's update formulas and defaults (Keras 3, `keras.optimizers`):
/// SGD (momentum, Nesterov), RMSprop, Adam; and learning-rate schedules.
///
/// They update one flat parameter buffer from one flat gradient buffer in a single pass, so a
/// step's update costs one sweep over the parameters whatever the number of layers.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define STRATA_X86_BUILTINS 1
#else
#define STRATA_X86_BUILTINS 0
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#endif
#include "strata/core/profile.hpp"
#include "strata/tensor/tensor_all.hpp"

namespace strata::optim {

/// lr(step) = initial · rate^(step / decay_steps) (the exponent floored when `staircase`):
/// Keras's ExponentialDecay.
struct ExponentialDecay {
    double initial_learning_rate = 0.01;
    std::int64_t decay_steps = 1000;
    double decay_rate = 0.96;
    bool staircase = false;
    double operator()(std::int64_t step) const {
        STRATA_CHECK(decay_steps > 0, ValueError, "ExponentialDecay: decay_steps must be > 0, got ", decay_steps);
        double e = double(step) / double(decay_steps);
        if (staircase) e = std::floor(e);
        return initial_learning_rate * std::pow(decay_rate, e);
    }
};

/// Piecewise constant: values[i] while step <= boundaries[i] (and values.back() after the last
/// boundary): Keras's PiecewiseConstantDecay, the usual "step" schedule.
struct PiecewiseConstantDecay {
    std::vector<std::int64_t> boundaries;
    std::vector<double> values;
    double operator()(std::int64_t step) const {
        STRATA_CHECK(values.size() == boundaries.size() + 1, ValueError, "PiecewiseConstantDecay: ",
                     boundaries.size(), " boundaries need ", boundaries.size() + 1, " values, got ", values.size());
        for (std::size_t i = 0; i < boundaries.size(); ++i)
            if (step <= boundaries[i]) return values[i];
        return values.back();
    }
};

/// lr(step) = initial · factor^floor(step / step_size): step decay.
struct StepDecay {
    double initial_learning_rate = 0.01;
    double factor = 0.5;
    std::int64_t step_size = 1000;
    double operator()(std::int64_t step) const {
        STRATA_CHECK(step_size > 0, ValueError, "StepDecay: step_size must be > 0, got ", step_size);
        return initial_learning_rate * std::pow(factor, double(step / step_size));
    }
};

/// A learning rate: a constant, a schedule object, or any callable `double(std::int64_t step)`.
/// The step is the optimizer's iteration count before the update (0 for the first).
class LearningRate {
public:
    LearningRate(double constant) : constant_(constant) {}  // NOLINT: implicit, as in Keras
    template <class F, class = std::enable_if_t<std::is_invocable_r_v<double, F, std::int64_t> &&
                                                !std::is_arithmetic_v<std::decay_t<F>>>>
    LearningRate(F schedule) : schedule_(std::move(schedule)) {}  // NOLINT
    double operator()(std::int64_t step) const { return schedule_ ? schedule_(step) : constant_; }
    bool is_constant() const { return !schedule_; }

private:
    double constant_ = 0;
    std::function<double(std::int64_t)> schedule_;
};

/// Stochastic gradient descent, with optional (Nesterov) momentum. Keras defaults.
///   momentum = 0:  w -= lr·g
///   momentum > 0:  v = momentum·v − lr·g;  w += v            (Nesterov: w += momentum·v − lr·g)
struct SGD {
    static constexpr const char* name = "SGD";
    LearningRate learning_rate = 0.01;
    double momentum = 0.0;
    bool nesterov = false;
};

/// RMSprop (Tieleman & Hinton 2012), Keras 3 form and defaults:
///   v = rho·v + (1 − rho)·g²;  (centered: a = rho·a + (1 − rho)·g, denominator v − a²)
///   step = lr·g / sqrt(v + epsilon);  momentum > 0: m = momentum·m + step, w −= m;  else w −= step
struct RMSprop {
    static constexpr const char* name = "RMSprop";
    LearningRate learning_rate = 0.001;
    double rho = 0.9;
    double momentum = 0.0;
    double epsilon = 1e-7;
    bool centered = false;
};

/// Adam (Kingma & Ba 2015), Keras form and defaults:
///   t = iterations + 1;  alpha = lr·sqrt(1 − beta_2^t) / (1 − beta_1^t)
///   m += (g − m)(1 − beta_1);  v += (g² − v)(1 − beta_2);  w −= alpha·m / (sqrt(v) + epsilon)
struct Adam {
    static constexpr const char* name = "Adam";
    LearningRate learning_rate = 0.001;
    double beta_1 = 0.9;
    double beta_2 = 0.999;
    double epsilon = 1e-7;
};

/// Any of the optimizers; `Model::compile` takes one.
using Optimizer = std::variant<RMSprop, Adam, SGD>;

/// An optimizer and its hyper-parameters as text, exactly (%.17g): "Adam(learning_rate=0.001,
/// beta_1=0.9, ...)" (what the processes of a job compare at compile). A schedule reads as its
/// rates at steps 0, 1 and 1000.
inline std::string describe(const optim::LearningRate& lr) {
    char buf[128];
    if (lr.is_constant()) std::snprintf(buf, sizeof buf, "%.17g", lr(0));
    else std::snprintf(buf, sizeof buf, "schedule(0: %.17g, 1: %.17g, 1000: %.17g)", lr(0), lr(1), lr(1000));
    return buf;
}
inline std::string describe(const optim::Optimizer& o) {
    auto num = [](double v) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        return std::string(buf);
    };
    auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
    return std::visit(
        [&](const auto& x) {
            using O = std::decay_t<decltype(x)>;
            std::string s = std::string(O::name) + "(learning_rate=" + describe(x.learning_rate);
            if constexpr (std::is_same_v<O, optim::SGD>)
                s += ", momentum=" + num(x.momentum) + ", nesterov=" + flag(x.nesterov);
            else if constexpr (std::is_same_v<O, optim::RMSprop>)
                s += ", rho=" + num(x.rho) + ", momentum=" + num(x.momentum) + ", epsilon=" + num(x.epsilon) +
                     ", centered=" + flag(x.centered);
            else if constexpr (std::is_same_v<O, optim::Adam>)
                s += ", beta_1=" + num(x.beta_1) + ", beta_2=" + num(x.beta_2) + ", epsilon=" + num(x.epsilon);
            return s + ")";
        },
        o);
}

namespace detail {
template <class T>
struct SgdStep {
    T* w; const T* g; T* v; T lr, momentum; bool nesterov;
    STRATA_HD void operator()(std::int64_t i) const {
        if (!v) { w[i] -= lr * g[i]; return; }
        const T nv = momentum * v[i] - lr * g[i];
        v[i] = nv;
        w[i] += nesterov ? momentum * nv - lr * g[i] : nv;
    }
};
template <class T>
struct RmsStep {
    T* w; const T* g; T* v; T* avg; T* m; T lr, rho, momentum, eps;
    STRATA_HD void operator()(std::int64_t i) const {
        using std::sqrt;
        const T gi = g[i];
        const T vi = rho * v[i] + (T(1) - rho) * gi * gi;
        v[i] = vi;
        T denom = vi;
        if (avg) {
            const T ai = rho * avg[i] + (T(1) - rho) * gi;
            avg[i] = ai;
            denom = vi - ai * ai;
        }
        const T step = lr * gi / sqrt(denom + eps);
        if (m) {
            const T mi = momentum * m[i] + step;
            m[i] = mi;
            w[i] -= mi;
        } else {
            w[i] -= step;
        }
    }
};
template <class T>
struct AdamStep {
    T* w; const T* g; T* m; T* v; T alpha, b1, b2, eps;
    STRATA_HD void operator()(std::int64_t i) const {
        using std::sqrt;
        const T gi = g[i];
        const T mi = m[i] + (gi - m[i]) * (T(1) - b1);
        const T vi = v[i] + (gi * gi - v[i]) * (T(1) - b2);
        m[i] = mi;
        v[i] = vi;
        w[i] -= alpha * mi / (sqrt(vi) + eps);
    }
};

// The host updates, vectorised. std::sqrt keeps errno semantics (GCC's default -fmath-errno),
// which stops GCC from vectorising a loop that calls it, and the per-element functors above
// branch on their optional slots; here the slots are chosen once per block, the loops carry no
// branch, and the square roots of a block go through the SSE/AVX instructions, which round
// exactly as std::sqrt does (IEEE 754). Every value is that of the functors, bit for bit.
// GCC and Clang reach those instructions through their builtins on vector types, which need no
// header (<immintrin.h> alone is 63 000 lines that every program would parse); nvcc's front end
// and other compilers take the intrinsics.
template <class T>
inline void sqrt_block(T* d, std::int64_t n) {
    std::int64_t i = 0;
#if STRATA_X86_BUILTINS && defined(__AVX__)  // (256-bit also where AVX-512 is: GCC 12 warns inside its 512-bit sqrt)
    if constexpr (std::is_same_v<T, float>) {
        typedef float v8 __attribute__((vector_size(32)));
        for (; i + 8 <= n; i += 8) {
            v8 v;
            std::memcpy(&v, d + i, sizeof v);
            v = __builtin_ia32_sqrtps256(v);
            std::memcpy(d + i, &v, sizeof v);
        }
    } else if constexpr (std::is_same_v<T, double>) {
        typedef double v4 __attribute__((vector_size(32)));
        for (; i + 4 <= n; i += 4) {
            v4 v;
            std::memcpy(&v, d + i, sizeof v);
            v = __builtin_ia32_sqrtpd256(v);
            std::memcpy(d + i, &v, sizeof v);
        }
    }
#elif STRATA_X86_BUILTINS && defined(__SSE2__)
    if constexpr (std::is_same_v<T, float>) {
        typedef float v4 __attribute__((vector_size(16)));
        for (; i + 4 <= n; i += 4) {
            v4 v;
            std::memcpy(&v, d + i, sizeof v);
            v = __builtin_ia32_sqrtps(v);
            std::memcpy(d + i, &v, sizeof v);
        }
    } else if constexpr (std::is_same_v<T, double>) {
        typedef double v2 __attribute__((vector_size(16)));
        for (; i + 2 <= n; i += 2) {
            v2 v;
            std::memcpy(&v, d + i, sizeof v);
            v = __builtin_ia32_sqrtpd(v);
            std::memcpy(d + i, &v, sizeof v);
        }
    }
#elif defined(__AVX__)
    if constexpr (std::is_same_v<T, float>)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_sqrt_ps(_mm256_loadu_ps(d + i)));
    else if constexpr (std::is_same_v<T, double>)
        for (; i + 4 <= n; i += 4) _mm256_storeu_pd(d + i, _mm256_sqrt_pd(_mm256_loadu_pd(d + i)));
#elif defined(__SSE2__)
    if constexpr (std::is_same_v<T, float>)
        for (; i + 4 <= n; i += 4) _mm_storeu_ps(d + i, _mm_sqrt_ps(_mm_loadu_ps(d + i)));
    else if constexpr (std::is_same_v<T, double>)
        for (; i + 2 <= n; i += 2) _mm_storeu_pd(d + i, _mm_sqrt_pd(_mm_loadu_pd(d + i)));
#endif
    for (; i < n; ++i) d[i] = std::sqrt(d[i]);
}

inline constexpr std::int64_t update_block = 1024;

// Runs body(first, count) over blocks of update_block elements, on the calling thread's team
// when there are enough blocks to share.
template <class Body>
void for_update_blocks(std::int64_t count, Body&& body) {
    const std::int64_t blocks = (count + update_block - 1) / update_block;
#if STRATA_HAS_OPENMP
#pragma omp parallel for schedule(static) if (blocks >= 16)
#endif
    for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t i0 = b * update_block;
        body(i0, std::min(update_block, count - i0));
    }
}

template <class T>
void rms_host(const RmsStep<T>& s, std::int64_t count) {
    for_update_blocks(count, [&](std::int64_t i0, std::int64_t nb) {
        T d[update_block];
        T* const w = s.w + i0;
        T* const v = s.v + i0;
        const T* const g = s.g + i0;
        const T lr = s.lr, rho = s.rho, momentum = s.momentum, eps = s.eps;
        if (s.avg) {
            T* const avg = s.avg + i0;
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) {
                const T gi = g[j];
                const T vi = rho * v[j] + (T(1) - rho) * gi * gi;
                v[j] = vi;
                const T ai = rho * avg[j] + (T(1) - rho) * gi;
                avg[j] = ai;
                const T denom = vi - ai * ai;
                d[j] = denom + eps;
            }
        } else {
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) {
                const T gi = g[j];
                const T vi = rho * v[j] + (T(1) - rho) * gi * gi;
                v[j] = vi;
                d[j] = vi + eps;
            }
        }
        sqrt_block(d, nb);
        if (s.m) {
            T* const m = s.m + i0;
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) {
                const T step = lr * g[j] / d[j];
                const T mi = momentum * m[j] + step;
                m[j] = mi;
                w[j] -= mi;
            }
        } else {
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) w[j] -= lr * g[j] / d[j];
        }
    });
}

template <class T>
void adam_host(const AdamStep<T>& s, std::int64_t count) {
    for_update_blocks(count, [&](std::int64_t i0, std::int64_t nb) {
        T d[update_block];
        T* const w = s.w + i0;
        T* const m = s.m + i0;
        T* const v = s.v + i0;
        const T* const g = s.g + i0;
        const T alpha = s.alpha, b1 = s.b1, b2 = s.b2, eps = s.eps;
#pragma omp simd
        for (std::int64_t j = 0; j < nb; ++j) {
            const T gi = g[j];
            const T mi = m[j] + (gi - m[j]) * (T(1) - b1);
            const T vi = v[j] + (gi * gi - v[j]) * (T(1) - b2);
            m[j] = mi;
            v[j] = vi;
            d[j] = vi;
        }
        sqrt_block(d, nb);
#pragma omp simd
        for (std::int64_t j = 0; j < nb; ++j) w[j] -= alpha * m[j] / (d[j] + eps);
    });
}

template <class T>
void sgd_host(const SgdStep<T>& s, std::int64_t count) {
    for_update_blocks(count, [&](std::int64_t i0, std::int64_t nb) {
        T* const w = s.w + i0;
        const T* const g = s.g + i0;
        const T lr = s.lr, momentum = s.momentum;
        if (!s.v) {
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) w[j] -= lr * g[j];
            return;
        }
        T* const v = s.v + i0;
        if (s.nesterov) {
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) {
                const T nv = momentum * v[j] - lr * g[j];
                v[j] = nv;
                w[j] += momentum * nv - lr * g[j];
            }
        } else {
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) {
                const T nv = momentum * v[j] - lr * g[j];
                v[j] = nv;
                w[j] += nv;
            }
        }
    });
}
}  // namespace detail

/// An optimizer's configuration plus its state (slot buffers and the iteration count) for a
/// flat parameter buffer of `size` elements on place P.
template <class T, class P>
class OptimizerState {
public:
    OptimizerState() = default;
    OptimizerState(Optimizer config, std::int64_t size);

    /// One update: `params -= f(grads)`; the learning rate is the schedule's value at the
    /// current iteration count, which then advances.
    void apply(T* params, const T* grads) {
        apply_range(params, grads, 0, size_);
        advance();
    }

    /// The update of elements [first, first + count) only, without advancing the iteration
    /// count: replicas that each update a slice of one central copy call this, then one of
    /// them calls advance().
    void apply_range(T* params, const T* grads, std::int64_t first, std::int64_t count);
    /// Counts one finished update.
    void advance() { ++iterations_; }
    std::int64_t size() const { return size_; }

    double current_learning_rate() const {
        return std::visit([&](const auto& o) { return o.learning_rate(iterations_); }, config_);
    }
    std::int64_t iterations() const { return iterations_; }
    void set_iterations(std::int64_t it) { iterations_ = it; }
    const Optimizer& config() const { return config_; }
    const char* name() const { return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::name; }, config_); }
    /// The state buffers, for checkpoints: ("velocity", tensor), ...
    std::vector<std::pair<std::string, Tensor<T, P>>>& slots() { return slots_; }

    /// Replaces the learning rate (LearningRateScheduler callbacks use this).
    void set_learning_rate(LearningRate lr);

private:
    void add_slot(const char* name);
    T* slot(const char* name) {
        for (auto& [n, t] : slots_)
            if (n == name) return t.data();
        return nullptr;
    }

    Optimizer config_{};
    std::int64_t size_ = 0;
    std::int64_t iterations_ = 0;
    std::vector<std::pair<std::string, Tensor<T, P>>> slots_;
};

// The members with the optimizers' code are defined out of the class, not inline, so that the
// compiled part's instantiations below are the only ones: GCC instantiates inline members for
// inlining even where an `extern template` declares them.
template <class T, class P>
OptimizerState<T, P>::OptimizerState(Optimizer config, std::int64_t size) : config_(std::move(config)), size_(size) {
    std::visit(
        [&](const auto& o) {
            using O = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<O, SGD>) {
                STRATA_CHECK(o.momentum >= 0 && o.momentum <= 1, ValueError, "SGD: momentum must be in [0, 1], got ", o.momentum);
                if (o.momentum > 0) add_slot("momentum");
            } else if constexpr (std::is_same_v<O, RMSprop>) {
                STRATA_CHECK(o.rho >= 0 && o.rho <= 1, ValueError, "RMSprop: rho must be in [0, 1], got ", o.rho);
                add_slot("velocity");
                if (o.centered) add_slot("average_gradient");
                if (o.momentum > 0) add_slot("momentum");
            } else {
                STRATA_CHECK(o.beta_1 >= 0 && o.beta_1 < 1 && o.beta_2 >= 0 && o.beta_2 < 1, ValueError,
                             "Adam: beta_1 and beta_2 must be in [0, 1), got ", o.beta_1, " and ", o.beta_2);
                add_slot("momentum");
                add_slot("velocity");
            }
        },
        config_);
}

template <class T, class P>
void OptimizerState<T, P>::apply_range(T* params, const T* grads, std::int64_t first, std::int64_t count) {
    STRATA_CHECK(first >= 0 && count >= 0 && first + count <= size_, ShapeError, "optimizer: range [", first, ", ",
                 first + count, ") is outside the ", size_, " parameters");
    if (count == 0) return;
    STRATA_PROFILE_MODEL("optimizer");
    const double lr = std::visit([&](const auto& o) { return o.learning_rate(iterations_); }, config_);
    STRATA_CHECK(std::isfinite(lr) && lr >= 0, ValueError, "optimizer: the learning rate at step ", iterations_,
                 " is ", lr, "; it must be finite and >= 0");
    T* w = params + first;
    const T* g = grads + first;
    auto at = [&](const char* name) { T* p = slot(name); return p ? p + first : nullptr; };
    std::visit(
        [&](const auto& o) {
            using O = std::decay_t<decltype(o)>;
            // The device runs the functors, one element per thread; the host its blocked loops.
            constexpr bool host = !std::is_same_v<P, place::Cuda>;
            if constexpr (std::is_same_v<O, SGD>) {
                const detail::SgdStep<T> f{w, g, at("momentum"), T(lr), T(o.momentum), o.nesterov};
                if constexpr (host) detail::sgd_host(f, count);
                else place::for_each_n<P>(count, f);
            } else if constexpr (std::is_same_v<O, RMSprop>) {
                const detail::RmsStep<T> f{w, g, at("velocity"), at("average_gradient"), at("momentum"),
                                           T(lr), T(o.rho), T(o.momentum), T(o.epsilon)};
                if constexpr (host) detail::rms_host(f, count);
                else place::for_each_n<P>(count, f);
            } else {
                const double t = double(iterations_ + 1);
                const double alpha = lr * std::sqrt(1 - std::pow(o.beta_2, t)) / (1 - std::pow(o.beta_1, t));
                const detail::AdamStep<T> f{w, g, at("momentum"), at("velocity"), T(alpha), T(o.beta_1), T(o.beta_2),
                                            T(o.epsilon)};
                if constexpr (host) detail::adam_host(f, count);
                else place::for_each_n<P>(count, f);
            }
        },
        config_);
}

template <class T, class P>
void OptimizerState<T, P>::set_learning_rate(LearningRate lr) {
    std::visit([&](auto& o) { o.learning_rate = std::move(lr); }, config_);
}

template <class T, class P>
void OptimizerState<T, P>::add_slot(const char* name) {
    Tensor<T, P> t(Shape{size_});
    fill(t.view(), T(0));
    slots_.emplace_back(name, std::move(t));
}

#if STRATA_INSTANCES
// The host's optimizer states (their configuration checks, slots and update loops) are compiled
// once in the compiled part.
STRATA_TEMPLATE class OptimizerState<float, place::Host>;
STRATA_TEMPLATE class OptimizerState<double, place::Host>;
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE class OptimizerState<float, place::Cuda>;
STRATA_CUDA_TEMPLATE class OptimizerState<double, place::Cuda>;
#endif

}  // namespace strata::optim
