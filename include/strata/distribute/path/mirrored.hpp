#pragma once
/// \file strata/distribute/path/mirrored.hpp
/// The gradient path of `Mirrored<P, Synchronous>` and `MultiWorkerMirrored<P, Synchronous>`:
/// a copy of the variables (and of the optimizer slots) per replica; gradients are summed by an
/// all-reduce and every replica applies the same update to its own copy. The two strategies
/// differ only in their communicator and in one policy: MultiWorkerMirrored's replica group
/// carries each all-reduce across processes (collective::OuterStage), and its path's `Across`
/// policy (path/multi_worker_mirrored.hpp) agrees on the model, the optimizer and the batches
/// and sums step totals, evaluation figures and predictions over the processes; Mirrored's
/// (OneProcess, below) does nothing. On host memory the gradient buckets are
/// all-reduced by each replica's communication thread while backward goes on; in device
/// memory (logical GPUs of one GPU, or GPUs with peer access) each replica sums its slice of
/// every replica's gradient in place.

#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "strata/distribute/collective/async.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/strategy_classes.hpp"

namespace strata::distribute {

namespace detail {
// Across processes on GPUs: replica r sums its slice of every local replica's gradient into its
// own buffer only; the slice then crosses processes (NCCL), and DeviceSliceCopy hands it back.
template <class T>
struct DeviceSliceReduce {
    T* grads[16];
    int replicas, owner;
    std::int64_t first;
    STRATA_HD void operator()(std::int64_t i) const {
        T s = 0;
        for (int q = 0; q < replicas; ++q) s += grads[q][first + i];
        grads[owner][first + i] = s;
    }
};
template <class T>
struct DeviceSliceCopy {
    T* grads[16];
    int replicas, owner;
    std::int64_t first;
    STRATA_HD void operator()(std::int64_t i) const {
        for (int q = 0; q < replicas; ++q)
            if (q != owner) grads[q][first + i] = grads[owner][first + i];
    }
};
// Replica r sums its slice of every replica's gradient, in replica order, and writes the sum
// back into every replica's buffer; nobody else touches that slice, so it works in place. (At
// namespace scope: nvcc needs kernel functors it can name.)
template <class T>
struct DeviceSliceSum {
    T* grads[16];
    int replicas;
    std::int64_t first;
    STRATA_HD void operator()(std::int64_t i) const {
        T s = 0;
        for (int q = 0; q < replicas; ++q) s += grads[q][first + i];
        for (int q = 0; q < replicas; ++q) grads[q][first + i] = s;
    }
};
}  // namespace detail

namespace detail {

/// What Mirrored's path does across processes when its strategy spans none: nothing. A strategy
/// that spans processes gives its path another policy with the same members
/// (MultiWorkerMirrored's, in path/multi_worker_mirrored.hpp): the path itself is written once.
struct OneProcess {
    static constexpr bool spans_processes = false;
    template <class S>
    explicit OneProcess(S&) {}
    /// When the path's variables are built: make every process start from the same model.
    template <class Net, class T, class Path>
    void start(Path&) {}
    /// At compile: check that every process compiled with the same settings (loss, metrics, optimizer, precision).
    void compiled(const collective::Settings&) {}
    /// After the chief wrote a checkpoint: wait until the file is complete.
    void after_save() const {}
    /// Makes a step's totals global.
    void combine_totals(StepTotals&) {}
    /// Whether each process reads its own input (else every process reads the same batches).
    bool per_worker_input() const { return false; }
    /// Sums predictions / evaluation figures over the processes.
    template <class V>
    void sum_predictions(std::span<V>) {}
    template <class V>
    void sum_evaluation(std::span<V>) {}
    /// One epoch: the lockstep schedule, one step per global batch.
    template <class Path, class Source, class Work, class OnStep>
    void run_epoch(Path& path, Source& source, std::uint64_t& step, Work& work, OnStep& on_step) {
        path.lockstep_epoch(source, step, work, on_step);
    }
};

/// What of Mirrored's path depends on neither the network nor the processes (only on the
/// strategy S and the element type T): each replica's copy of the variables, the gradient
/// buckets over the flat buffer, and the all-reduce of a replica's gradients on host memory (in
/// one call after backward, or bucket by bucket on the replica's communication thread while
/// backward goes on). Its members are defined out of the class, so that the compiled part's
/// instantiations for the host (`extern template`, below) are the only ones a program uses.
template <class S, class T>
class MirroredCopies {
    using P = typename S::place_type;

public:
    /// A copy of `num_params` variables on each of the strategy's local replicas (allocated on
    /// the replica's thread, from its logical device's memory), and the buckets over the layers
    /// whose parameters start at `offsets` (one more offset than layers).
    MirroredCopies(S& s, std::int64_t num_params, std::span<const std::int64_t> offsets);
    ~MirroredCopies();
    MirroredCopies(const MirroredCopies&) = delete;
    MirroredCopies& operator=(const MirroredCopies&) = delete;

