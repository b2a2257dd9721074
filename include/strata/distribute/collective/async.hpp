#pragma once
/// \file strata/distribute/collective/async.hpp
/// Asynchronous all-reduce of gradient buckets, overlapping communication with the rest of the
/// backward pass, as Horovod's tensor fusion (Sergeev & Del Balso 2018, "Horovod: fast and
/// easy distributed deep learning in TensorFlow") and PyTorch DDP's gradient buckets (Li et
/// al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training") do.
///
/// \code
///   BucketPlan plan(tensor_sizes_in_backward_order, sizeof(float));   // 4 MiB buckets
///   AsyncAllReduce comm(group, rank, ReduceOp::Mean);
///   for (std::size_t b = 0; b < plan.size(); ++b) {
///       compute_gradients_of(plan.bucket(b));          // backward, last layers first
///       comm.submit(b, plan.slice(std::span<float>(flat_grads), b));
///   }
///   comm.wait();                                        // all buckets reduced (or throws)
/// \endcode

#include <strata/core/error.hpp>
#include <strata/distribute/collective/all_reduce.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace strata::distribute::collective {

/// One bucket of a BucketPlan: the tensors [first_tensor, first_tensor + tensor_count) and the
/// elements [offset, offset + length) of the flat gradient buffer they occupy.
struct Bucket {
    std::size_t first_tensor = 0;
    std::size_t tensor_count = 0;
    std::size_t offset = 0;
    std::size_t length = 0;
};

/// Assigns the tensors of a flat gradient buffer to buckets of about `bucket_bytes` each.
///
/// Represents: a flat buffer holding tensors 0, 1, ... back to back, in the order their
/// gradients become ready (backward order: last layer first), cut into contiguous buckets of
/// consecutive whole tensors. A bucket is closed before the tensor that would take it past
/// `bucket_bytes`; a tensor larger than that gets a bucket of its own (tensors are never split,
/// so a bucket is ready exactly when its last tensor is).
///
/// Default bucket size, 4 MiB: a bucket must be large enough that the fixed cost of one
/// collective (alpha: three barrier rounds, i.e. thread wake-ups, for Direct) is small against
/// its transfer time (n beta), and small enough that the first bucket is ready early and the
/// last one, which cannot be overlapped, is short. With host all-reduce bandwidths of a few
/// GB/s (see docs/collectives.md for measured figures), 4 MiB takes on the order of a
/// millisecond, tens of times the per-call overhead measured there. (PyTorch DDP's 25 MiB and
/// Horovod's 64 MiB fusion buffer are tuned for network links, where alpha is far larger.)
///
/// Requires element_bytes > 0 and bucket_bytes > 0 (ValueError).
/// Example: `BucketPlan plan({1000, 10, 500000}, sizeof(float), 1 << 20);`
class BucketPlan {
public:
    static constexpr std::size_t default_bucket_bytes = std::size_t{4} << 20;

    STRATA_DECL BucketPlan(std::span<const std::size_t> tensor_sizes, std::size_t element_bytes,
                           std::size_t bucket_bytes = default_bucket_bytes);

    BucketPlan(std::initializer_list<std::size_t> tensor_sizes, std::size_t element_bytes,
               std::size_t bucket_bytes = default_bucket_bytes)
        : BucketPlan(std::span<const std::size_t>(tensor_sizes.begin(), tensor_sizes.size()),
                     element_bytes, bucket_bytes) {}

