#pragma once
/// \file strata/distribute/straggler.hpp
/// A seeded model of straggling workers, and the compute times it implies.
///
/// The models are those of the analyses of K-sync and K-batch-sync SGD (Dutta, Joshi, Ghosh,
/// Dube, Nagpurkar, "Slow and stale gradients can win the race", AISTATS 2018): a worker's
/// compute time per mini-batch is exponential, Exp(mu) with mean 1/mu, or shifted exponential,
/// Delta + Exp(mu); plus a deterministic model (some workers a fixed factor slower) that makes
/// tests and demonstrations easy to read.
///
/// Every draw is a pure function of (seed, worker, mini-batch index): Philox is counter-based
/// (strata/core/random.hpp), so a run is reproducible whatever order the threads ask in.

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/random.hpp"
#include "strata/core/stop_signal.hpp"

namespace strata::distribute {

/// How workers straggle: not at all, by fixed per-worker factors, or with random compute
/// times (exponential or shifted exponential).
///
/// Two clocks use it. Under a virtual clock (simulation, theory checks) `compute_seconds` is
/// the time a mini-batch takes; under the real clock `delay_seconds` is the extra time a worker
/// waits after computing one, so that its total time follows the model.
///
/// \code
/// auto s = Stragglers::parse("sexp:2:10");     // 2 ms + Exp(mean 10 ms)
/// s.validate(4);                                // 4 workers
/// double t = s.compute_seconds(42, 1, 7, 0.0);  // worker 1's 8th mini-batch, always the same
/// s.mean_seconds(1, 0.0) == 0.012;
/// \endcode
class Stragglers {
public:
    enum class Kind { None, Slow, Exponential, ShiftedExponential };

    /// The Philox counter's high word is `stream | worker`: the straggler draws use counters
    /// that weight initialisation (high word = a layer's small stream number), normal draws
    /// (high bits 0) and dropout (low word with bit 63 set) never reach, so they are
    /// independent of the model's random numbers for the same seed. The value spells "STRAG".
    static constexpr std::uint64_t stream = 0x5354524147000000ULL;

    /// The largest slowdown factor (slow:WORKER:FACTOR), and the longest mean or shift (exp,
    /// sexp): one day, as the longest timeout. Beyond them a delay overflows the clocks (a factor
    /// of 1e12 once slept nothing at all).
    static constexpr double max_factor = 1e6;
    static constexpr double max_seconds = 86400;
    /// The longest delay a real clock sleeps (a draw is at most ~37 means; factor × a measured
    /// compute time is checked against it when it is slept).
    static constexpr double max_delay_seconds = 1e7;

    /// No straggler: every worker takes base_seconds per mini-batch, no delay is injected.
    Stragglers() = default;
    static Stragglers none() { return {}; }

    /// Worker `worker` is `factor` times slower than the others.
    /// Requires: worker >= 0 (checked against the worker count by validate), factor finite and >= 1.
    static Stragglers slow(int worker, double factor) {
        STRATA_CHECK(worker >= 0, ValueError, "Stragglers::slow: expected a worker index >= 0, found ", worker);
        check_factor(factor, worker);
        Stragglers s;
        s.kind_ = Kind::Slow;
        s.slow_worker_ = worker;
        s.factors_ = {factor};
        return s;
    }

    /// Worker i is factors[i] times slower than a worker of factor 1.
    /// Requires: one factor per worker (checked by validate), each finite and >= 1.
    static Stragglers slow(std::vector<double> factors) {
        STRATA_CHECK(!factors.empty(), ValueError, "Stragglers::slow: expected one factor per worker, found none");
        for (std::size_t i = 0; i < factors.size(); ++i) check_factor(factors[i], int(i));
        Stragglers s;
        s.kind_ = Kind::Slow;
        s.factors_ = std::move(factors);
        return s;
    }

