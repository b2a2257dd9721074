#pragma once
/// \file strata/distribute/rendezvous.hpp
/// A reusable barrier for the replicas (threads) of one process, with a timeout and an abort
/// that releases everyone. Every shared-memory collective in strata synchronises through it, so
/// a replica that dies or never comes turns into a DistributedError on every other replica
/// (naming who failed or who is missing) instead of a hang.

#include <strata/config.hpp>
#include <strata/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__) || defined(_M_X64)) && !((defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__))
#include <immintrin.h>  // _mm_pause (GCC and Clang use their builtin: no 63 000-line header)
#endif

namespace strata::distribute {

/// Where in a collective a replica is waiting; used only to build error messages, so a
/// SyncPoint costs nothing unless something fails (it holds views of string literals).
///
/// Formats as `collective (algorithm, bucket B, step S of T)`, leaving out the parts that are
/// not set; step 0 of T > 0 reads `start`. Example:
/// `SyncPoint{"all_reduce", "ring", 3, 6}.str() == "all_reduce (ring, step 3 of 6)"`.
struct SyncPoint {
    std::string_view collective = "barrier";
    std::string_view algorithm{};
    int step = 0;               ///< 1-based step; 0 with steps > 0 means the entry rendezvous
    int steps = 0;              ///< steps of the algorithm; 0 when it has no steps
    std::int64_t bucket = -1;   ///< gradient bucket index, or -1 when not a bucket

    [[nodiscard]] STRATA_DECL std::string str() const;
};

/// A deadline over the time the job could run, for waiting loops: a job that was suspended as a
/// whole (Ctrl-Z, SIGSTOP to every process, a paused virtual machine) and resumed has not timed
/// out, though the clock moved on while it was stopped.
///
/// Represents: `timeout` of counted waiting. The loop polls expired() at least every `poll`
/// (the longest it blocks between two checks). The time between two polls is counted, unless
/// it exceeds `poll` by more than the grace (a quarter of the timeout, between 50 ms and 1 s):
/// then this process was not running for that time (a scheduler does not delay a runnable
/// thread that long), and only `poll` of it is counted. A peer that is late while this process
/// runs is still named at the timeout; one stopped alone is too (this process keeps running
/// and counting). The clock is injectable: every member takes `now`.
///
/// Example (the waiting loop of a collective):
/// \code
///   RunningDeadline d(timeout, std::chrono::milliseconds(1));
///   while (!arrived()) {
///       if (d.expired()) throw DistributedError("... did not arrive within ...");
///       std::this_thread::sleep_for(std::chrono::microseconds(500));
///   }
/// \endcode
class RunningDeadline {
public:
    using clock = std::chrono::steady_clock;

    explicit RunningDeadline(std::chrono::milliseconds timeout, clock::duration poll = std::chrono::milliseconds(1),
                             clock::time_point now = clock::now())
        : timeout_(saturated(timeout)),
          poll_(poll),
          grace_(std::clamp<clock::duration>(timeout_ / 4, std::chrono::milliseconds(50), std::chrono::seconds(1))),
          last_(now) {}

    /// Counts the time since the previous poll (see the class comment) and returns whether
    /// more than the timeout has been counted.
    bool expired(clock::time_point now = clock::now()) {
        const clock::duration gap = now - last_;
        last_ = std::max(last_, now);
        if (gap > poll_ + grace_) {
            counted_ += poll_;
            suspended_ += gap - poll_;
        } else if (gap > clock::duration::zero()) {
            counted_ += gap;
        }
        return counted_ > timeout_;
    }
    /// The waiting counted so far, and the time left out as suspended.
    [[nodiscard]] clock::duration waited() const noexcept { return counted_; }
    [[nodiscard]] clock::duration suspended() const noexcept { return suspended_; }
    /// When a blocking wait must return to poll: `poll` from now, or the deadline if sooner.
    [[nodiscard]] clock::time_point next_poll(clock::time_point now = clock::now()) const {
        const clock::duration left = timeout_ - counted_;
        return now + std::max(clock::duration::zero(), std::min(poll_, left + std::chrono::milliseconds(1)));
    }

private:
    // Timeouts beyond a few decades mean "never": kept clear of the clock's overflow.
    static clock::duration saturated(std::chrono::milliseconds t) {
        constexpr auto cap = std::chrono::duration_cast<std::chrono::milliseconds>(clock::duration::max() / 4);
        return t >= cap ? clock::duration(cap) : clock::duration(t);
    }

    clock::duration timeout_, poll_, grace_;
    clock::time_point last_;
    clock::duration counted_{}, suspended_{};
};

/// Waits on `cv` until `done()` or until `timeout` of running time passed (RunningDeadline:
/// a suspension of the whole process does not count). Returns done(). `lock` is held on entry
/// and on return, as for std::condition_variable::wait_for.
template <class Pred>
bool wait_running(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout, Pred done) {
    constexpr auto poll = std::chrono::milliseconds(20);
    RunningDeadline d(timeout, poll);
    while (!done()) {
        if (d.expired()) return done();
        cv.wait_until(lock, d.next_poll(), done);
    }
    return true;
}

/// A generation-counted barrier for `participants` ranks with a timeout and an abort.
///
/// Represents: the meeting point of N replicas (threads) of one process. Each call of
/// arrive_and_wait() by all N ranks forms one generation; the barrier is reusable at once.
/// Built on std::mutex + std::condition_variable; when N <= hardware_concurrency() a waiter
/// polls for up to 20 us before it blocks (a wake-up costs more than a typical step skew).
///
/// Requires: each rank in [0, N) is driven by one thread at a time, and every rank calls
/// arrive_and_wait() the same number of times (as a collective algorithm does).
///
/// Ensures:
/// - when all N ranks arrive, all return; the returning threads see every write that any rank
///   made before arriving (the mutex gives the happens-before edge);
/// - when a rank waits longer than the timeout (of running time: a suspension of the whole
///   process, SIGSTOP or Ctrl-Z, is not counted; see RunningDeadline), it throws DistributedError naming the point
///   and exactly the missing ranks (`all_reduce (ring, step 3 of 6): replicas 2, 3 of 4 did not
///   arrive within 5000 ms`) and the group becomes aborted, which releases everybody else;
/// - after abort(rank, error), every rank waiting now or arriving later throws
///   DistributedError `... : replica 2 failed: <what>` at once, until reset().
///
/// Example:
/// \code
///   strata::distribute::Rendezvous rv(2, std::chrono::milliseconds(1000));
///   // in thread r:  try { work(r); rv.arrive_and_wait(r, {"step"}); }
///   //               catch (...) { rv.abort(r, std::current_exception()); throw; }
/// \endcode
class Rendezvous {
public:
    using clock = std::chrono::steady_clock;

