#pragma once
/// \file strata/distribute/collective/impl/async.ipp
/// The definitions behind strata/distribute/collective/async.hpp (BucketPlan, AsyncAllReduce):
/// included by it in the header-only mode, compiled once in src/strata.cpp under
/// STRATA_SEPARATE_COMPILATION.

#include "strata/distribute/collective/async.hpp"

namespace strata::distribute::collective {

STRATA_DECL BucketPlan::BucketPlan(std::span<const std::size_t> tensor_sizes, std::size_t element_bytes,
                                   std::size_t bucket_bytes) {
    STRATA_CHECK(element_bytes > 0, ValueError, "BucketPlan: element_bytes must be > 0");
    STRATA_CHECK(bucket_bytes > 0, ValueError, "BucketPlan: bucket_bytes must be > 0");
    offsets_.reserve(tensor_sizes.size());
    tensor_bucket_.reserve(tensor_sizes.size());
    const std::size_t cap = bucket_bytes / element_bytes > 0 ? bucket_bytes / element_bytes : 1;
    Bucket open;
    std::size_t offset = 0;
    for (std::size_t t = 0; t < tensor_sizes.size(); ++t) {
        const std::size_t n = tensor_sizes[t];
        if (open.length > 0 && n > 0 && open.length + n > cap) {
            buckets_.push_back(open);
            open = Bucket{t, 0, offset, 0};
        }
        ++open.tensor_count;
        open.length += n;
        offsets_.push_back(offset);
        tensor_bucket_.push_back(buckets_.size());
        offset += n;
    }
    if (open.tensor_count > 0) buckets_.push_back(open);
    total_ = offset;
}

STRATA_DECL const Bucket& BucketPlan::bucket(std::size_t b) const {
    STRATA_CHECK(b < buckets_.size(), ValueError, "BucketPlan: bucket ", b,
                 " does not exist; the plan has ", buckets_.size());
    return buckets_[b];
}

STRATA_DECL std::size_t BucketPlan::tensor_offset(std::size_t t) const {
    STRATA_CHECK(t < offsets_.size(), ValueError, "BucketPlan: tensor ", t,
                 " does not exist; the plan has ", offsets_.size());
    return offsets_[t];
}

STRATA_DECL std::size_t BucketPlan::bucket_of(std::size_t t) const {
    STRATA_CHECK(t < tensor_bucket_.size(), ValueError, "BucketPlan: tensor ", t,
                 " does not exist; the plan has ", tensor_bucket_.size());
    return tensor_bucket_[t];
}

STRATA_DECL AsyncAllReduce::AsyncAllReduce(ReplicaGroup& group, int rank, ReduceOp op, Algorithm algorithm)
    : group_(group), rank_(rank), op_(op), algorithm_(algorithm) {
    STRATA_CHECK(rank >= 0 && rank < group.size(), ValueError, "AsyncAllReduce: rank ",
                 rank, " is outside [0, ", group.size(), ")");
    worker_ = std::thread([this] { run(); });
}

STRATA_DECL void AsyncAllReduce::reserve(std::size_t jobs) {
    std::lock_guard lock(mutex_);
    queue_.reserve(jobs);
}

STRATA_DECL AsyncAllReduce::~AsyncAllReduce() {
    std::size_t pending = 0;
    {
        std::lock_guard lock(mutex_);
        pending = queue_.size() - next_ + (busy_ ? 1 : 0);
        stop_ = true;
    }
    if (pending > 0)
        group_.abort(rank_, "replica " + std::to_string(rank_) +
                                " destroyed its AsyncAllReduce with " +
                                std::to_string(pending) + " buckets pending");
    work_cv_.notify_all();
    worker_.join();
}

STRATA_DECL void AsyncAllReduce::wait() {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return next_ == queue_.size() && !busy_; });
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

STRATA_DECL std::size_t AsyncAllReduce::pending() const {
    std::lock_guard lock(mutex_);
    return queue_.size() - next_ + (busy_ ? 1 : 0);
}

STRATA_DECL void AsyncAllReduce::run() {
    std::unique_lock lock(mutex_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stop_ || next_ < queue_.size(); });
        if (stop_) return;
        const Job job = queue_[next_++];
        const bool skip = error_ != nullptr;
        busy_ = true;
        lock.unlock();

        std::exception_ptr failure;
        if (!skip) {
            try {
                reduce(job);
            } catch (...) {
                failure = std::current_exception();
                group_.abort(rank_, failure);
            }
        }

        lock.lock();
        busy_ = false;
        if (failure && !error_) error_ = failure;
        if (next_ == queue_.size()) {
            // Reuse the queue's storage: a steady-state step allocates nothing.
            queue_.clear();
            next_ = 0;
            done_cv_.notify_all();
        }
    }
}

STRATA_DECL void AsyncAllReduce::reduce(const Job& job) {
    const auto b = static_cast<std::int64_t>(job.bucket);
    if (job.type == detail::Slot::Type::Float)
        group_.all_reduce_impl(rank_, std::span<float>(static_cast<float*>(job.data), job.length),
                               op_, algorithm_, b);
    else
        group_.all_reduce_impl(rank_,
                               std::span<double>(static_cast<double*>(job.data), job.length),
                               op_, algorithm_, b);
}

}  // namespace strata::distribute::collective