    /// Number of buckets.
    [[nodiscard]] std::size_t size() const noexcept { return buckets_.size(); }
    [[nodiscard]] STRATA_DECL const Bucket& bucket(std::size_t b) const;
    [[nodiscard]] const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
    /// Elements in the flat buffer (the sum of the tensor sizes).
    [[nodiscard]] std::size_t total_length() const noexcept { return total_; }
    /// Where tensor t starts in the flat buffer.
    [[nodiscard]] STRATA_DECL std::size_t tensor_offset(std::size_t t) const;
    /// The bucket tensor t belongs to.
    [[nodiscard]] STRATA_DECL std::size_t bucket_of(std::size_t t) const;
    /// Bucket b's part of the flat buffer. Requires flat.size() == total_length() (ShapeError).
    template <class T>
    [[nodiscard]] std::span<T> slice(std::span<T> flat, std::size_t b) const {
        STRATA_CHECK(flat.size() == total_, ShapeError, "BucketPlan::slice: the flat buffer has ",
                     flat.size(), " elements but the plan covers ", total_);
        const Bucket& k = bucket(b);
        return flat.subspan(k.offset, k.length);
    }

private:
    std::vector<Bucket> buckets_;
    std::vector<std::size_t> offsets_;
    std::vector<std::size_t> tensor_bucket_;
    std::size_t total_ = 0;
};

/// A per-replica communication thread that all-reduces submitted buckets in submission order
/// while the caller goes on computing.
///
/// Represents: rank `rank`'s side of a sequence of bucket all-reduces in `group`. Each rank
/// has its own AsyncAllReduce; their communication threads meet in the group's collectives.
///
/// Requires: all ranks submit the same buckets (same indices and lengths) in the same order;
/// a submitted span stays valid and untouched by the caller until wait() returns; submit()
/// and wait() are called from one thread (the replica's).
///
/// Ensures:
/// - submit() returns at once; buckets are reduced one after another, in order;
/// - wait() returns when every bucket submitted so far is reduced, or rethrows the first error
///   (then clears it). After an error the remaining and later buckets of this rank are not
///   reduced, and the group is aborted (so the other ranks fail promptly instead of waiting
///   for buckets that will not come); reset() the group before using it again;
/// - the destructor joins the thread. If buckets are still pending it aborts the group first
///   ("replica R destroyed its AsyncAllReduce with K buckets pending"), so it never waits for
///   a timeout.
class AsyncAllReduce {
public:
    /// Requires 0 <= rank < group.size() (ValueError).
    STRATA_DECL AsyncAllReduce(ReplicaGroup& group, int rank, ReduceOp op = ReduceOp::Mean,
                               Algorithm algorithm = Algorithm::Auto);
    AsyncAllReduce(const AsyncAllReduce&) = delete;
    AsyncAllReduce& operator=(const AsyncAllReduce&) = delete;

    STRATA_DECL ~AsyncAllReduce();

    /// Queues bucket `bucket`'s all-reduce of `data` (in place) and returns at once.
    /// If an earlier bucket failed, the bucket is dropped; wait() reports the failure.
    template <Reducible T>
    void submit(std::size_t bucket, std::span<T> data) {
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(Job{bucket, data.data(), data.size(), detail::type_of<T>});
        }
        work_cv_.notify_one();
    }

    /// Blocks until every submitted bucket is reduced; rethrows the first error, if any.
    STRATA_DECL void wait();

    /// Buckets submitted and not yet finished.
    [[nodiscard]] STRATA_DECL std::size_t pending() const;

    /// Makes room for `jobs` buckets between two waits, so that submit() never allocates when
    /// the communication thread falls behind (a training step's steady state allocates nothing).
    STRATA_DECL void reserve(std::size_t jobs);

private:
    struct Job {
        std::size_t bucket;
        void* data;
        std::size_t length;
        detail::Slot::Type type;
    };

    STRATA_DECL void run();

    STRATA_DECL void reduce(const Job& job);

    ReplicaGroup& group_;
    const int rank_;
    const ReduceOp op_;
    const Algorithm algorithm_;
    mutable std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::vector<Job> queue_;
    std::size_t next_ = 0;
    bool busy_ = false;
    bool stop_ = false;
    std::exception_ptr error_;
    std::thread worker_;  // last: started after every other member is constructed
};

}  // namespace strata::distribute::collective

#if STRATA_DEFINITIONS
#include "strata/distribute/collective/impl/async.ipp"
#endif
