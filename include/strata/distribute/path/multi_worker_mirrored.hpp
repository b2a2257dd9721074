#pragma once
/// \file strata/distribute/path/multi_worker_mirrored.hpp
/// The gradient path of `MultiWorkerMirrored<P, Synchronous>`: Mirrored's path
/// (path/mirrored.hpp) with a policy for what crosses processes. The all-reduce itself already
/// spans them (the strategy's replica group carries each bucket across processes through its
/// collective::OuterStage); this policy makes every process start from the same model, checks
/// that they compile the same optimizer and read global batches of the same size, sums the step
/// totals, evaluation figures and predictions over the processes, and runs the epoch in which
/// each worker reads its own input. Included by strata/distribute/multi_worker_mirrored.hpp.

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/distribute/path/mirrored.hpp"

namespace strata::distribute {

template <class P, class Sync>
class MultiWorkerMirrored;

namespace detail {

/// Mirrored's Across policy for a strategy S whose replicas span processes (S has a
/// process_group(): MultiWorkerMirrored).
template <class S>
class AcrossProcesses {
public:
    static constexpr bool spans_processes = true;
    explicit AcrossProcesses(S& s) : s_(&s) {}

    /// Every process starts from rank 0's values (tf.distribute's MultiWorkerMirrored broadcasts
    /// the initial variables from the chief too): a user who seeds each process differently
    /// still trains one model. First the processes agree that it is the same model.
    template <class Net, class T, class Path>
    void start(Path& path) {
        s_->template agree_model<Net, T>();
        auto w = path.get_weights();
        s_->process_group().broadcast(0, std::span<T>(w), 0, SyncPoint{"broadcast", "initial variables"});
        path.set_weights(w);
    }
    void compiled(const collective::Settings& agreed) { s_->agree(agreed, "compile's settings"); }
    void after_save() const { s_->process_group().barrier(0, SyncPoint{"barrier", "save"}); }
    void combine_totals(StepTotals& t) {
        double v[4] = {t.loss_sum, t.correct, double(t.examples), t.counted};
        s_->process_group().all_reduce(0, std::span<double>(v, 4), collective::ReduceOp::Sum, SyncPoint{"all_reduce", "step totals"});
        t.loss_sum = v[0];
        t.correct = v[1];
        t.counted = v[3];  // each process's units counted their own shares
        if (s_->per_worker_input()) t.examples = std::int64_t(v[2]);
    }
    bool per_worker_input() const { return s_->per_worker_input(); }
    template <class V>
    void sum_predictions(std::span<V> rows) {
        if (!s_->per_worker_input())
            s_->process_group().all_reduce(0, rows, collective::ReduceOp::Sum, SyncPoint{"all_reduce", "predictions"});
    }
    template <class V>
    void sum_evaluation(std::span<V> values) {
        s_->process_group().all_reduce(0, values, collective::ReduceOp::Sum, SyncPoint{"all_reduce", "evaluation"});
    }

    /// Every process reads the same global batches: they agree, once per epoch, on the first
    /// one's size (a process batching otherwise would train on other slices). With per-worker
    /// input, the joined epoch below.
    template <class Path, class Source, class Work, class OnStep>
    void run_epoch(Path& path, Source& source, std::uint64_t& step, Work& work, OnStep& on_step) {
        if (s_->per_worker_input()) {
            joined_epoch(path, source, step, work, on_step);
            return;
        }
        const auto* first = source.next();
        s_->agree_global_batch(first ? std::int64_t(first->size()) : -1);
        FirstThen<Source, std::remove_cvref_t<decltype(*first)>> rest{source, first};
        path.lockstep_epoch(rest, step, work, on_step);
    }

private:
    // A source whose first batch was taken already (to agree on its size).
    template <class Source, class B>
    struct FirstThen {
        Source& source;
        const B* first;
        bool given = false;
        const B* next() { return std::exchange(given, true) ? source.next() : first; }
    };

    // Each worker reads its own input: a step first agrees on who still has a batch and how
    // large each is; a worker whose input is exhausted joins with zero gradients and no
    // examples, the loss is divided by the examples that exist, and the epoch ends when no
    // worker has a batch left. The result equals one device on the concatenation of the
    // workers' batches of each step (worker 0's first).
    template <class Path, class Source, class Work, class OnStep>
    void joined_epoch(Path& path, Source& source, std::uint64_t& step_counter, Work& work, OnStep& on_step) {
        auto& pg = s_->process_group();
        const int workers = pg.size(), me = pg.rank(), n = path.units();
        bool exhausted = false;
        std::vector<double> sizes(static_cast<std::size_t>(workers));
        for (;;) {
            const auto* batch = exhausted ? nullptr : source.next();
            if (!batch) exhausted = true;
            std::fill(sizes.begin(), sizes.end(), -1.0);  // -1: no batch (every worker adds 1)
            sizes[std::size_t(me)] = batch ? double(batch->size()) : -1.0;
            for (auto& v : sizes) v += 1;  // own: size + 1; others: 0 (so the sum is size + 1 or 0)
            pg.all_reduce(0, std::span<double>(sizes), collective::ReduceOp::Sum, SyncPoint{"all_reduce", "batch sizes"});
            double total = 0, before = 0;
            bool any = false;
            for (int q = 0; q < workers; ++q) {
                const double sz = sizes[std::size_t(q)] - 1;  // -1: no batch
                if (sz < 0) continue;
                any = true;
                total += sz;
                if (q < me) before += sz;
            }
            if (!any) return;
            std::remove_cvref_t<decltype(*batch)> empty;
            const auto& mine = batch ? *batch : empty;
            StepTotals t = path.run_step(++step_counter, work, [&](int r) {
                auto b = split_batch(mine, n, r);
                b.first += std::int64_t(before);
                b.global_size = std::int64_t(total);
                return std::pair{b, total > 0 ? total : 1.0};
            });
            combine_totals(t);
            if (!on_step(t)) return;
        }
    }

    S* s_;
};

}  // namespace detail

template <class P, class Net, class T>
class GradientPath<MultiWorkerMirrored<P, sync::Synchronous>, Net, T>
    : public detail::MirroredPath<MultiWorkerMirrored<P, sync::Synchronous>, Net, T,
                                  detail::AcrossProcesses<MultiWorkerMirrored<P, sync::Synchronous>>> {
public:
    using detail::MirroredPath<MultiWorkerMirrored<P, sync::Synchronous>, Net, T,
                               detail::AcrossProcesses<MultiWorkerMirrored<P, sync::Synchronous>>>::MirroredPath;
};

}  // namespace strata::distribute