    T* params(int r) { return params_[std::size_t(r)].data(); }
    /// Gradient buckets a step all-reduces (StrategyOptions::bucket_bytes; 1 = after backward).
    std::size_t gradient_buckets() const { return buckets_.size(); }
    /// Whether a step combines gradients at all (more than one replica in sync).
    bool reduces() const { return s_->num_replicas_in_sync() > 1; }
    /// Whether the buckets are all-reduced beside backward (host memory, more than one bucket).
    bool overlapped() const { return place::host_accessible_v<P> && reduces() && buckets_.size() > 1; }

    /// Backward's hook: hands every bucket of replica r's gradients `grads` whose layers are
    /// complete (from parameter `first` on) to its communication thread.
    void gradient_ready(int r, std::int64_t first, T* grads);
    /// Overlapped: hands over what backward has not, then waits until every bucket is summed.
    void wait(int r, T* grads);
    /// Not overlapped: all-reduces replica r's whole gradient in one call.
    void all_reduce(int r, T* grads);

    /// Sums `values` over every replica in sync (a layer's statistics, during a pass). With
    /// buckets in flight on the communication thread it goes through that thread, after them,
    /// so that every replica's collectives keep one order; else straight through the group.
    void sum_statistics(int r, std::span<double> values);

    /// Replica 0's copy, on the host.
    std::vector<T> get_weights() const;
    /// Every copy set to `w`.
    void set_weights(const std::vector<T>& w);

private:
    // Buckets over the flat gradient buffer, in the order backward produces them (last layer
    // first): each a contiguous range [first, first + count) of whole layers, planned by
    // collective::BucketPlan over the layers' parameter blocks.
    struct Bucket {
        std::int64_t first = 0, count = 0;
    };
    void plan_buckets(std::span<const std::int64_t> offsets);
    collective::AsyncAllReduce& comm_of(int r);