    /// Requires participants >= 1 and timeout > 0 (ValueError otherwise).
    STRATA_DECL Rendezvous(int participants, std::chrono::milliseconds timeout);
    Rendezvous(const Rendezvous&) = delete;
    Rendezvous& operator=(const Rendezvous&) = delete;

    [[nodiscard]] int participants() const noexcept { return n_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

    /// Blocks until all participants arrived at this generation (see the class contract).
    /// Throws ValueError for a rank outside [0, N) and DistributedError on timeout or abort.
    STRATA_DECL void arrive_and_wait(int rank, const SyncPoint& at);

    /// Convenience overload for a plain named barrier: `rv.arrive_and_wait(r, "epoch end")`.
    /// (The name is copied into the error only if one is thrown.)
    void arrive_and_wait(int rank, std::string_view what) {
        arrive_and_wait(rank, SyncPoint{what});
    }

    /// Marks the group failed because replica `rank` threw `error`; releases every waiter.
    /// The first failure wins (later aborts, often echoes of the first, are ignored).
    /// Ensures: waiters and later arrivals throw DistributedError `<point>: replica R failed:
    /// <what()>` until reset(). Never throws.
    STRATA_DECL void abort(int rank, std::exception_ptr error) noexcept;

    /// As abort(rank, exception_ptr), with a message instead of an exception.
    STRATA_DECL void abort(int rank, std::string_view message) noexcept;

    /// Clears an abort or a timeout so the group can be used again.
    /// Requires: no participant is inside arrive_and_wait() (join or quiesce them first).
    STRATA_DECL void reset();

    /// True between an abort (or timeout) and the next reset().
    [[nodiscard]] bool aborted() const {
        std::lock_guard lock(mutex_);
        return aborted_;
    }

    /// The rank that aborted the group, or -1 (none, or a timeout).
    [[nodiscard]] int failed_rank() const {
        std::lock_guard lock(mutex_);
        return failed_rank_;
    }

    /// The original exception given to abort() (or the timeout error); null when not aborted.
    /// Lets a driver rethrow the root cause instead of the echoes on the other replicas.
    [[nodiscard]] std::exception_ptr failure() const {
        std::lock_guard lock(mutex_);
        return failure_;
    }

    /// Throws the DistributedError a waiter would get if the group is aborted; else nothing.
    void throw_if_aborted(const SyncPoint& at) const {
        std::lock_guard lock(mutex_);
        if (aborted_) throw DistributedError(failure_message_locked(at));
    }

private:
    // Waking a thread blocked on a condition variable costs microseconds, tens of them on a
    // virtual machine whose idle vCPU has halted; the steps of a collective on N cores are
    // usually that close together. So a waiter first polls the generation, without the
    // mutex, for up to kSpin, then blocks. The mutex is retaken afterwards either way, which
    // is what orders the other ranks' writes before this rank's reads.
    static constexpr clock::duration kSpin = std::chrono::microseconds(20);

    static void cpu_relax() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
        __builtin_ia32_pause();
#elif defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
        _mm_pause();
#else
        std::this_thread::yield();
#endif
    }

    STRATA_DECL void spin_until_released(std::unique_lock<std::mutex>& lock, std::uint64_t generation);

    STRATA_DECL void check_rank(int rank, const SyncPoint& at) const;

    STRATA_DECL void abort_with(int rank, std::string_view what, std::exception_ptr error) noexcept;

    // Aborts the group for a failure detected at `at` (a timeout, a duplicate rank) and
    // returns the full message; requires !aborted_ (checked by the callers on entry).
    STRATA_DECL std::string fail_locked(int rank, std::string reason, const SyncPoint& at);

    STRATA_DECL std::string failure_message_locked(const SyncPoint& at) const;

    const int n_;
    const std::chrono::milliseconds timeout_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    clock::duration spin_{};         // how long a waiter polls before it blocks (0: never)
    std::vector<char> arrived_;      // who arrived in the current generation
    int count_ = 0;
    // Written under the mutex; atomic only so that spinning waiters may poll it without it.
    std::atomic<std::uint64_t> generation_{0};
    std::uint64_t epoch_ = 0;        // bumped by reset(), to expose a reset during a wait
    bool aborted_ = false;
    std::atomic<bool> abort_hint_{false};  // mirrors aborted_, for the spinning waiters
    int failed_rank_ = -1;
    std::string reason_;             // "replica 2 failed: boom" / "replica 2 of 3 did not ..."
    std::string origin_;             // the point where a timeout happened (empty for abort())
    std::exception_ptr failure_;
};

}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/rendezvous.ipp"
#endif
