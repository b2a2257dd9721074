#pragma once
/// \file strata/distribute/distributed_dataset.hpp
/// tf.distribute's `experimental_distribute_dataset`: each global batch of a dataset is split
/// across the replicas. Replica r gets examples [first_r, first_r + count_r) where
/// count_r = global / N, plus one for the first global % N replicas: every example is used
/// exactly once, also when the global batch does not divide by N. Losses are scaled by the
/// *global* batch size so that the replicas' summed gradients are exactly the gradient of the
/// mean loss over the global batch (docs/distribution.md).

#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

#include "strata/data/dataset.hpp"
#include "strata/distribute/slice.hpp"

namespace strata::distribute {

/// One replica's share of a global batch (views into the global batch's buffers).
template <class Y>
struct ReplicaBatch {
    std::span<const float> x;
    std::span<const Y> y;
    std::span<const float> w;      ///< sample weights, one per example (size); empty: unweighted
    std::int64_t size = 0;         ///< examples for this replica (may be 0)
    std::int64_t global_size = 0;  ///< examples in the whole global batch
    std::int64_t first = 0;        ///< index of this replica's first example in the global batch
    std::int64_t example_size = 0;
    std::int64_t y_per_example = 1;
};

/// Replica `r`'s share of `batch` among `replicas`.
template <class Y>
ReplicaBatch<Y> split_batch(const data::Batch<Y>& batch, int replicas, int r) {
    const auto n = std::int64_t(batch.size());
    const auto sl = replica_slice(n, replicas, r);
    const auto es = std::int64_t(batch.example_size()), yp = std::int64_t(batch.y_per_example());
    ReplicaBatch<Y> b;
    b.size = sl.count;
    b.global_size = n;
    b.first = sl.first;
    b.example_size = es;
    b.y_per_example = yp > 0 ? yp : 1;
    b.x = batch.x.subspan(std::size_t(sl.first * es), std::size_t(sl.count * es));
    b.y = batch.y.subspan(std::size_t(sl.first * b.y_per_example), std::size_t(sl.count * b.y_per_example));
    // The weights are split with their examples; an unweighted batch gives every replica none.
    if (!batch.w.empty()) b.w = batch.w.subspan(std::size_t(sl.first), std::size_t(sl.count));
    return b;
}

/// A global batch seen by the replicas: `batch[r]` is replica r's share.
template <class Y>
class DistributedBatch {
public:
    DistributedBatch(const data::Batch<Y>* global, int replicas) : global_(global), replicas_(replicas) {}
    ReplicaBatch<Y> operator[](int r) const { return split_batch(*global_, replicas_, r); }
    const data::Batch<Y>& global() const { return *global_; }
    std::int64_t global_size() const { return std::int64_t(global_->size()); }
    int num_replicas() const { return replicas_; }

private:
    const data::Batch<Y>* global_;
    int replicas_;
};

/// A dataset whose global batches are split across a strategy's replicas.
///
/// \code
/// auto dist = strata::distribute::distribute_dataset(strategy, train.batch(128));   // 128 = global batch
/// for (auto it = dist.iterate(epoch); it != std::default_sentinel; ++it) {
///     auto losses = strategy.run([&](auto& ctx) { return step(ctx, (*it)[ctx.replica_id_in_sync_group()]); });
/// }
/// \endcode
template <class Y>
class DistributedDataset {
public:
    DistributedDataset(data::Dataset<Y> ds, int replicas) : ds_(std::move(ds)), replicas_(replicas) {
        STRATA_CHECK(ds_.batch_size() > 0, ValueError,
                     "distribute_dataset: batch the dataset first (.batch(global_batch_size)); each global batch is "
                     "split across the replicas");
    }
    class Iterator {
    public:
        Iterator(typename data::Dataset<Y>::Iterator it, int replicas) : it_(std::move(it)), replicas_(replicas) {}
        DistributedBatch<Y> operator*() const { return DistributedBatch<Y>(&*it_, replicas_); }
        Iterator& operator++() {
            ++it_;
            return *this;
        }
        friend bool operator==(const Iterator& i, std::default_sentinel_t s) { return i.it_ == s; }

    private:
        typename data::Dataset<Y>::Iterator it_;
        int replicas_;
    };
    Iterator iterate(std::uint64_t epoch) const { return Iterator(ds_.iterate(epoch), replicas_); }
    const data::Dataset<Y>& dataset() const { return ds_; }
    int num_replicas() const { return replicas_; }

private:
    data::Dataset<Y> ds_;
    int replicas_;
};

/// Splits every global batch of `ds` across `strategy`'s replicas.
template <class S, class Y>
DistributedDataset<Y> distribute_dataset(S& strategy, const data::Dataset<Y>& ds) {
    return DistributedDataset<Y>(ds, strategy.num_replicas_in_sync());
}

}  // namespace strata::distribute
