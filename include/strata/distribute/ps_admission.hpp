#pragma once
/// \file strata/distribute/ps_admission.hpp
/// The parameter server's admission rules: one small class per sync mode (sync.hpp's table),
/// each saying what happens after a worker's push was admitted into the open update: whether
/// the update closes, who is cancelled, who starts again. Chosen at run time
/// (make_admission(), from ParameterServerConfig's rule, K and B), so that one instantiation of
/// the path serves every mode (the tool's `--sync`); a rule acts only through PsEpochMoves, the
/// coordinator's moves, and holds nothing of the epoch itself.
///
///   Synchronous    every worker computes on w_j; the update closes when all have pushed.
///   KSync<K>       every worker starts on w_j; the first K close the update, the rest are
///                  cancelled and everyone restarts on w_{j+1}.
///   KBatchSync<K>  a worker that pushed starts another mini-batch on w_j at once; the K-th
///                  push closes the update and cancels the unfinished ones.
///   KAsync<K>      a worker that pushed waits; K pushes close the update and the waiting
///                  workers pull w_{j+1}; nobody is cancelled.
///   KBatchAsync<K> a worker that pushed pulls the current version and goes on; every K pushes
///                  close an update.
///   Asynchronous<B> each push is an update; a worker that has finished c mini-batches starts
///                  its next only while c − min over workers ≤ B (stale synchronous parallel).
///
/// K-sync and K-batch-sync, K-async and K-batch-async: Dutta et al., "Slow and Stale Gradients
/// Can Win the Race" (AISTATS 2018); SSP: Ho et al. (NIPS 2013).

#include <algorithm>
#include <cstdint>
#include <memory>

#include "strata/core/error.hpp"
#include "strata/distribute/sync.hpp"

