#pragma once
/// \file strata/distribute/impl/rendezvous.ipp
/// The definitions behind strata/distribute/rendezvous.hpp: included by it in the header-only
/// mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/distribute/rendezvous.hpp"

namespace strata::distribute {

STRATA_DECL std::string SyncPoint::str() const {
    std::string s(collective);
    bool open = false;
    auto part = [&](const std::string& p) {
        s += open ? ", " : " (";
        open = true;
        s += p;
    };
    if (!algorithm.empty()) part(std::string(algorithm));
    if (bucket >= 0) part("bucket " + std::to_string(bucket));
    if (steps > 0)
        part(step == 0 ? std::string("start")
                       : "step " + std::to_string(step) + " of " + std::to_string(steps));
    if (open) s += ')';
    return s;
}

STRATA_DECL Rendezvous::Rendezvous(int participants, std::chrono::milliseconds timeout)
    : n_(participants), timeout_(timeout) {
    STRATA_CHECK(participants >= 1, ValueError,
                 "Rendezvous: participants must be >= 1, got ", participants);
    STRATA_CHECK(timeout.count() > 0, ValueError,
                 "Rendezvous: timeout must be > 0 ms, got ", timeout.count(), " ms");
    arrived_.assign(static_cast<std::size_t>(n_), 0);
    // Spin only when every participant can have a core of its own; otherwise a spinning
    // waiter would take the core that a participant it waits for needs.
    const unsigned cores = std::thread::hardware_concurrency();
    spin_ = cores != 0 && static_cast<unsigned>(n_) <= cores ? kSpin : clock::duration::zero();
}

STRATA_DECL void Rendezvous::arrive_and_wait(int rank, const SyncPoint& at) {
    check_rank(rank, at);
    std::unique_lock lock(mutex_);
    if (aborted_) throw DistributedError(failure_message_locked(at));
    if (arrived_[static_cast<std::size_t>(rank)] != 0) {
        // Two threads claim the same rank: some other rank will never be matched.
        std::string msg = fail_locked(rank,
                                      "replica " + std::to_string(rank) +
                                          " arrived twice in one generation; each rank "
                                          "must be driven by exactly one thread",
                                      at);
        lock.unlock();
        cv_.notify_all();
        throw DistributedError(msg);
    }
    if (n_ == 1) return;

    const std::uint64_t generation = generation_.load(std::memory_order_relaxed);
    const std::uint64_t epoch = epoch_;
    arrived_[static_cast<std::size_t>(rank)] = 1;
    if (++count_ == n_) {
        count_ = 0;
        std::fill(arrived_.begin(), arrived_.end(), char{0});
        generation_.store(generation + 1, std::memory_order_release);
        lock.unlock();
        cv_.notify_all();
        return;
    }

    if (spin_ > clock::duration::zero()) spin_until_released(lock, generation);

    auto done = [&] {
        return generation_.load(std::memory_order_relaxed) != generation || aborted_ ||
               epoch_ != epoch;
    };
    const auto now = clock::now();
    if (timeout_ >= std::chrono::duration_cast<std::chrono::milliseconds>(
                        clock::time_point::max() - now)) {
        cv_.wait(lock, done);
    } else {
        // In slices, so that a suspension of the whole process is not counted.
        (void)wait_running(cv_, lock, timeout_, done);
    }

    if (epoch_ != epoch)
        throw DistributedError(at.str() + ": the group was reset while replica " +
                               std::to_string(rank) + " was waiting in it");
    if (generation_.load(std::memory_order_relaxed) != generation)
        return;  // completed, even if an abort came after
    if (aborted_) throw DistributedError(failure_message_locked(at));

    std::string missing;
    int missing_count = 0;
    for (int q = 0; q < n_; ++q) {
        if (arrived_[static_cast<std::size_t>(q)] != 0) continue;
        if (missing_count++ > 0) missing += ", ";
        missing += std::to_string(q);
    }
    std::string msg = fail_locked(
        -1,
        (missing_count == 1 ? "replica " : "replicas ") + missing + " of " +
            std::to_string(n_) + " did not arrive within " +
            std::to_string(timeout_.count()) + " ms",
        at);
    lock.unlock();
    cv_.notify_all();
    throw DistributedError(msg);
}

STRATA_DECL void Rendezvous::abort(int rank, std::exception_ptr error) noexcept {
    std::string what = "unknown exception";
    try {
        if (error) std::rethrow_exception(error);
    } catch (const std::exception& e) {
        try { what = e.what(); } catch (...) {}
    } catch (...) {
    }
    abort_with(rank, what, std::move(error));
}

STRATA_DECL void Rendezvous::abort(int rank, std::string_view message) noexcept {
    std::exception_ptr e;
    try {
        e = std::make_exception_ptr(DistributedError(std::string(message)));
    } catch (...) {
    }
    abort_with(rank, message, std::move(e));
}

STRATA_DECL void Rendezvous::reset() {
    {
        std::lock_guard lock(mutex_);
        aborted_ = false;
        abort_hint_.store(false, std::memory_order_relaxed);
        failed_rank_ = -1;
        reason_.clear();
        origin_.clear();
        failure_ = nullptr;
        count_ = 0;
        std::fill(arrived_.begin(), arrived_.end(), char{0});
        ++epoch_;
    }
    cv_.notify_all();
}

STRATA_DECL void Rendezvous::spin_until_released(std::unique_lock<std::mutex>& lock, std::uint64_t generation) {
    lock.unlock();
    const auto until = clock::now() + spin_;
    for (unsigned i = 1;; ++i) {
        if (generation_.load(std::memory_order_acquire) != generation ||
            abort_hint_.load(std::memory_order_relaxed))
            break;
        cpu_relax();
        if (i % 16 == 0 && clock::now() >= until) break;
    }
    lock.lock();
}

STRATA_DECL void Rendezvous::check_rank(int rank, const SyncPoint& at) const {
    if (rank < 0 || rank >= n_)
        throw_error<ValueError>(at.str(), ": rank ", rank, " is outside [0, ", n_, ")");
}

STRATA_DECL void Rendezvous::abort_with(int rank, std::string_view what, std::exception_ptr error) noexcept {
    try {
        std::lock_guard lock(mutex_);
        if (!aborted_) {
            aborted_ = true;
            abort_hint_.store(true, std::memory_order_relaxed);
            failed_rank_ = rank;
            reason_ = "replica " + std::to_string(rank) + " failed: " + std::string(what);
            origin_.clear();
            failure_ = std::move(error);
        }
    } catch (...) {
        // Out of memory while building the message: still mark the group aborted.
        std::lock_guard lock(mutex_);
        aborted_ = true;
        abort_hint_.store(true, std::memory_order_relaxed);
        failed_rank_ = rank;
    }
    cv_.notify_all();
}

STRATA_DECL std::string Rendezvous::fail_locked(int rank, std::string reason, const SyncPoint& at) {
    aborted_ = true;
    abort_hint_.store(true, std::memory_order_relaxed);
    failed_rank_ = rank;
    origin_ = at.str();
    reason_ = std::move(reason);
    std::string msg = origin_ + ": " + reason_;
    failure_ = std::make_exception_ptr(DistributedError(msg));
    return msg;
}

STRATA_DECL std::string Rendezvous::failure_message_locked(const SyncPoint& at) const {
    std::string here = at.str();
    std::string msg = here + ": " + (reason_.empty() ? "the group was aborted" : reason_);
    if (!origin_.empty() && origin_ != here) msg += " (detected at " + origin_ + ")";
    return msg;
}

}  // namespace strata::distribute