    /// Compute time ~ Exp(mu) with mean 1/mu = mean_seconds. Requires: 0 < mean_seconds <= max_seconds.
    static Stragglers exponential(double mean_seconds) {
        check_mean(mean_seconds, "Stragglers::exponential");
        Stragglers s;
        s.kind_ = Kind::Exponential;
        s.mean_ = mean_seconds;
        return s;
    }

    /// Compute time ~ shift_seconds + Exp(mu) with 1/mu = mean_seconds.
    /// Requires: 0 <= shift_seconds <= max_seconds, 0 < mean_seconds <= max_seconds.
    static Stragglers shifted_exponential(double shift_seconds, double mean_seconds) {
        STRATA_CHECK(std::isfinite(shift_seconds) && shift_seconds >= 0 && shift_seconds <= max_seconds, ValueError,
                     "Stragglers::shifted_exponential: expected a finite shift >= 0 s and <= ", max_seconds, " s (one day), found ",
                     shift_seconds);
        check_mean(mean_seconds, "Stragglers::shifted_exponential");
        Stragglers s;
        s.kind_ = Kind::ShiftedExponential;
        s.shift_ = shift_seconds;
        s.mean_ = mean_seconds;
        return s;
    }

    /// The command-line form: "none", "slow:WORKER:FACTOR", "exp:MEAN_MS", "sexp:SHIFT_MS:MEAN_MS"
    /// (times in milliseconds). Numbers are strict: no sign prefix, spaces or trailing
    /// characters, finite, in range. Anything else throws ValueError quoting `spec` and listing
    /// the accepted forms.
    /// \code
    /// Stragglers::parse("slow:1:4").describe() == "slow: worker 1 ×4"
    /// Stragglers::parse("exp:10").mean_seconds(0, 0) == 0.01
    /// \endcode
    STRATA_DECL static Stragglers parse(std::string_view spec);

    Kind kind() const { return kind_; }

    /// How many times slower than base `worker` is (1 unless the model is Slow).
    /// Requires: worker >= 0, and for per-worker factors worker < their count.
    double factor(int worker) const {
        STRATA_CHECK(worker >= 0, ValueError, "Stragglers: expected a worker index >= 0, found ", worker);
        if (kind_ != Kind::Slow) return 1.0;
        if (slow_worker_ >= 0) return worker == slow_worker_ ? factors_[0] : 1.0;
        STRATA_CHECK(std::size_t(worker) < factors_.size(), ValueError, "Stragglers: worker ", worker,
                     " has no slowdown factor; expected a worker index in [0, ", factors_.size(), ")");
        return factors_[std::size_t(worker)];
    }

    /// Virtual clock: the compute time in seconds of worker `worker`'s `n`-th mini-batch.
    /// None/Slow: base_seconds × factor(worker); Exponential: an Exp draw; ShiftedExponential:
    /// shift + an Exp draw (base_seconds is not used by the random models).
    /// Ensures: a pure function of (seed, worker, n, base_seconds) and the model.
    double compute_seconds(std::uint64_t seed, int worker, std::uint64_t n, double base_seconds) const {
        switch (kind_) {
        case Kind::None:
        case Kind::Slow:
            STRATA_CHECK(std::isfinite(base_seconds) && base_seconds >= 0, ValueError,
                         "Stragglers::compute_seconds: expected a finite base time >= 0 s, found ", base_seconds);
            return base_seconds * factor(worker);
        case Kind::Exponential: return exp_draw(seed, worker, n);
        case Kind::ShiftedExponential: return shift_ + exp_draw(seed, worker, n);
        }
        return 0;
    }

    /// Real clock: the extra seconds worker `worker` waits after a mini-batch whose measured
    /// compute took `measured_seconds`. None: 0; Slow: (factor − 1) × measured, so that the total
    /// is factor × measured; Exponential/ShiftedExponential: the draw compute_seconds gives (the
    /// injected delay, on top of the real compute).
    double delay_seconds(std::uint64_t seed, int worker, std::uint64_t n, double measured_seconds) const {
        STRATA_CHECK(std::isfinite(measured_seconds) && measured_seconds >= 0, ValueError,
                     "Stragglers::delay_seconds: expected a finite measured time >= 0 s, found ", measured_seconds);
        switch (kind_) {
        case Kind::None: (void)factor(worker); return 0;
        case Kind::Slow: return (factor(worker) - 1.0) * measured_seconds;
        case Kind::Exponential:
        case Kind::ShiftedExponential: return compute_seconds(seed, worker, n, 0.0);
        }
        return 0;
    }

