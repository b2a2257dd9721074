#pragma once
/// \file strata/optim/optimizers.hpp
/// Optimizers with Keras's update formulas and defaults (Keras 3, `keras.optimizers`):
/// SGD (momentum, Nesterov), RMSprop, Adam, AdamW; gradient clipping by the global norm
/// (`global_clipnorm`); the moving averages of non-trainable ranges (batch normalization's
/// moving statistics); and learning-rate schedules.
///
/// They update one flat parameter buffer from one flat gradient buffer in a single pass, so a
/// step's update costs one sweep over the parameters whatever the number of layers.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numbers>
#include <memory>
#include <optional>
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
#include "strata/detail/dependent_false.hpp"
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

/// Cosine decay with an optional linear warmup: Keras's CosineDecay, same arguments, defaults
/// and formula.
///   no warmup_target:  s = min(step, decay_steps);  lr = initial · decayed(s)
///   warmup_target:     s = min(step, warmup_steps + decay_steps);
///                      s < warmup_steps:  lr = (warmup_target − initial) · s / warmup_steps + initial
///                      otherwise:         lr = warmup_target · decayed(s − warmup_steps)
///   decayed(s) = (1 − alpha) · 0.5 · (1 + cos(π · s / decay_steps)) + alpha
/// So the rate ends at alpha times the rate the decay starts from (warmup_target, or initial
/// without one) and stays there.
struct CosineDecay {
    double initial_learning_rate = 0.01;
    std::int64_t decay_steps = 1000;
    double alpha = 0.0;
    std::optional<double> warmup_target = std::nullopt;  ///< none (Keras's None): no warmup
    std::int64_t warmup_steps = 0;
    double operator()(std::int64_t step) const {
        STRATA_CHECK(decay_steps > 0, ValueError, "CosineDecay: decay_steps must be > 0, got ", decay_steps);
        STRATA_CHECK(warmup_steps >= 0, ValueError, "CosineDecay: warmup_steps must be >= 0, got ", warmup_steps);
        const double ds = double(decay_steps);
        auto decayed = [&](double s, double from) {
            const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * (s / ds)));
            return from * ((1 - alpha) * cosine + alpha);
        };
        if (!warmup_target) return decayed(std::min(double(step), ds), initial_learning_rate);
        const double ws = double(warmup_steps);
        const double s = std::min(double(step), ds + ws);
        if (s < ws) return (*warmup_target - initial_learning_rate) * (s / ws) + initial_learning_rate;
        return decayed(s - ws, *warmup_target);
    }
    /// "CosineDecay(initial_learning_rate=0.1, decay_steps=1000, alpha=0, warmup_target=none,
    /// warmup_steps=0)", every number exact (%.17g).
    std::string describe() const {
        char buf[256];
        char target[40] = "none";
        if (warmup_target) std::snprintf(target, sizeof target, "%.17g", *warmup_target);
        std::snprintf(buf, sizeof buf,
                      "CosineDecay(initial_learning_rate=%.17g, decay_steps=%lld, alpha=%.17g, warmup_target=%s, warmup_steps=%lld)",
                      initial_learning_rate, static_cast<long long>(decay_steps), alpha, target,
                      static_cast<long long>(warmup_steps));
        return buf;
    }
};

/// A learning rate: a constant, a schedule object, or any callable `double(std::int64_t step)`.
/// The step is the optimizer's iteration count before the update (0 for the first).
/// A schedule with a `describe()` member (CosineDecay) keeps that text for optim::describe.
class LearningRate {
public:
    LearningRate(double constant) : constant_(constant) {}  // NOLINT: implicit, as in Keras
    template <class F, class = std::enable_if_t<std::is_invocable_r_v<double, F, std::int64_t> &&
                                                !std::is_arithmetic_v<std::decay_t<F>>>>
    LearningRate(F schedule) {  // NOLINT
        if constexpr (requires(const F& f) { { f.describe() } -> std::convertible_to<std::string>; })
            description_ = schedule.describe();
        schedule_ = std::move(schedule);
    }
    double operator()(std::int64_t step) const { return schedule_ ? schedule_(step) : constant_; }
    bool is_constant() const { return !schedule_; }
    /// The schedule's own description; empty for a constant or a schedule without one.
    const std::string& description() const { return description_; }

private:
    double constant_ = 0;
    std::function<double(std::int64_t)> schedule_;
    std::string description_;
};

/// Every optimizer's `global_clipnorm` (Keras's argument of the same name; 0 is Keras's None,
/// off): before the update the gradient is scaled by c / max(‖g‖, c), c = global_clipnorm, with
/// ‖g‖ the L2 norm of the whole gradient over the trainable elements (moving-average ranges
/// excluded), summed in double. A norm at or below c leaves the gradient as it is; a norm that
/// is not finite makes every update NaN (as Keras's scale). The gradient the optimizer gets is
/// the reduced one in every strategy, so N replicas clip as one device does.

