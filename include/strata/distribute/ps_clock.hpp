#pragma once
/// \file strata/distribute/ps_clock.hpp
/// The clock that orders a parameter server's events (ParameterServerOptions::clock: Clock::Real
/// or Clock::Virtual).
///
/// Owns the time (seconds since the path was built) and the straggler model's draws.
/// `Clock::Real`: the time is the wall clock's, events come in the order the worker threads
/// finish, and a straggler's delay is slept after its computation (delay()). `Clock::Virtual`:
/// each mini-batch's compute time is drawn when it starts (start()), the next event is the
/// computing worker with the soonest finish (soonest()), and the time jumps to it
/// (advance_to()), so the schedule depends on the drawn times only.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/distribute/straggler.hpp"

namespace strata::distribute::detail {

class PsClock {
public:
    /// `stragglers` (kept by reference), drawn from `seed`; `batch_seconds`: the virtual compute
    /// time of a mini-batch before the model's factor (ParameterServerOptions's).
    PsClock(bool virtual_clock, const Stragglers& stragglers, std::uint64_t seed, double batch_seconds)
        : virtual_(virtual_clock), stragglers_(&stragglers), seed_(seed), batch_seconds_(batch_seconds) {}

    bool is_virtual() const { return virtual_; }
    /// The time as last read or set (clock_seconds()).
    double seconds() const { return now_; }

    /// At an epoch's start, for `workers` workers: returns the epoch's start time.
    double begin_epoch(int workers) {
        finish_.assign(std::size_t(workers), 0.0);
        real_start_ = std::chrono::steady_clock::now();
        real_base_ = now_;
        return now_;
    }
    /// Real: reads the wall clock into the time. Virtual: the time as the events set it.
    double now() {
        if (!is_virtual()) now_ = real_base_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - real_start_).count();
        return now_;
    }

    /// Virtual: worker w starts its n-th mini-batch now; draws when it finishes.
    void start(int w, std::uint64_t n) {
        if (is_virtual())
            finish_[std::size_t(w)] = now_ + stragglers_->compute_seconds(seed_, w, n, batch_seconds_);
    }
    /// Virtual: when worker w's mini-batch finishes.
    double finish(int w) const { return finish_[std::size_t(w)]; }
    /// Virtual: the time jumps to worker w's finish.
    void advance_to(int w) { now_ = finish_[std::size_t(w)]; }
    /// Virtual: among the workers `eligible(w)` says, the one that finishes first (the lowest
    /// index on a tie); -1 if none.
    template <class Eligible>
    int soonest(int workers, Eligible eligible) const {
        int best = -1;
        for (int v = 0; v < workers; ++v)
            if (eligible(v) && (best < 0 || finish_[std::size_t(v)] < finish_[std::size_t(best)])) best = v;
        return best;
    }

    /// Real: the straggler model's delay of worker w's n-th mini-batch, which took `measured`
    /// seconds to compute (to be slept).
    double delay(int w, std::uint64_t n, double measured) const {
        return stragglers_->delay_seconds(seed_, w, n, measured);
    }

private:
    bool virtual_;
    const Stragglers* stragglers_;
    std::uint64_t seed_;
    double batch_seconds_;
    double now_ = 0;
    std::chrono::steady_clock::time_point real_start_{};
    double real_base_ = 0;
    std::vector<double> finish_;  // virtual: each computing worker's finish time
};

}  // namespace strata::distribute::detail