    /// Real clock: waits `seconds` on `cv` (its `lock` held) until `done()`, or until a stop
    /// was requested (strata::stop_signal(): Ctrl-C or SIGTERM under StopOnSignal), checked every
    /// 50 ms at most since a signal cannot notify a condition variable. Returns whether a stop
    /// request ended it. Throws ValueError for a delay that is not finite, negative or beyond
    /// max_delay_seconds (naming it), rather than overflowing the clock into no wait at all.
    template <class Done>
    static bool sleep(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, double seconds, Done&& done) {
        STRATA_CHECK(std::isfinite(seconds) && seconds >= 0 && seconds <= max_delay_seconds, ValueError,
                     "Stragglers: an injected delay must be finite, >= 0 s and <= ", max_delay_seconds, " s, found ", seconds,
                     " s (a smaller slowdown factor or mean)");
        using clock = std::chrono::steady_clock;
        const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
        for (;;) {
            if (done()) return false;
            if (stop_signal().load() != 0) return true;
            const auto now = clock::now();
            if (now >= until) return false;
            const auto slice = std::chrono::milliseconds(50);
            cv.wait_until(lock, until - now < slice ? until : now + slice);
        }
    }

    /// The expected compute time under the virtual clock, for the theory formulas:
    /// base × factor(worker), 1/mu, or shift + 1/mu.
    double mean_seconds(int worker, double base_seconds) const {
        switch (kind_) {
        case Kind::None:
        case Kind::Slow: return base_seconds * factor(worker);
        case Kind::Exponential: return mean_;
        case Kind::ShiftedExponential: return shift_ + mean_;
        }
        return 0;
    }

    /// Checks the model against a run of `workers` workers: the slow worker must exist, and
    /// per-worker factors must number exactly `workers`. Throws ValueError otherwise.
    STRATA_DECL void validate(int workers) const;

    /// "none", "slow: worker 1 ×4", "slow: ×{1, 4, 1}", "Exp(mean 10 ms)", "2 ms + Exp(mean 10 ms)".
    STRATA_DECL std::string describe() const;

private:
    static void check_factor(double factor, int worker) {
        STRATA_CHECK(std::isfinite(factor) && factor >= 1 && factor <= max_factor, ValueError, "Stragglers::slow: worker ", worker,
                     ": expected a finite slowdown factor >= 1 and <= ", max_factor, ", found ", factor);
    }
    static void check_mean(double mean, const char* who) {
        STRATA_CHECK(std::isfinite(mean) && mean > 0 && mean <= max_seconds, ValueError, who, ": expected a finite mean > 0 s and <= ",
                     max_seconds, " s (one day), found ", mean);
    }

    // Inverse CDF of Exp with mean mean_: -mean·log(1 − u), u in [0, 1) with 53 random bits, so
    // the logarithm's argument stays in (0, 1] and the draw is finite (at most ~36.7 means).
    double exp_draw(std::uint64_t seed, int worker, std::uint64_t n) const {
        STRATA_CHECK(worker >= 0, ValueError, "Stragglers: expected a worker index >= 0, found ", worker);
        const auto r = random::Philox4x32::generate(seed, n, stream | std::uint64_t(std::uint32_t(worker)));
        const double u = random::uniform01<double>(r.v[0], r.v[1]);
        return -mean_ * std::log1p(-u);
    }

    Kind kind_ = Kind::None;
    int slow_worker_ = -1;        // Slow with one slow worker; -1 with per-worker factors
    std::vector<double> factors_;  // {factor} for one slow worker, else one per worker
    double shift_ = 0, mean_ = 0;  // seconds
};

}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/straggler.ipp"
#endif
