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
    /// No allocation: the callables are passed by reference, not wrapped in std::function.
    template <class F, class G = void (*)(int)>
    void run(F&& fn, G&& on_failure = nullptr) {
        run_with(std::forward<F>(fn), std::forward<G>(on_failure), [] {});
    }

    /// As run(), and `on_caller()` runs on the calling thread while the replicas run (a
    /// coordinator driving them). If on_caller throws, `stop()` is called so the replicas
    /// return, they are waited for, and its exception passes on unchanged (it takes precedence
    /// over the replicas' errors, which are most often its consequence).
    template <class F, class G, class C, class S = void (*)()>
    void run_with(F&& fn, G&& on_failure, C&& on_caller, S&& stop = nullptr) {
        if (inline_) {
            on_caller();
            fn(0);  // one replica: its own exceptions pass through unchanged
            return;
        }
        using FF = std::remove_reference_t<F>;
        using GG = std::remove_reference_t<G>;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            job_ = Call{const_cast<void*>(static_cast<const void*>(&fn)),
                        [](void* f, int r) { (*static_cast<FF*>(f))(r); }};
            if constexpr (std::is_pointer_v<GG>) {
                failure_ = on_failure ? Call{reinterpret_cast<void*>(on_failure), [](void* g, int r) { reinterpret_cast<GG>(g)(r); }}
                                      : Call{};
            } else {
                failure_ = Call{const_cast<void*>(static_cast<const void*>(&on_failure)),
                                [](void* g, int r) { (*static_cast<GG*>(g))(r); }};
            }
            remaining_ = n_;
            for (auto& e : errors_) e = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        std::exception_ptr caller_error;
        try {
            on_caller();
        } catch (...) {
            caller_error = std::current_exception();
            if constexpr (!std::is_pointer_v<std::remove_reference_t<S>>) stop();
            else if (stop) stop();
        }
        {
            std::unique_lock<std::mutex> lock(mutex_);
            done_.wait(lock, [&] { return remaining_ == 0; });
            job_ = Call{};
            failure_ = Call{};
        }
        if (caller_error) std::rethrow_exception(caller_error);
        rethrow_first();
    }

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
    struct Call {
        void* ctx = nullptr;
        void (*fn)(void*, int) = nullptr;
    };
    Call job_, failure_;
    std::uint64_t generation_ = 0;
    int remaining_ = 0;
    bool stopping_ = false;
};

}  // namespace strata::distribute

#if STRATA_HEADER_ONLY
#include "strata/distribute/impl/replica_pool.ipp"
#endif