    S* s_;
    std::int64_t num_params_;
    std::vector<Tensor<T, P>> params_;
    std::vector<Bucket> buckets_;
    std::vector<std::size_t> next_bucket_;
    std::vector<std::unique_ptr<collective::AsyncAllReduce>> comm_;
};

template <class S, class T>
MirroredCopies<S, T>::MirroredCopies(S& s, std::int64_t num_params, std::span<const std::int64_t> offsets)
    : s_(&s), num_params_(num_params) {
    const auto n = std::size_t(s.local_replicas());
    params_.resize(n);
    comm_.resize(n);
    s.run_replicas([&](int r) { params_[std::size_t(r)].resize(Shape{num_params_}); });
    plan_buckets(offsets);
}

template <class S, class T>
MirroredCopies<S, T>::~MirroredCopies() = default;

template <class S, class T>
void MirroredCopies<S, T>::plan_buckets(std::span<const std::int64_t> off) {
    next_bucket_.assign(params_.size(), 0);
    const std::size_t layers = off.size() - 1;
    std::vector<std::size_t> sizes, layer_of;
    for (std::size_t l = layers; l-- > 0;)
        if (off[l + 1] > off[l]) {
            sizes.push_back(std::size_t(off[l + 1] - off[l]));
            layer_of.push_back(l);
        }
    if (sizes.empty()) return;
    const std::size_t bytes = s_->options().bucket_bytes;
    if (bytes == 0) {  // one all-reduce after the whole backward pass
        buckets_.push_back({0, num_params_});
        return;
    }
    const collective::BucketPlan plan(sizes, sizeof(T), bytes);
    for (const auto& b : plan.buckets()) {
        const std::size_t highest = layer_of[b.first_tensor];
        const std::size_t lowest = layer_of[b.first_tensor + b.tensor_count - 1];
        buckets_.push_back({off[lowest], off[highest + 1] - off[lowest]});
    }
}

template <class S, class T>
collective::AsyncAllReduce& MirroredCopies<S, T>::comm_of(int r) {
    auto& c = comm_[std::size_t(r)];
    if (!c) {
        c = std::make_unique<collective::AsyncAllReduce>(s_->group(), r, collective::ReduceOp::Sum, s_->options().all_reduce);
        // A step submits every bucket before its wait: however far the thread falls behind, the
        // queue never holds more, so the steady state never allocates.
        c->reserve(buckets_.size() + 1);
    }
    return *c;
}

template <class S, class T>
void MirroredCopies<S, T>::gradient_ready(int r, std::int64_t first, T* grads) {
    if (!overlapped()) return;
    auto& next = next_bucket_[std::size_t(r)];
    while (next < buckets_.size() && buckets_[next].first >= first) {
        const auto& b = buckets_[next];
        comm_of(r).submit(next, std::span<T>(grads + b.first, std::size_t(b.count)));
        ++next;
    }
}

template <class S, class T>
void MirroredCopies<S, T>::wait(int r, T* grads) {
    gradient_ready(r, 0, grads);  // whatever the backward hook has not handed over yet
    comm_of(r).wait();
    next_bucket_[std::size_t(r)] = 0;
}

template <class S, class T>
void MirroredCopies<S, T>::all_reduce(int r, T* grads) {
    s_->group().all_reduce(r, std::span<T>(grads, std::size_t(num_params_)), collective::ReduceOp::Sum, s_->options().all_reduce);
}

template <class S, class T>
void MirroredCopies<S, T>::sum_statistics(int r, std::span<double> values) {
    if (overlapped()) {
        auto& c = comm_of(r);
        c.submit(buckets_.size(), values);
        c.wait();
    } else {
        s_->group().all_reduce(r, values, collective::ReduceOp::Sum, s_->options().all_reduce);
    }
}

template <class S, class T>
std::vector<T> MirroredCopies<S, T>::get_weights() const {
    return to_vector(TensorView<T, P>(const_cast<T*>(params_[0].data()), Shape{num_params_}));
}

template <class S, class T>
void MirroredCopies<S, T>::set_weights(const std::vector<T>& w) {
    for (auto& p : params_) copy(TensorView<T, place::Host>(const_cast<T*>(w.data()), Shape{num_params_}), p.view());
}

/// The mirrored path, for a strategy S with a copy of the variables per replica; `Across` is
/// what it does beyond its process (OneProcess, or MultiWorkerMirrored's policy).
template <class S, class Net, class T, class Across = OneProcess>
class MirroredPath : public LockstepPath<MirroredPath<S, Net, T, Across>, S, Net, T> {
    using Strategy = S;
    using Base = LockstepPath<MirroredPath, Strategy, Net, T>;
    using P = typename S::place_type;
    static constexpr std::int64_t num_params = Net::num_params;

public:
    // The defaults this path takes, by name (PathBase says why).
    using Base::lockstep, Base::pipelined, Base::captures_step, Base::unit_network, Base::model_summary;
    using Base::expected_updates, Base::end_epoch, Base::gathers_state, Base::bind_unit, Base::end_step;
    using Base::syncs_batch_statistics, Base::replica_sum, Base::run_where_loss_runs;

    template <class Init>
    MirroredPath(Strategy& s, Init&& init) : Base(s), copies_(s, num_params, std::span<const std::int64_t>(Net::offsets)), across_(s) {
        // Every copy starts from the same values (the initializers' streams depend on the seed
        // only), so the replicas are in sync from step 0.
        for (int r = 0; r < this->units(); ++r) init(copies_.params(r));
        across_.template start<Net, T>(*this);
    }

    /// The lockstep schedule, for the Across policy's run_epoch.
    template <class Source, class Work, class OnStep>
    void lockstep_epoch(Source& source, std::uint64_t& step, Work& work, OnStep& on_step) {
        Base::run_epoch(source, step, work, on_step);
    }
    Strategy& strategy() { return *this->strategy_; }

    T* params(int r) { return copies_.params(r); }
    /// Gradient buckets a step all-reduces (StrategyOptions::bucket_bytes; 1 = after backward).
    std::size_t gradient_buckets() const { return copies_.gradient_buckets(); }

    void compile(const optim::Optimizer& o, const collective::Settings& agreed) {
        across_.compiled(agreed);
        this->opt_.states.clear();
        this->opt_.states.resize(std::size_t(this->units()));
        const auto moving = detail::moving_ranges<Net>();
        // Slots on each replica's device, as its variables.
        this->run_units([&](int r) { this->opt_.states[std::size_t(r)] = optim::OptimizerState<T, P>(o, num_params, moving); });
    }

    /// Backward's hook: hands every completed bucket to replica r's communication thread, which
    /// all-reduces it while backward goes on.
    void gradient_ready(int r, std::int64_t first) { copies_.gradient_ready(r, first, this->grads(r)); }
    /// A layer's statistics summed over the replicas (LockstepPath::replica_sum calls it).
    void sum_over_replicas(int r, std::span<double> values) { copies_.sum_statistics(r, values); }