namespace strata::distribute::detail {

/// The moves an admission rule may make on the coordinator's epoch (ParameterServerCore's
/// coordinator implements them). Worker indices are 0 … workers() − 1.
class PsEpochMoves {
public:
    virtual int workers() const = 0;
    /// Pushes admitted into the open update.
    virtual int pending() const = 0;
    /// Workers the current round handed a mini-batch (the lockstep modes).
    virtual int round_started() const = 0;
    virtual bool virtual_clock() const = 0;
    /// Applies the open update on every server; false when fit wants no more updates.
    virtual bool close() = 0;
    /// Stops every computing worker (between layers of its backward) and waits for it.
    virtual void cancel_computing() = 0;
    /// Hands every worker still there a mini-batch on the current version (a new round).
    virtual void start_round() = 0;
    /// Hands worker w its next mini-batch (pulling first when its copy is older); nothing when
    /// the data is exhausted.
    virtual void dispatch(int w) = 0;
    /// Worker w waits for the update to close.
    virtual void wait(int w) = 0;
    virtual bool waiting(int w) const = 0;
    /// Virtual clock: worker w starts again once the other arrivals of this instant are in.
    virtual void defer(int w) = 0;
    virtual void clear_deferred() = 0;
    /// SSP: mini-batches worker w has finished beyond the slowest worker still there.
    virtual std::int64_t lead(int w) const = 0;
    /// SSP: worker w may not start (it is too far ahead); idle(w) lifts it.
    virtual void block(int w) = 0;
    virtual bool blocked(int w) const = 0;
    virtual void idle(int w) = 0;
    /// SSP: the gap a dispatch started with, into the epoch's figures.
    virtual void record_ssp_gap(std::int64_t gap) = 0;

protected:
    ~PsEpochMoves() = default;
};

/// A sync mode's admission rule.
class PsAdmission {
public:
    virtual ~PsAdmission() = default;
    /// Updates close rounds of dispatches (Synchronous, KSync, KBatchSync): an epoch starts
    /// with a round, and a mini-batch that finishes after its version was replaced is dropped.
    virtual bool rounds() const { return false; }
    /// The mode cannot go on without a lost worker (Synchronous).
    virtual bool needs_every_worker() const { return false; }
    /// Updates an epoch over `batches` (>= 0) mini-batches of `workers` workers makes (-1: not
    /// known ahead).
    virtual std::int64_t expected_updates(std::int64_t batches, int workers) const = 0;
    /// How many pushes an update takes when every worker keeps up (the loss scale's
    /// denominator: a worker's gradient is scaled as its share of such an update).
    virtual int pushes_per_update(int /*workers*/) const { return 1; }
    /// Worker w was just handed a mini-batch.
    virtual void dispatched(int /*w*/, PsEpochMoves&) {}
    /// Worker w's push was admitted into the open update: closes it when the rule says, and
    /// restarts whom the rule restarts. False when fit wants no more updates.
    virtual bool admitted(int w, PsEpochMoves& e) = 0;
};

/// Synchronous: the update closes when every worker of the round has pushed.
class SynchronousAdmission final : public PsAdmission {
public:
    bool rounds() const override { return true; }
    bool needs_every_worker() const override { return true; }
    int pushes_per_update(int workers) const override { return workers; }
    std::int64_t expected_updates(std::int64_t batches, int workers) const override { return (batches + workers - 1) / workers; }
    bool admitted(int w, PsEpochMoves& e) override {
        e.wait(w);
        if (e.pending() != e.round_started()) return true;
        e.cancel_computing();  // nobody is computing by then (a no-op)
        if (!e.close()) return false;
        e.start_round();
        return true;
    }
};

/// KSync<K>: the first K pushes of a round close the update; the rest are cancelled.
class KSyncAdmission final : public PsAdmission {
public:
    explicit KSyncAdmission(int k) : k_(k) {}
    int pushes_per_update(int) const override { return k_; }
    bool rounds() const override { return true; }
    std::int64_t expected_updates(std::int64_t batches, int workers) const override { return (batches + workers - 1) / workers; }
    bool admitted(int w, PsEpochMoves& e) override {
        e.wait(w);
        if (e.pending() != std::min(k_, e.round_started())) return true;
        e.cancel_computing();
        if (!e.close()) return false;
        e.start_round();
        return true;
    }

private:
    int k_;
};

/// KBatchSync<K>: a worker that pushed starts again on the same version; the K-th push closes
/// the update and cancels the unfinished mini-batches.
class KBatchSyncAdmission final : public PsAdmission {
public:
    explicit KBatchSyncAdmission(int k) : k_(k) {}
    int pushes_per_update(int) const override { return k_; }
    bool rounds() const override { return true; }
    std::int64_t expected_updates(std::int64_t, int) const override { return -1; }  // cancelled batches are not known ahead
    bool admitted(int w, PsEpochMoves& e) override {
        if (e.pending() == k_) {
            e.clear_deferred();
            e.cancel_computing();
            if (!e.close()) return false;
            e.start_round();
        } else if (e.virtual_clock()) {
            // Workers that finish at the same instant all arrive before any of them starts
            // again (a restart cannot finish at this instant): with equal compute times
            // K-batch-sync is then exactly synchronous.
            e.defer(w);
        } else {
            e.dispatch(w);
        }
        return true;
    }

private:
    int k_;
};

/// KAsync<K>: a worker that pushed waits; K pushes close the update and the waiting workers
/// start on the new version. Nobody is cancelled.
class KAsyncAdmission final : public PsAdmission {
public:
    explicit KAsyncAdmission(int k) : k_(k) {}
    int pushes_per_update(int) const override { return k_; }
    std::int64_t expected_updates(std::int64_t batches, int) const override { return (batches + k_ - 1) / k_; }
    bool admitted(int w, PsEpochMoves& e) override {
        e.wait(w);
        if (e.pending() != k_) return true;
        if (!e.close()) return false;
        for (int v = 0; v < e.workers(); ++v)
            if (e.waiting(v)) e.dispatch(v);
        return true;
    }

private:
    int k_;
};

/// KBatchAsync<K>: a worker that pushed goes on at once; every K pushes close an update.
class KBatchAsyncAdmission final : public PsAdmission {
public:
    explicit KBatchAsyncAdmission(int k) : k_(k) {}
    int pushes_per_update(int) const override { return k_; }
    std::int64_t expected_updates(std::int64_t batches, int) const override { return (batches + k_ - 1) / k_; }
    bool admitted(int w, PsEpochMoves& e) override {
        if (e.pending() == k_ && !e.close()) return false;
        e.dispatch(w);
        return true;
    }

private:
    int k_;
};

/// Asynchronous<B>: every push is an update; with a bound B >= 0 a worker more than B
/// mini-batches ahead of the slowest waits for it (stale synchronous parallel).
class AsynchronousAdmission final : public PsAdmission {
public:
    explicit AsynchronousAdmission(int bound) : bound_(bound) {}
    std::int64_t expected_updates(std::int64_t batches, int) const override { return batches; }
    void dispatched(int w, PsEpochMoves& e) override { e.record_ssp_gap(e.lead(w)); }
    bool admitted(int w, PsEpochMoves& e) override {
        if (!e.close()) return false;
        start_within_bound(w, e);
        for (int v = 0; v < e.workers(); ++v)
            if (e.blocked(v)) start_within_bound(v, e);
        return true;
    }

private:
    void start_within_bound(int w, PsEpochMoves& e) const {
        if (bound_ >= 0 && e.lead(w) > bound_) {
            e.block(w);
            return;
        }
        e.idle(w);
        e.dispatch(w);
    }
    int bound_;  // -1: unbounded
};

/// The admission rule of `rule` with its K and B (ParameterServerConfig's k() and
/// staleness_bound()).
inline std::unique_ptr<PsAdmission> make_admission(sync::Rule rule, int k, int bound) {
    switch (rule) {
    case sync::Rule::Synchronous: return std::make_unique<SynchronousAdmission>();
    case sync::Rule::KSync: return std::make_unique<KSyncAdmission>(k);
    case sync::Rule::KBatchSync: return std::make_unique<KBatchSyncAdmission>(k);
    case sync::Rule::KAsync: return std::make_unique<KAsyncAdmission>(k);
    case sync::Rule::KBatchAsync: return std::make_unique<KBatchAsyncAdmission>(k);
    case sync::Rule::Asynchronous: return std::make_unique<AsynchronousAdmission>(bound);
    }
    throw_error<ValueError>("ParameterServer: unknown sync rule ", int(rule));
}

}  // namespace strata::distribute::detail