/// Dynamic loss scaling (the float16 policy's, precision::MixedFloat16; Keras'
/// LossScaleOptimizer and PyTorch's GradScaler follow the same rule). The loss is multiplied by
/// the scale S before backward, so that gradients too small for float16 (below 2^-24) survive
/// the layers; the optimizer divides the reduced gradient by S before using it. A step whose
/// gradient holds an inf or a NaN anywhere (the whole reduced gradient's sum of squares is not
/// finite) is skipped: no variable, slot or iteration count moves, and S halves. After
/// `growth_steps` applied steps in a row, S doubles. Every replica and process sees the same
/// reduced gradient, so every copy of the state takes the same decision without a message.
/// A scale that would fall below `floor` is an error naming the step (training on would be
/// training on garbage). Model::compile turns it on under precision::MixedFloat16.
struct LossScale {
    bool enabled = false;
    double initial_scale = 32768;     ///< 2^15, Keras' LossScaleOptimizer (PyTorch's GradScaler: 2^16)
    std::int64_t growth_steps = 2000;  ///< both frameworks' default
    double floor = 1;                 ///< a scale below this stops training with an error
    /// (offset, "layer/variable") of each variable in the flat buffer, for the floor's error
    /// to name the first non-finite gradient's layer; Model::compile fills it.
    std::shared_ptr<const std::vector<std::pair<std::int64_t, std::string>>> names{};
};

/// Where a dynamic loss scale stands (checkpoints and backups keep it; History logs it).
struct LossScaleState {
    double scale = 1;
    std::int64_t good_steps = 0;     ///< applied steps since the scale last changed
    std::int64_t skipped_steps = 0;  ///< steps skipped for a non-finite gradient, in all
    bool last_skipped = false;       ///< whether the last step was skipped
};

/// Stochastic gradient descent, with optional (Nesterov) momentum. Keras defaults.
///   momentum = 0:  w -= lr·g
///   momentum > 0:  v = momentum·v − lr·g;  w += v            (Nesterov: w += momentum·v − lr·g)
struct SGD {
    static constexpr const char* name = "SGD";
    LearningRate learning_rate = 0.01;
    double momentum = 0.0;
    bool nesterov = false;
    double global_clipnorm = 0;  ///< 0: off (see above)
    LossScale loss_scale{};      ///< off unless the float16 policy turns it on
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
    double global_clipnorm = 0;  ///< 0: off (see SGD)
    LossScale loss_scale{};      ///< off unless the float16 policy turns it on (see SGD)
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
    double global_clipnorm = 0;  ///< 0: off (see SGD)
    LossScale loss_scale{};      ///< off unless the float16 policy turns it on (see SGD)
};

/// Adam with decoupled weight decay (Loshchilov & Hutter 2019), Keras 3's AdamW and defaults:
/// the decay comes first, with the step's learning rate, then Adam's update:
///   w = w − w·weight_decay·lr;  then Adam (above) on w
struct AdamW {
    static constexpr const char* name = "AdamW";
    LearningRate learning_rate = 0.001;
    double weight_decay = 0.004;
    double beta_1 = 0.9;
    double beta_2 = 0.999;
    double epsilon = 1e-7;
    double global_clipnorm = 0;  ///< 0: off (see SGD)
    LossScale loss_scale{};      ///< off unless the float16 policy turns it on (see SGD)
};

/// Any of the optimizers; `Model::compile` takes one. (New ones go at the end: the indices of
/// the others stay.)
using Optimizer = std::variant<RMSprop, Adam, SGD, AdamW>;

/// The optimizer's global_clipnorm (0: off).
inline double global_clipnorm_of(const Optimizer& o) {
    return std::visit([](const auto& x) { return x.global_clipnorm; }, o);
}

/// A range of the flat buffer that is not trained: a moving average. Its "gradient" slot holds
/// the batch's statistic s; the update is w = momentum·w + (1 − momentum)·s (Keras'
/// BatchNormalization moving statistics). No learning rate, slot, weight decay or clipping
/// applies to it, and it is not part of the global_clipnorm norm.
struct MovingAverageRange {
    std::int64_t first = 0, count = 0;
    double momentum = 0.99;
};

/// An optimizer and its hyper-parameters as text, exactly (%.17g): "Adam(learning_rate=0.001,
/// beta_1=0.9, ...)" (what the processes of a job compare at compile); global_clipnorm appears
/// when it is set. A schedule reads as its own description where it has one (CosineDecay), else
/// as its rates at steps 0, 1 and 1000.
inline std::string describe(const optim::LearningRate& lr) {
    if (!lr.description().empty()) return lr.description();
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
            else if constexpr (std::is_same_v<O, optim::AdamW>)
                s += ", weight_decay=" + num(x.weight_decay) + ", beta_1=" + num(x.beta_1) + ", beta_2=" + num(x.beta_2) +
                     ", epsilon=" + num(x.epsilon);
            else
                static_assert(strata::detail::dependent_false<O>, "describe: an optimizer of the variant is not described");
            if (x.global_clipnorm != 0) s += ", global_clipnorm=" + num(x.global_clipnorm);
            if (x.loss_scale.enabled)
                s += ", loss_scale=(initial=" + num(x.loss_scale.initial_scale) +
                     ", growth_steps=" + std::to_string(x.loss_scale.growth_steps) + ", floor=" + num(x.loss_scale.floor) + ")";
            return s + ")";
        },
        o);
}