    void apply(int r) {
        T* g = this->grads(r);
        if constexpr (!place::host_accessible_v<P>) {
            if (copies_.reduces()) device_all_reduce(r);
        } else if (copies_.overlapped()) {
            STRATA_PROFILE_MODEL("all-reduce (wait)");
            copies_.wait(r, g);
        } else if (copies_.reduces()) {
            STRATA_PROFILE_MODEL("all-reduce");
            copies_.all_reduce(r, g);
        }
        this->opt_.states[std::size_t(r)].apply(params(r), g);
    }

    std::vector<T> get_weights() const { return copies_.get_weights(); }
    void set_weights(const std::vector<T>& w) { copies_.set_weights(w); }
    void log_placement() { detail::log_variable_copies(&Net::parameters, this->strategy_->devices(), this->units()); }

    // ---- what crosses processes (nothing under Mirrored): the Across policy -----------------

    bool is_chief() const { return this->strategy_->is_chief(); }
    /// After the chief wrote a checkpoint: every process waits until the file is complete.
    void after_save() const { across_.after_save(); }
    /// Sums the step's loss and correct count over the processes, so that every process logs
    /// the global figures.
    void combine_totals(StepTotals& t) { across_.combine_totals(t); }
    bool per_worker_input() const { return across_.per_worker_input(); }
    /// predict: rows of the other processes' replicas are zeros here; summing gives them all
    /// (with per-worker input every worker predicts its own examples, nothing to combine).
    void sum_outputs_over_workers(std::span<T> rows) { across_.sum_predictions(rows); }
    template <class V>
    void sum_over_workers(std::span<V> values) {
        across_.sum_evaluation(values);
    }

    /// Unit r's share of a batch: of the global batch (every process reads the same one), or,
    /// when each worker reads its own input, of this worker's batch.
    template <class Y>
    ReplicaBatch<Y> unit_share(const data::Batch<Y>& batch, int r) const {
        if (across_.per_worker_input()) return split_batch(batch, this->units(), r);
        return Base::unit_share(batch, r);
    }
    /// unit_share's largest: of this worker's batch over its units, or of the global batch.
    std::int64_t largest_unit_share(std::int64_t n) const {
        if (across_.per_worker_input()) return (n + this->units() - 1) / this->units();
        return Base::largest_unit_share(n);
    }

    /// The schedule: the Across policy's (one step per global batch, agreed across processes).
    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        across_.run_epoch(*this, source, step, work, on_step);
    }
private:
    void device_all_reduce(int r) {
        const int n = this->units();
        STRATA_CHECK(n <= 16, ValueError, "Mirrored on a device place: at most 16 replicas, got ", n);
        P::synchronize();  // this replica's gradients are complete
        this->strategy_->group().barrier(r);
        const auto sl = replica_slice(num_params, n, r);
        if constexpr (Across::spans_processes) {
            // Sum the slice here, across processes (NCCL on lane r), then hand it to the others.
            detail::DeviceSliceReduce<T> f{{}, n, r, sl.first};
            detail::DeviceSliceCopy<T> g{{}, n, r, sl.first};
            for (int q = 0; q < n; ++q) f.grads[q] = g.grads[q] = this->grads(q);
            if (sl.count > 0) place::for_each_n<P>(sl.count, f);
            P::synchronize();
            this->strategy_->sum_device_across(r, this->grads(r) + sl.first, std::size_t(sl.count));
            if (sl.count > 0 && n > 1) place::for_each_n<P>(sl.count, g);
        } else {
            detail::DeviceSliceSum<T> f{{}, n, sl.first};
            for (int q = 0; q < n; ++q) f.grads[q] = this->grads(q);
            if (sl.count > 0) place::for_each_n<P>(sl.count, f);
        }
        P::synchronize();
        this->strategy_->group().barrier(r);  // every slice summed: all buffers hold the total
    }

    MirroredCopies<S, T> copies_;
    Across across_;
};

}  // namespace detail

#if STRATA_INSTANCES
// Mirrored's copies on the host are compiled once in the compiled part.
STRATA_TEMPLATE class detail::MirroredCopies<Mirrored<place::Host, sync::Synchronous>, float>;
STRATA_TEMPLATE class detail::MirroredCopies<Mirrored<place::Host, sync::Synchronous>, double>;
#endif

template <class P, class Net, class T>
class GradientPath<Mirrored<P, sync::Synchronous>, Net, T> : public detail::MirroredPath<Mirrored<P, sync::Synchronous>, Net, T> {
public:
    using detail::MirroredPath<Mirrored<P, sync::Synchronous>, Net, T>::MirroredPath;
};

}  // namespace strata::distribute
