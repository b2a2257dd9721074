#pragma once
/// \file strata/distribute/replica_pool.hpp
/// One persistent thread per replica. `run(fn)` calls fn(replica) on every replica's thread and
/// returns when all are done. A replica that throws stops the step: the pool calls the
/// failure hook (which aborts the collectives so that no replica waits forever), lets every
/// replica finish, and rethrows on the caller's thread a DistributedError naming the replica
/// and its error. Threads are kept between steps because starting them costs more than a
/// small model's step (and, on CUDA, each needs its own context setup).
///
/// The threads start all or none: when the system refuses one (pthread_create's EAGAIN: a
/// process or memory limit), the constructor stops and joins those already started and throws
/// DistributedError saying how many were asked for, how many started, and the system's reason.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/function_ref.hpp"

namespace strata::distribute {

namespace detail {
/// For tests: the index of the thread whose start every ReplicaPool built from now on fails, as
/// pthread_create fails when the system refuses a thread (EAGAIN); -1 (the default): none.
/// Lets a test check the all-or-nothing start without exhausting the machine.
STRATA_DECL std::atomic<int>& fail_thread_start_at();
}  // namespace detail

class ReplicaPool {
public:
    /// `replicas` threads; `setup(r)` runs first on thread r (thread count, device, stream).
    /// One replica runs on the caller's thread unless `always_threads` (a parameter server's
    /// worker must run beside its coordinator).
    STRATA_DECL explicit ReplicaPool(int replicas, std::function<void(int)> setup = {}, bool always_threads = false);
    ReplicaPool(const ReplicaPool&) = delete;
    ReplicaPool& operator=(const ReplicaPool&) = delete;
    ~ReplicaPool() { stop_and_join(); }

    int size() const { return n_; }

    /// Calls `fn(r)` for every replica r on its own thread (inline when there is one replica)
    /// and waits for all. `on_failure(r)` is called on replica r's thread as soon as it throws.
    /// Throws DistributedError "replica R failed: ..." for the lowest-numbered replica whose
    /// own code threw (errors that are only the consequence of another replica's abort are
    /// not reported as the cause).
    ///
    /// No allocation: the callables are passed by reference (FunctionRef), not wrapped in
    /// std::function; and the pool's code is not a template, so it is compiled once however many
    /// lambdas call it.
    void run(FunctionRef<void(int)> fn, FunctionRef<void(int)> on_failure = nullptr) {
        run_with(fn, on_failure, [] {});
    }

    /// An empty `fn` is a ValueError; an empty `on_failure`, `on_caller` or `stop` is skipped.
    /// As run(), and `on_caller()` runs on the calling thread while the replicas run (a
    /// coordinator driving them). If on_caller throws, `stop()` is called so the replicas
    /// return, they are waited for, and its exception passes on unchanged (it takes precedence
    /// over the replicas' errors, which are most often its consequence).
    STRATA_DECL void run_with(FunctionRef<void(int)> fn, FunctionRef<void(int)> on_failure, FunctionRef<void()> on_caller,
                              FunctionRef<void()> stop = nullptr);

private:
    STRATA_DECL void stop_and_join();

    STRATA_DECL void worker(int r, const std::function<void(int)>& setup);

    STRATA_DECL void rethrow_first();

    int n_;
    bool inline_;
    std::vector<std::thread> threads_;
    std::vector<std::exception_ptr> errors_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    FunctionRef<void(int)> job_, failure_;  // the run in progress
    std::uint64_t generation_ = 0;
    int remaining_ = 0;
    bool stopping_ = false;
};

}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/replica_pool.ipp"
#endif
