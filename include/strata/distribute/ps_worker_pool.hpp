#pragma once
/// \file strata/distribute/ps_worker_pool.hpp
/// The parameter server's hand-off between the coordinator and the worker threads.
///
/// Owns, per worker, one job slot (the mini-batch's step and its number among the worker's),
/// one result slot, a cancellation flag that backward's hook reads between layers, and
/// whether the job was handed to the thread yet (posted); and the queue of finished workers in
/// the order they finished (the real clock's event order). The coordinator prepares a job,
/// posts it (at once under the real clock; under the virtual clock when a core is free, see
/// slots()), and takes results; each worker thread runs serve(), which computes jobs until
/// the coordinator stops the pool. A worker's exception is taken as text on its own thread and
/// handed to the coordinator in its result: one failing worker stops the epoch with its name.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/rendezvous.hpp"
#include "strata/distribute/straggler.hpp"

namespace strata::distribute::detail {

struct Cancelled {};  // thrown by backward's hook to stop a cancelled mini-batch between layers
// Across processes: a worker rank that did not report by the deadline (killed, stopped, gone).
struct WorkerLost : DistributedError {
    using DistributedError::DistributedError;
};

class PsWorkerPool {
public:
    struct Job {
        bool pending = false;
        std::uint64_t step = 0, n = 0;
        // The loss's divisor (MixedFloat16): the update's expected examples over the loss scale
        // in force when the job was handed out, as one device scales the loss of that batch;
        // 1 without a loss scale (the gradient is the sum; the servers divide by the examples).
        double divisor = 1;
    };
    struct Result {
        bool ready = false, cancelled = false;
        UnitWork work{};
        // What a worker's exception said, taken on the worker's thread: the exception object
        // itself never crosses threads (its reference count lives in libstdc++, which TSan
        // does not see, so a cross-thread release reads as a race).
        bool failed = false;
        bool lost = false;  // across processes: the worker rank did not report by the deadline
        std::string error{};
    };

    explicit PsWorkerPool(int workers) : jobs_(std::size_t(workers)), results_(std::size_t(workers)) {
        for (int i = 0; i < workers; ++i) cancel_.push_back(std::make_unique<std::atomic<bool>>(false));
        job_of_.resize(std::size_t(workers));
        posted_.resize(std::size_t(workers));
    }

    /// Empties every slot and the queue for a new epoch. `slots`: the jobs the virtual clock
    /// lets compute at once (the machine's cores over a worker's).
    void begin_epoch(int slots) {
        std::lock_guard<std::mutex> lock(mutex_);
        slots_ = slots;
        stop_ = false;
        fifo_.clear();
        for (auto& r : results_) r = Result{};
        for (auto& j : jobs_) j = Job{};
        std::fill(job_of_.begin(), job_of_.end(), Job{});
        std::fill(posted_.begin(), posted_.end(), char(0));
        running_ = 0;
    }

    // ---- the coordinator's side ---------------------------------------------------------------

    /// Worker w's next job (not handed to its thread yet); its cancellation flag cleared.
    void prepare(int w, Job job) {
        cancel_[std::size_t(w)]->store(false);
        job_of_[std::size_t(w)] = job;
        posted_[std::size_t(w)] = 0;
    }
    const Job& job(int w) const { return job_of_[std::size_t(w)]; }
    /// Hands worker w's prepared job to its thread.
    void post(int w) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            jobs_[std::size_t(w)] = job_of_[std::size_t(w)];
        }
        posted_[std::size_t(w)] = 1;
        ++running_;
        cv_.notify_all();
    }
    bool posted(int w) const { return posted_[std::size_t(w)] != 0; }
    int running() const { return running_; }
    int slots() const { return slots_; }

    /// Worker w's result, waiting at most `wait` of running time (a suspended process does not
    /// time out); none when it did not come.
    std::optional<Result> take_result(int w, std::chrono::milliseconds wait) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!wait_running(cv_, lock, wait, [&] { return results_[std::size_t(w)].ready; })) return std::nullopt;
        Result r = results_[std::size_t(w)];
        results_[std::size_t(w)] = Result{};
        posted_[std::size_t(w)] = 0;
        --running_;
        fifo_.erase(std::remove(fifo_.begin(), fifo_.end(), w), fifo_.end());
        return r;
    }
    /// The worker that finished first of those not taken yet; none within `wait`.
    std::optional<int> first_finished(std::chrono::milliseconds wait) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!wait_running(cv_, lock, wait, [&] { return !fifo_.empty(); })) return std::nullopt;
        return fifo_.front();
    }
    /// Asks worker w to stop its mini-batch (seen at backward's next layer); notify() wakes it
    /// from a straggler's sleep.
    void cancel(int w) { cancel_[std::size_t(w)]->store(true); }
    void notify() { cv_.notify_all(); }
    /// The epoch is over: every thread returns from serve() once its job is done.
    void finish() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        cv_.notify_all();
    }
    /// The coordinator failed: every job is cancelled and every thread returns.
    void stop_all() {
        for (auto& c : cancel_) c->store(true);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
            for (auto& j : jobs_) j.pending = false;
        }
        cv_.notify_all();
    }

    // ---- a worker thread's side ---------------------------------------------------------------

    /// Worker w's thread: `compute(job, cancel)` for each job posted to it until finish() or
    /// stop_all(); its result or its exception (Cancelled: a cancelled mini-batch; WorkerLost:
    /// a lost worker rank) into the result slot.
    void serve(int w, FunctionRef<UnitWork(const Job&, std::atomic<bool>&)> compute) {
        auto& cancel = *cancel_[std::size_t(w)];
        for (;;) {
            Job job;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                cv_.wait(lock, [&] { return stop_ || jobs_[std::size_t(w)].pending; });
                if (!jobs_[std::size_t(w)].pending) return;
                job = jobs_[std::size_t(w)];
                jobs_[std::size_t(w)].pending = false;
            }
            Result r;
            try {
                r.work = compute(job, cancel);
            } catch (const Cancelled&) {
                r.cancelled = true;
            } catch (const WorkerLost& ex) {
                r.failed = true;
                r.lost = true;
                r.error = ex.what();
            } catch (const std::exception& ex) {
                r.failed = true;
                r.error = ex.what();
            } catch (...) {
                r.failed = true;
                r.error = "an exception that is not a std::exception";
            }
            {
                std::lock_guard<std::mutex> lock(mutex_);
                r.ready = true;
                results_[std::size_t(w)] = r;
                fifo_.push_back(w);
            }
            cv_.notify_all();
        }
    }
    /// Worker thread: sleeps a straggler's `seconds`, cut short by a cancellation, the epoch's
    /// end or Ctrl-C (the step then ends as usual); range-checked.
    void sleep(double seconds, const std::atomic<bool>& cancel) {
        std::unique_lock<std::mutex> lock(mutex_);
        Stragglers::sleep(cv_, lock, seconds, [&] { return cancel.load() || stop_; });
    }

private:
    int slots_ = 1;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::vector<Job> jobs_;        // handed to the threads (under mutex_)
    std::vector<Result> results_;  // under mutex_
    std::deque<int> fifo_;         // finished, in order (under mutex_)
    std::vector<std::unique_ptr<std::atomic<bool>>> cancel_;
    // The coordinator's own.
    std::vector<Job> job_of_;  // each worker's current job
    std::vector<char> posted_;
    int running_ = 0;  // posted and not taken
};

}  // namespace strata::distribute::detail
