#pragma once
/// \file strata/distribute/impl/replica_pool.ipp
/// The definitions behind strata/distribute/replica_pool.hpp: included by it in the header-only
/// mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <system_error>

#include "strata/distribute/replica_pool.hpp"

namespace strata::distribute {

namespace detail {
STRATA_DECL std::atomic<int>& fail_thread_start_at() {
    static std::atomic<int> index{-1};
    return index;
}
}  // namespace detail

STRATA_DECL ReplicaPool::ReplicaPool(int replicas, std::function<void(int)> setup, bool always_threads)
    : n_(replicas), inline_(replicas == 1 && !always_threads) {
    STRATA_CHECK(replicas >= 1, ValueError, "ReplicaPool: replicas must be >= 1, got ", replicas);
    if (inline_) {
        if (setup) setup(0);
        return;
    }
    errors_.resize(std::size_t(n_));
    threads_.reserve(std::size_t(n_));
    for (int r = 0; r < n_; ++r) {
        try {
            if (detail::fail_thread_start_at().load() == r)
                throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                                        "injected by detail::fail_thread_start_at");
            threads_.emplace_back([this, r, setup] { worker(r, setup); });
        } catch (const std::exception& e) {
            // The started threads wait for a job: stop them before anything they use is
            // destroyed (unwinding with threads still waiting on wake_ would never end).
            stop_and_join();
            throw_error<DistributedError>("ReplicaPool: ", n_, " threads asked for, ", r,
                                          " started (now stopped); the system refused thread ", r, ": ", e.what(),
                                          " (fewer replicas or workers, or a higher process/thread or memory limit)");
        }
    }
}

STRATA_DECL void ReplicaPool::stop_and_join() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        ++generation_;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
}

STRATA_DECL void ReplicaPool::worker(int r, const std::function<void(int)>& setup) {
    if (setup) setup(r);
    std::uint64_t seen = 0;
    for (;;) {
        FunctionRef<void(int)> job, failure;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_ != seen; });
            seen = generation_;
            if (stopping_) return;
            job = job_;
            failure = failure_;
        }
        try {
            job(r);
        } catch (...) {
            errors_[std::size_t(r)] = std::current_exception();
            if (failure) failure(r);
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (--remaining_ == 0) done_.notify_all();
        }
    }
}

STRATA_DECL void ReplicaPool::run_with(FunctionRef<void(int)> fn, FunctionRef<void(int)> on_failure,
                                      FunctionRef<void()> on_caller, FunctionRef<void()> stop) {
    STRATA_CHECK(fn, ValueError, "ReplicaPool::run: no function to run on the replicas (an empty FunctionRef)");
    if (inline_) {
        if (on_caller) on_caller();
        fn(0);  // one replica: its own exceptions pass through unchanged
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = fn;
        failure_ = on_failure;
        remaining_ = n_;
        for (auto& e : errors_) e = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr caller_error;
    try {
        if (on_caller) on_caller();
    } catch (...) {
        caller_error = std::current_exception();
        if (stop) stop();
    }
    {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return remaining_ == 0; });
        job_ = nullptr;
        failure_ = nullptr;
    }
    if (caller_error) std::rethrow_exception(caller_error);
    rethrow_first();
}

STRATA_DECL void ReplicaPool::rethrow_first() {
    int cause = -1, any = -1;
    for (int r = 0; r < n_; ++r) {
        if (!errors_[std::size_t(r)]) continue;
        if (any < 0) any = r;
        // A DistributedError in a replica is most often the echo of another's failure.
        try {
            std::rethrow_exception(errors_[std::size_t(r)]);
        } catch (const DistributedError&) {
        } catch (...) {
            if (cause < 0) cause = r;
        }
    }
    if (any < 0) return;
    // Only collective errors (a timeout, a mismatch): that error already names who is at
    // fault; pass it on as it is.
    if (cause < 0) std::rethrow_exception(errors_[std::size_t(any)]);
    const int r = cause;
    std::string what;
    try {
        std::rethrow_exception(errors_[std::size_t(r)]);
    } catch (const std::exception& e) {
        what = e.what();
    } catch (...) {
        what = "an exception that is not a std::exception";
    }
    throw_error<DistributedError>("replica ", r, " of ", n_, " failed: ", what);
}

}  // namespace strata::distribute