namespace detail {
// The per-element updates (the device runs them, one element per thread). `clip`, where not
// null, points at the step's global_clipnorm scale (double, in the place's memory): the
// gradient is read as g·scale. Members after the first ones have defaults, so the older
// aggregate forms still initialise them.
template <class T>
STRATA_HD inline T clipped(const T* g, std::int64_t i, const double* clip) {
    return clip ? g[i] * T(*clip) : g[i];
}
template <class T>
struct SgdStep {
    T* w; const T* g; T* v; T lr, momentum; bool nesterov;
    const double* clip = nullptr;
    STRATA_HD void operator()(std::int64_t i) const {
        const T gi = clipped(g, i, clip);
        if (!v) { w[i] -= lr * gi; return; }
        const T nv = momentum * v[i] - lr * gi;
        v[i] = nv;
        w[i] += nesterov ? momentum * nv - lr * gi : nv;
    }
};
template <class T>
struct RmsStep {
    T* w; const T* g; T* v; T* avg; T* m; T lr, rho, momentum, eps;
    const double* clip = nullptr;
    STRATA_HD void operator()(std::int64_t i) const {
        using std::sqrt;
        const T gi = clipped(g, i, clip);
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
/// Adam; AdamW where `wd` is not 0: w = w − w·wd·lr first (Keras's order of operations).
template <class T>
struct AdamStep {
    T* w; const T* g; T* m; T* v; T alpha, b1, b2, eps;
    const double* clip = nullptr;
    T wd = 0, lr = 0;
    STRATA_HD void operator()(std::int64_t i) const {
        using std::sqrt;
        const T gi = clipped(g, i, clip);
        const T mi = m[i] + (gi - m[i]) * (T(1) - b1);
        const T vi = v[i] + (gi * gi - v[i]) * (T(1) - b2);
        m[i] = mi;
        v[i] = vi;
        T wi = w[i];
        if (wd != T(0)) wi = wi - wi * wd * lr;
        w[i] = wi - alpha * mi / (sqrt(vi) + eps);
    }
};
/// A moving-average range: w = w·momentum + s·(1 − momentum), s the statistic in the
/// gradient's slot (`rest` = T(1 − momentum), computed in double as Keras's Python float).
template <class T>
struct MovingAverageStep {
    T* w; const T* s; T momentum, rest;
    STRATA_HD void operator()(std::int64_t i) const { w[i] = w[i] * momentum + s[i] * rest; }
};

/// The global_clipnorm scale from the sum of squares: c / max(sqrt(sum), c), NaN when the norm
/// is not finite (as Keras's `scale + (norm − norm)`); exactly 1 at or below c.
STRATA_HD inline double clip_scale(double sum_of_squares, double c) {
    using std::sqrt;
    const double n = sqrt(sum_of_squares);
    return n <= c ? 1.0 : (n - n) + c / n;
}
/// On the device: buf[0, parts) holds the trainable ranges' sums of squares; writes their sum
/// (in order) to buf[parts] and the scale to buf[parts + 1]. One thread.
struct ClipScaleStep {
    double* buf; std::int64_t parts; double c;
    STRATA_HD void operator()(std::int64_t) const {
        double sum = 0;
        for (std::int64_t j = 0; j < parts; ++j) sum += buf[j];
        buf[parts] = sum;
        buf[parts + 1] = clip_scale(sum, c);
    }
};
#if STRATA_HAS_CUDA
/// Loads element i of x as its square in double for the device's sum (cuda_reduce::axis_with);
/// __dmul_rn so that nvcc does not fuse it with the sum's addition.
template <class T>
struct SquaredLoad {
    const T* __restrict__ x;
    __device__ double operator()(std::int64_t i) const {
        const double v = double(x[i]);
        return __dmul_rn(v, v);
    }
};
#endif

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

// The gradient of a block as the update reads it: g itself, or, with global_clipnorm, g·scale
// in the block's buffer `gs` (so that the loops below are the same in both cases, and without
// clipping nothing is added to them).
template <class T>
inline const T* block_gradient(const T* g, const double* clip, std::int64_t nb, T* gs) {
    if (!clip) return g;
    const T c = T(*clip);
#pragma omp simd
    for (std::int64_t j = 0; j < nb; ++j) gs[j] = g[j] * c;
    return gs;
}

template <class T>
void rms_host(const RmsStep<T>& s, std::int64_t count) {
    for_update_blocks(count, [&](std::int64_t i0, std::int64_t nb) {
        T d[update_block];
        T gs[update_block];
        T* const w = s.w + i0;
        T* const v = s.v + i0;
        const T* const g = block_gradient(s.g + i0, s.clip, nb, gs);
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
        T gs[update_block];
        T* const w = s.w + i0;
        T* const m = s.m + i0;
        T* const v = s.v + i0;
        const T* const g = block_gradient(s.g + i0, s.clip, nb, gs);
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
        if (s.wd != T(0)) {  // AdamW: the decay first, then Adam's step, as the functor
            const T wd = s.wd, lr = s.lr;
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) {
                const T wi = w[j] - w[j] * wd * lr;
                w[j] = wi - alpha * m[j] / (d[j] + eps);
            }
        } else {
#pragma omp simd
            for (std::int64_t j = 0; j < nb; ++j) w[j] -= alpha * m[j] / (d[j] + eps);
        }
    });
}

template <class T>
void sgd_host(const SgdStep<T>& s, std::int64_t count) {
    for_update_blocks(count, [&](std::int64_t i0, std::int64_t nb) {
        T gs[update_block];
        T* const w = s.w + i0;
        const T* const g = block_gradient(s.g + i0, s.clip, nb, gs);
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

template <class T>
void moving_average_host(const MovingAverageStep<T>& s, std::int64_t count) {
    for_update_blocks(count, [&](std::int64_t i0, std::int64_t nb) {
        T* const w = s.w + i0;
        const T* const st = s.s + i0;
        const T momentum = s.momentum, rest = s.rest;
#pragma omp simd
        for (std::int64_t j = 0; j < nb; ++j) w[j] = w[j] * momentum + st[j] * rest;
    });
}

struct NormScratchTag {};
inline constexpr std::int64_t norm_block = 16384;
/// The sum of g[i]² over the ranges (first, count), in double: each range in fixed blocks of
/// norm_block elements with eight accumulators, the blocks' sums then added in order, so the
/// result depends on the ranges only, never on the thread count.
template <class T>
double squared_norm_host(const T* g, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
    double total = 0;
    for (const auto& [first, count] : ranges) {
        const std::int64_t blocks = (count + norm_block - 1) / norm_block;
        double* const partial = strata::detail::scratch<double, place::Host, NormScratchTag>(blocks);
        const T* const x = g + first;
#if STRATA_HAS_OPENMP
#pragma omp parallel for schedule(static) if (blocks >= 16)
#endif
        for (std::int64_t b = 0; b < blocks; ++b) {
            const std::int64_t lo = b * norm_block, hi = std::min(lo + norm_block, count);
            double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            std::int64_t i = lo;
            for (; i + 8 <= hi; i += 8)
                for (int k = 0; k < 8; ++k) {
                    const double v = double(x[i + k]);
                    a[k] += v * v;
                }
            for (; i < hi; ++i) {
                const double v = double(x[i]);
                a[0] += v * v;
            }
            partial[b] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
        for (std::int64_t b = 0; b < blocks; ++b) total += partial[b];
    }
    return total;
}
}  // namespace detail

/// An optimizer's configuration plus its state (slot buffers and the iteration count) for a
/// flat parameter buffer of `size` elements on place P.
template <class T, class P>
class OptimizerState {
public:
    OptimizerState() = default;
    /// `moving`: the ranges of the buffer that are moving averages, not trained (batch
    /// normalization's moving statistics; see MovingAverageRange): sorted, disjoint, inside
    /// [0, size) (empty ones are dropped), each momentum in [0, 1]; ValueError otherwise, as for
    /// a hyper-parameter out of its domain. The slots keep `size` elements; those of the moving
    /// ranges are not used.
    OptimizerState(Optimizer config, std::int64_t size, std::vector<MovingAverageRange> moving = {});

    /// One update: `params -= f(grads)`; the learning rate is the schedule's value at the
    /// current iteration count, which then advances. With global_clipnorm the norm is that of
    /// the whole `grads` (prepare_step, then apply_range over everything).
    /// With a loss scale (LossScale::enabled), a step whose gradient is not finite is skipped
    /// here: nothing moves but the scale (see LossScale).
    void apply(T* params, const T* grads) {
        prepare_step(grads);
        apply_range(params, grads, 0, size_);
        advance();
    }

    /// What a step needs from the whole gradient before any part of it is applied: with
    /// global_clipnorm, the norm of `grads` (all `size` elements but the moving ranges) and its
    /// scale, kept for this iteration; nothing without. The gradient is not written. On a device
    /// place the norm is computed there, queued on this thread's stream (the host does not wait).
    void prepare_step(const T* grads);
    /// Sharded states (each holding a part of the model's variables): the scale from the sum of
    /// squares of the whole model's gradient, summed by the caller over the parts'
    /// squared_gradient_norm, in place of prepare_step.
    void prepare_step_from_squared_norm(double sum_of_squares);
    /// The sum of squares, in double, of `grads` over this state's trainable elements (the moving
    /// ranges left out). Waits for the device on a device place.
    double squared_gradient_norm(const T* grads);
    /// Whether a step needs prepare_step before apply_range (global_clipnorm is set, or a loss
    /// scale: both read the whole gradient first).
    bool clips_gradients() const { return clipnorm_ > 0 || scaling_; }
    /// Whether this state divides gradients by a dynamic loss scale (LossScale::enabled).
    bool scales_loss() const { return scaling_; }
    /// The loss scale and its counters (scale 1 and zeros without one).
    const LossScaleState& loss_scale_state() const { return scale_; }
    /// Restores them (checkpoints, backups): the resumed run goes on with the same scale.
    void set_loss_scale_state(const LossScaleState& s);
    /// Whether the step prepared last is skipped (its gradient is not finite; loss scale only).
    bool skips_step() const { return skip_ && prepared_for_ == iterations_; }

    /// The update of elements [first, first + count) only, without advancing the iteration
    /// count: replicas that each update a slice of one central copy call this, then one of
    /// them calls advance(). With global_clipnorm, prepare_step over the whole gradient must
    /// have run for this iteration first (ValueError otherwise). Elements of the moving ranges
    /// get the moving-average update, all others the optimizer's.
    void apply_range(T* params, const T* grads, std::int64_t first, std::int64_t count);
    /// Counts one finished update; after a skipped step, counts the skip instead (the
    /// iteration count, and so the learning-rate schedule and Adam's bias correction, count
    /// applied updates only).
    void advance();
    std::int64_t size() const { return size_; }
    const std::vector<MovingAverageRange>& moving_ranges() const { return moving_; }

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
    // The optimizer's update of [first, first + count), none of it in a moving range.
    void update(T* params, const T* grads, std::int64_t first, std::int64_t count, double lr, const double* clip);
    // Queues, on a device place, the trainable ranges' sums of squares into buf[0, parts), their
    // sum into buf[parts] and the scale for clip norm c into buf[parts + 1].
    void queue_squared_norm(const T* grads, double* buf, double c);
    // Host-side: stores the sum of squares and its scale for this step.
    void set_clip_sum(double sum_of_squares);
    // The moving-average update of [first, first + count), inside one moving range.
    void moving_average(T* params, const T* stats, std::int64_t first, std::int64_t count, double momentum);

    Optimizer config_{};
    std::int64_t size_ = 0;
    std::int64_t iterations_ = 0;
    std::vector<std::pair<std::string, Tensor<T, P>>> slots_;
    std::vector<MovingAverageRange> moving_;
    std::vector<std::pair<std::int64_t, std::int64_t>> trainable_;  // (first, count): the rest of [0, size)
    double clipnorm_ = 0;
    // With global_clipnorm: [0, parts) the trainable ranges' sums of squares (device places),
    // [parts] their sum, [parts + 1] the step's scale; parts = trainable_.size().
    Tensor<double, P> clip_;
    std::int64_t prepared_for_ = -1;  // the iteration prepare_step ran for
    // Dynamic loss scale (LossScale): on, its settings, where it stands, this step's skip.
    bool scaling_ = false;
    LossScale scale_config_{};
    LossScaleState scale_{};
    bool skip_ = false;
    // What prepare_step decided from the whole gradient's sum of squares (clip and/or scale).
    void set_step_sum(double sum_of_squares, const T* grads);
    // The step is skipped: halve the scale, or stop at its floor (naming `grads`' first
    // non-finite element where the caller has the gradient).
    void skip_nonfinite(const T* grads);
};

// The members with the optimizers' code are defined out of the class, not inline, so that the
// compiled part's instantiations below are the only ones: GCC instantiates inline members for
// inlining even where an `extern template` declares them.
template <class T, class P>
OptimizerState<T, P>::OptimizerState(Optimizer config, std::int64_t size, std::vector<MovingAverageRange> moving)
    : config_(std::move(config)), size_(size) {
    STRATA_CHECK(size >= 0, ValueError, "optimizer: the parameter count must be >= 0, got ", size);
    auto check_adam = [](const char* name, double b1, double b2) {
        STRATA_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, ValueError, name,
                     ": beta_1 and beta_2 must be in [0, 1), got ", b1, " and ", b2);
    };
    std::visit(
        [&](const auto& o) {
            using O = std::decay_t<decltype(o)>;
            STRATA_CHECK(std::isfinite(o.global_clipnorm) && o.global_clipnorm >= 0, ValueError, O::name,
                         ": global_clipnorm must be finite and >= 0 (0: off), got ", o.global_clipnorm);
            clipnorm_ = o.global_clipnorm;
            if constexpr (std::is_same_v<O, SGD>) {
                STRATA_CHECK(o.momentum >= 0 && o.momentum <= 1, ValueError, "SGD: momentum must be in [0, 1], got ", o.momentum);
                if (o.momentum > 0) add_slot("momentum");
            } else if constexpr (std::is_same_v<O, RMSprop>) {
                STRATA_CHECK(o.rho >= 0 && o.rho <= 1, ValueError, "RMSprop: rho must be in [0, 1], got ", o.rho);
                add_slot("velocity");
                if (o.centered) add_slot("average_gradient");
                if (o.momentum > 0) add_slot("momentum");
            } else if constexpr (std::is_same_v<O, Adam>) {
                check_adam("Adam", o.beta_1, o.beta_2);
                add_slot("momentum");
                add_slot("velocity");
            } else if constexpr (std::is_same_v<O, AdamW>) {
                check_adam("AdamW", o.beta_1, o.beta_2);
                STRATA_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, ValueError,
                             "AdamW: weight_decay must be finite and >= 0, got ", o.weight_decay);
                add_slot("momentum");
                add_slot("velocity");
            } else {
                static_assert(strata::detail::dependent_false<O>, "OptimizerState: an optimizer of the variant is not handled");
            }
        },
        config_);
    std::int64_t end = 0;
    for (std::size_t i = 0; i < moving.size(); ++i) {
        const MovingAverageRange& r = moving[i];
        STRATA_CHECK(r.first >= 0 && r.count >= 0 && r.first <= size && r.count <= size - r.first, ValueError,
                     "optimizer: MovingAverageRange ", i, " (first ", r.first, ", count ", r.count, ") is not inside the ",
                     size, " parameters");
        STRATA_CHECK(r.first >= end, ValueError, "optimizer: MovingAverageRange ", i, " [", r.first, ", ", r.first + r.count,
                     ") starts before the end of the one before it (", end, "): the ranges must be sorted and disjoint");
        STRATA_CHECK(std::isfinite(r.momentum) && r.momentum >= 0 && r.momentum <= 1, ValueError,
                     "optimizer: MovingAverageRange ", i, ": momentum must be in [0, 1], got ", r.momentum);
        if (r.count == 0) continue;
        if (r.first > end) trainable_.emplace_back(end, r.first - end);
        moving_.push_back(r);
        end = r.first + r.count;
    }
    if (size > end) trainable_.emplace_back(end, size - end);
    scale_config_ = std::visit([](const auto& o) { return o.loss_scale; }, config_);
    scaling_ = scale_config_.enabled;
    if (scaling_) {
        const LossScale& c = scale_config_;
        STRATA_CHECK(std::isfinite(c.initial_scale) && c.initial_scale > 0 && std::isfinite(c.floor) && c.floor > 0 &&
                         c.floor <= c.initial_scale,
                     ValueError, "optimizer: the loss scale needs 0 < floor <= initial_scale, both finite; got floor ", c.floor,
                     " and initial_scale ", c.initial_scale);
        STRATA_CHECK(c.growth_steps >= 1, ValueError, "optimizer: the loss scale's growth_steps must be >= 1, got ",
                     c.growth_steps);
        scale_.scale = c.initial_scale;
    }
    if (clipnorm_ > 0 || scaling_) {
        clip_ = Tensor<double, P>(Shape{std::int64_t(trainable_.size()) + 2});
        fill(clip_.view(), 0.0);
    }
}

template <class T, class P>
void OptimizerState<T, P>::set_loss_scale_state(const LossScaleState& s) {
    STRATA_CHECK(!scaling_ || (std::isfinite(s.scale) && s.scale > 0 && s.good_steps >= 0 && s.skipped_steps >= 0), ValueError,
                 "optimizer: a loss scale state needs a finite scale > 0 and counts >= 0, got scale ", s.scale, ", ",
                 s.good_steps, " good steps and ", s.skipped_steps, " skipped");
    if (scaling_) scale_ = s;
}

template <class T, class P>
void OptimizerState<T, P>::advance() {
    if (skips_step()) {
        skip_ = false;
        scale_.last_skipped = true;
        prepared_for_ = -1;
        return;
    }
    ++iterations_;
    if (scaling_) {
        scale_.last_skipped = false;
        if (++scale_.good_steps >= scale_config_.growth_steps) {
            scale_.good_steps = 0;
            if (std::isfinite(scale_.scale * 2)) scale_.scale *= 2;
        }
    }
}

template <class T, class P>
void OptimizerState<T, P>::skip_nonfinite(const T* grads) {
    skip_ = true;
    ++scale_.skipped_steps;
    scale_.good_steps = 0;
    const double next = scale_.scale / 2;
    if (next >= scale_config_.floor) {
        scale_.scale = next;
        return;
    }
    std::string where = "the reduced gradient";
    if (grads) {
        const std::vector<T> g = to_vector(TensorView<T, P>(const_cast<T*>(grads), Shape{size_}));
        for (const auto& [first, count] : trainable_) {
            std::int64_t i = first;
            while (i < first + count && std::isfinite(double(g[std::size_t(i)]))) ++i;
            if (i < first + count) {
                where = "variable element " + std::to_string(i) + " (" + std::to_string(double(g[std::size_t(i)])) + ")";
                if (scale_config_.names)
                    for (const auto& [offset, name] : *scale_config_.names)
                        if (offset <= i) where = name + ", element " + std::to_string(i) + " of the flat buffer (" +
                                                 std::to_string(double(g[std::size_t(i)])) + ")";
                break;
            }
        }
    }
    throw NumericError("optimizer: at step " + std::to_string(iterations_) + " (after " + std::to_string(scale_.skipped_steps) +
                       " skipped steps) the gradient is still not finite with the loss scale at " + std::to_string(scale_.scale) +
                       ", and halving it would pass its floor " + std::to_string(scale_config_.floor) +
                       ": the first non-finite gradient is " + where +
                       ". The model diverged or overflows float16 even unscaled; lower the learning rate, clip "
                       "(global_clipnorm) or train under precision::MixedBFloat16");
}

template <class T, class P>
void OptimizerState<T, P>::queue_squared_norm(const T* grads, double* buf, double c) {
    (void)grads, (void)buf, (void)c;  // used on device places only
#if STRATA_HAS_CUDA
    if constexpr (std::is_same_v<P, place::Cuda>) {
        // Each trainable range's sum of squares into buf[j], then one thread adds them (in order)
        // and writes the scale: all queued on this thread's stream, which the update then reads.
        const std::int64_t parts = std::int64_t(trainable_.size());
        for (std::int64_t j = 0; j < parts; ++j) {
            const auto [first, count] = trainable_[std::size_t(j)];
            strata::detail::cuda_reduce::axis_with<double>(detail::SquaredLoad<T>{grads + first}, buf + j, 1, count, 1,
                                                          strata::detail::Reduction::Sum);
        }
        place::for_each_n<P>(std::int64_t(1), detail::ClipScaleStep{buf, parts, c});
    }
#endif
}

template <class T, class P>
double OptimizerState<T, P>::squared_gradient_norm(const T* grads) {
    if constexpr (!std::is_same_v<P, place::Cuda>) {
        return detail::squared_norm_host(grads, trainable_);
    } else {
        const std::int64_t parts = std::int64_t(trainable_.size());
        Tensor<double, P> own;
        double* buf = clip_.data();
        if (clipnorm_ <= 0) {  // no buffer of its own: a temporary one
            own = Tensor<double, P>(Shape{parts + 2});
            buf = own.data();
        }
        queue_squared_norm(grads, buf, clipnorm_ > 0 ? clipnorm_ : 1.0);
        double sum = 0;
        copy(TensorView<double, P>(buf + parts, Shape{1}), TensorView<double, place::Host>(&sum, Shape{1}));
        return sum;
    }
}

template <class T, class P>
void OptimizerState<T, P>::prepare_step(const T* grads) {
    prepared_for_ = iterations_;
    skip_ = false;
    if (clipnorm_ <= 0 && !scaling_) return;
    STRATA_PROFILE_MODEL("optimizer (clip norm)");
    if (scaling_) {
        // The skip is decided on the host: a device place waits for the sum here (one double).
        set_step_sum(squared_gradient_norm(grads), grads);
    } else if constexpr (!std::is_same_v<P, place::Cuda>) {
        set_clip_sum(detail::squared_norm_host(grads, trainable_));
    } else {
        queue_squared_norm(grads, clip_.data(), clipnorm_);
    }
}

template <class T, class P>
void OptimizerState<T, P>::set_step_sum(double sum_of_squares, const T* grads) {
    if (!scaling_) {
        set_clip_sum(sum_of_squares);
        return;
    }
    if (!std::isfinite(sum_of_squares)) {
        skip_nonfinite(grads);
        return;
    }
    // The unscaled gradient is g / S: its sum of squares, and the factor the update reads
    // (1 / S, times global_clipnorm's scale of the unscaled norm).
    const std::int64_t parts = std::int64_t(trainable_.size());
    const double inv = 1.0 / scale_.scale;
    const double unscaled = sum_of_squares * inv * inv;
    double v[2] = {unscaled, inv * (clipnorm_ > 0 ? detail::clip_scale(unscaled, clipnorm_) : 1.0)};
    if constexpr (!std::is_same_v<P, place::Cuda>) {
        clip_.data()[parts] = v[0];
        clip_.data()[parts + 1] = v[1];
    } else {
        copy(TensorView<double, place::Host>(v, Shape{2}), TensorView<double, P>(clip_.data() + parts, Shape{2}));
    }
}

template <class T, class P>
void OptimizerState<T, P>::prepare_step_from_squared_norm(double sum_of_squares) {
    prepared_for_ = iterations_;
    skip_ = false;
    if (clipnorm_ <= 0 && !scaling_) return;
    set_step_sum(sum_of_squares, nullptr);
}

template <class T, class P>
void OptimizerState<T, P>::set_clip_sum(double sum_of_squares) {
    const std::int64_t parts = std::int64_t(trainable_.size());
    double v[2] = {sum_of_squares, detail::clip_scale(sum_of_squares, clipnorm_)};
    if constexpr (!std::is_same_v<P, place::Cuda>) {
        clip_.data()[parts] = v[0];
        clip_.data()[parts + 1] = v[1];
    } else {
        copy(TensorView<double, place::Host>(v, Shape{2}), TensorView<double, P>(clip_.data() + parts, Shape{2}));
    }
}

template <class T, class P>
void OptimizerState<T, P>::apply_range(T* params, const T* grads, std::int64_t first, std::int64_t count) {
    STRATA_CHECK(first >= 0 && count >= 0 && first + count <= size_, ShapeError, "optimizer: range [", first, ", ",
                 first + count, ") is outside the ", size_, " parameters");
    if (count == 0 || skips_step()) return;
    STRATA_PROFILE_MODEL("optimizer");
    const double lr = std::visit([&](const auto& o) { return o.learning_rate(iterations_); }, config_);
    STRATA_CHECK(std::isfinite(lr) && lr >= 0, ValueError, "optimizer: the learning rate at step ", iterations_,
                 " is ", lr, "; it must be finite and >= 0");
    const double* clip = nullptr;
    if (clipnorm_ > 0 || scaling_) {
        STRATA_CHECK(prepared_for_ == iterations_, ValueError, "optimizer: global_clipnorm is set, and prepare_step(grads) "
                     "has not run over the whole gradient for step ", iterations_, " (apply does it; apply_range needs it first)");
        clip = clip_.data() + trainable_.size() + 1;
    }
    if (moving_.empty()) {  // no moving ranges: the optimizer's loops over the whole range
        update(params, grads, first, count, lr, clip);
        return;
    }
    // Split [first, last) at the moving ranges (sorted, disjoint).
    const std::int64_t last = first + count;
    std::int64_t at = first;
    for (const MovingAverageRange& r : moving_) {
        const std::int64_t r_end = r.first + r.count;
        if (r_end <= at) continue;
        if (r.first >= last) break;
        if (r.first > at) {
            update(params, grads, at, r.first - at, lr, clip);
            at = r.first;
        }
        const std::int64_t stop = std::min(last, r_end);
        moving_average(params, grads, at, stop - at, r.momentum);
        at = stop;
    }
    if (at < last) update(params, grads, at, last - at, lr, clip);
}

template <class T, class P>
void OptimizerState<T, P>::update(T* params, const T* grads, std::int64_t first, std::int64_t count, double lr,
                                  const double* clip) {
    T* w = params + first;
    const T* g = grads + first;
    auto at = [&](const char* name) { T* p = slot(name); return p ? p + first : nullptr; };
    std::visit(
        [&](const auto& o) {
            using O = std::decay_t<decltype(o)>;
            // The device runs the functors, one element per thread; the host its blocked loops.
            constexpr bool host = !std::is_same_v<P, place::Cuda>;
            if constexpr (std::is_same_v<O, SGD>) {
                const detail::SgdStep<T> f{w, g, at("momentum"), T(lr), T(o.momentum), o.nesterov, clip};
                if constexpr (host) detail::sgd_host(f, count);
                else place::for_each_n<P>(count, f);
            } else if constexpr (std::is_same_v<O, RMSprop>) {
                const detail::RmsStep<T> f{w, g, at("velocity"), at("average_gradient"), at("momentum"),
                                           T(lr), T(o.rho), T(o.momentum), T(o.epsilon), clip};
                if constexpr (host) detail::rms_host(f, count);
                else place::for_each_n<P>(count, f);
            } else {
                static_assert(std::is_same_v<O, Adam> || std::is_same_v<O, AdamW>);
                const double t = double(iterations_ + 1);
                const double alpha = lr * std::sqrt(1 - std::pow(o.beta_2, t)) / (1 - std::pow(o.beta_1, t));
                double wd = 0;
                if constexpr (std::is_same_v<O, AdamW>) wd = o.weight_decay;
                const detail::AdamStep<T> f{w, g, at("momentum"), at("velocity"), T(alpha), T(o.beta_1), T(o.beta_2),
                                            T(o.epsilon), clip, T(wd), T(lr)};
                if constexpr (host) detail::adam_host(f, count);
                else place::for_each_n<P>(count, f);
            }
        },
        config_);
}

template <class T, class P>
void OptimizerState<T, P>::moving_average(T* params, const T* stats, std::int64_t first, std::int64_t count, double momentum) {
    const detail::MovingAverageStep<T> f{params + first, stats + first, T(momentum), T(1.0 - momentum)};
    if constexpr (!std::is_same_v<P, place::Cuda>) detail::moving_average_host(f, count);
    else place::for_each_n<P>(count, f);
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
