#pragma once
/// \file strata/distribute/stop_agreement.hpp
/// One stop for the whole job: when a process of a multi-process job is asked to stop (a
/// signal under `train::StopOnSignal`, a callback's `stop_training`), every process must stop
/// at the same step, or the one that stops leaves the others waiting in a collective or a
/// pipeline exchange that never comes (issue 41: SIGTERM to one pipeline rank ended the job
/// with a message-mismatch error and no `--save`).
///
/// `fit` (train/fit_loop.hpp) asks `agree_stop()` after every step of a lockstep strategy,
/// after every epoch's training and once more before it returns; each call combines every
/// rank's request: the job stops if any rank asked, and the highest signal number any rank
/// caught becomes every rank's `strata::stop_signal()`, so each rank's StopOnSignal reports it
/// and the program's save-and-exit branch (collective under a pipeline) is taken on every rank.
///
/// The channel is the job's first `collective::ProcessGroup` that spans every rank of the job:
/// every strategy across processes (MultiWorkerMirrored, Pipeline, the hybrid, and any later
/// one) joins through a ProcessGroup, which registers itself here, so no strategy has to
/// remember to. The parameter server's group registers too, but Model does not agree over it:
/// its workers never step in lockstep and a lost worker, which it trains on without, would
/// make every sum over the job wait for it (its stop is the coordinator's, see
/// docs/fault_tolerance.md). In one process there is no channel and the request is this
/// process's own. No MPI here.
#include <atomic>
#include <cstddef>
#include <span>

#include "strata/core/stop_signal.hpp"

namespace strata::distribute {

/// What a rank asks for at a step boundary: whether to stop, and the signal that asked (0: none).
struct StopRequest {
    bool stop = false;
    int signal = 0;
    friend bool operator==(const StopRequest&, const StopRequest&) = default;
};

/// A sum over every rank of the job, in place, the same result on every rank.
class StopChannel {
public:
    virtual void sum_over_job(std::span<double> values) = 0;

protected:
    ~StopChannel() = default;
};

namespace detail {
inline std::atomic<StopChannel*>& job_stop_channel() {
    static std::atomic<StopChannel*> channel{nullptr};  // an inline function's static: one per program
    return channel;
}
}  // namespace detail

/// Registers `c` as the job's stop channel unless one is registered; returns whether it was.
inline bool register_stop_channel(StopChannel* c) {
    StopChannel* none = nullptr;
    return detail::job_stop_channel().compare_exchange_strong(none, c);
}
/// Unregisters `c` if it is the job's stop channel (its ProcessGroup is going away).
inline void unregister_stop_channel(StopChannel* c) {
    StopChannel* expected = c;
    detail::job_stop_channel().compare_exchange_strong(expected, nullptr);
}
/// Whether the job has a stop channel (this process is one rank of several).
inline bool has_stop_channel() { return detail::job_stop_channel().load() != nullptr; }

/// Combines `mine` with every rank's request (a collective: every rank of the job calls it at
/// the same point): stop if any rank asks; the highest signal any rank caught. The agreed
/// signal is written into strata::stop_signal() where this rank caught none. Without a
/// channel (one process), `mine`.
inline StopRequest agree_stop(StopRequest mine) {
    StopChannel* c = detail::job_stop_channel().load();
    if (!c) return mine;
    // A sum is what every transport has: [0] counts the ranks that ask to stop, [s] the ranks
    // that caught signal s; the highest s with a count is the maximum over the ranks.
    constexpr int slots = 65;  // signal numbers 1..64 (Linux's NSIG is 65)
    double v[slots] = {};
    v[0] = mine.stop ? 1.0 : 0.0;
    if (mine.signal > 0) v[mine.signal < slots ? mine.signal : slots - 1] = 1.0;
    c->sum_over_job(std::span<double>(v, std::size_t(slots)));
    StopRequest agreed{v[0] > 0, 0};
    for (int s = slots - 1; s > 0 && !agreed.signal; --s)
        if (v[s] > 0) agreed.signal = s;
    // Every rank's StopOnSignal then says the job was interrupted, and by which signal: the
    // ranks the signal did not reach take the same save-and-exit path as the one it did.
    if (agreed.signal != 0) stop_signal() = agreed.signal;  // >= this rank's own: one exit status everywhere
    return agreed;
}

}  // namespace strata::distribute
