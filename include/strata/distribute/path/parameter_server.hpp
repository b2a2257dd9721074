#pragma once
/// \file strata/distribute/path/parameter_server.hpp
/// The gradient path of `ParameterServer<P, Sync>`: shards on servers, workers that pull
/// version-stamped copies and push gradients, and a coordinator (the caller's thread) that
/// admits pushes into updates by the sync mode's rule (sync.hpp's table; ps_admission.hpp).
///
/// An update applies the mean gradient of its pushes: workers compute with the loss summed over
/// their examples, and each server divides the sum of its inbox by the update's example count.
/// Staleness of a push = updates applied between its pull and its admission.
///
/// An epoch ends when the data runs out (the last, partial update is applied) or when fit's
/// steps_per_epoch updates are done; mini-batches still in flight then are cancelled, so work
/// never straddles an epoch (evaluation and checkpoints see a quiet model).
///
/// The parts, each in its own header, one at a time:
///   ps_shards.hpp       what a server and a worker hold (PsServer, PsWorkerCopy)
///   ps_admission.hpp    one admission rule per sync mode (PsAdmission), chosen at run time
///   ps_clock.hpp        the real or virtual clock and the straggler draws (PsClock)
///   ps_worker_pool.hpp  the coordinator's hand-off to the worker threads (PsWorkerPool)
///   ps_transport.hpp    pull, push and apply: in process, or the coordinator's messages (PsTransport)
///   ps_messages.hpp     the messages across processes; ps_ranks.hpp the server and worker ranks' loops
/// This file wires them: ParameterServerCore owns the state that outlives an epoch, and its
/// Coordinator runs one epoch as a loop over them.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/parameter_server_strategy.hpp"
#include "strata/distribute/parameter_server_stats.hpp"
#include "strata/distribute/ps_admission.hpp"
#include "strata/distribute/ps_clock.hpp"
#include "strata/distribute/ps_messages.hpp"
#include "strata/distribute/ps_ranks.hpp"
#include "strata/distribute/ps_shards.hpp"
#include "strata/distribute/ps_transport.hpp"
#include "strata/distribute/ps_worker_pool.hpp"
#include "strata/distribute/replica_pool.hpp"

namespace strata::distribute {

namespace detail {

/// What of ParameterServer's path depends on neither the network nor the sync type: the
/// servers and their shards, the workers' copies, the coordinator that admits pushes by the
/// mode's rule (chosen at run time: ParameterServerConfig), the processes' messages. Templated
/// on the place and the element type only; its members are defined out of the class, so that
/// the compiled part's instantiations for the host (`extern template`, below) are the only ones
/// a program uses. GradientPath<ParameterServer<P, Sync>, Net, T> hands it the network's
/// variables and its units of work.
template <class P, class T>
class ParameterServerCore {
public:
    /// A unit of work on one mini-batch (Model's): ps_ranks.hpp's PsWork.
    template <class Y>
    using Work = PsWork<T, Y>;
    /// The next mini-batch, or none when the data is exhausted.
    template <class Y>
    using Next = FunctionRef<std::optional<ReplicaBatch<Y>>()>;
    /// After every update, its totals; false: no more updates.
    using OnStep = FunctionRef<bool(const StepTotals&)>;

    /// `infos`: the network's variables (num_params values in all); `model_settings`: what
    /// every process must share of the model (asked across processes only); `init`: writes
    /// the initial values.
    ParameterServerCore(ReplicaRuntime<P>& runtime, const ParameterServerConfig& config, std::int64_t num_params,
                        std::vector<nn::ParamInfo> infos, FunctionRef<collective::Settings()> model_settings,
                        FunctionRef<void(T*)> init);
    ~ParameterServerCore();
    ParameterServerCore(const ParameterServerCore&) = delete;
    ParameterServerCore& operator=(const ParameterServerCore&) = delete;

    int units() const { return num_workers_; }
    /// Across processes only the coordinator (rank 0) prints and writes files.
    bool is_chief() const { return !remote_ || remote_->role() == Role::Coordinator; }
    /// evaluate and predict: `f(w)` on every worker's thread, between epochs only.
    void run_units(FunctionRef<void(int)> f) {
        STRATA_CHECK(!in_epoch_, ValueError,
                     "ParameterServer: evaluate/predict cannot run inside an epoch (the workers are busy training); call "
                     "them between epochs (fit's validation_data does) or after fit");
        runtime_->run_replicas(f);
    }

    void compile(const optim::Optimizer& o, const collective::Settings& agreed);

    /// Every worker pulls the current version (evaluate and predict compute with it).
    void prepare_inference() {
        for (int w = 0; w < num_workers_; ++w) transport_.pull(w, version_);
    }
    const T* inference_params(int w) { return workers_[std::size_t(w)].params.data(); }

    /// Runs mini-batches from `next` (each one worker's) until it is exhausted or `on_step`
    /// says stop: updates by the mode's rule, `on_step(StepTotals)` after every update.
    template <class Y>
    void epoch_run(Next<Y> next, std::uint64_t& step, Work<Y> work, OnStep on_step);

    // ---- the schedule -----------------------------------------------------------------------

    /// Updates an epoch over `batches` mini-batches is expected to make (-1: not known ahead).
    std::int64_t expected_updates(std::int64_t batches) const {
        return batches < 0 ? -1 : admission_->expected_updates(batches, num_workers_);
    }

    // ---- figures ----------------------------------------------------------------------------

    /// Counts of the last epoch (or train_step), and since the path was built.
    const ParameterServerStats& epoch_stats() const { return epoch_; }
    const ParameterServerStats& stats() const { return total_; }
    /// Called after every update with its record (e.g. to plot error against time).
    void set_update_observer(std::function<void(const UpdateRecord&)> f) { observer_ = std::move(f); }
    /// Clock seconds since the path was built (virtual under Clock::Virtual).
    double clock_seconds() const { return clock_.seconds(); }
    std::int64_t version() const { return version_; }
    /// Across processes: the workers lost so far (killed or stalled past the deadline) under a
    /// mode that goes on without them (every mode but Synchronous), in the order they were lost.
    const std::vector<int>& lost_workers() const { return lost_; }

    std::vector<std::int64_t> staleness_histogram() const { return epoch_.histogram; }

    /// The shard plan: which rows of which variable each server holds.
    const std::vector<ShardRange>& shards() const { return shards_; }

    // ---- variables ----------------------------------------------------------------------------

    std::vector<T> get_weights() const {
        std::vector<T> out(static_cast<std::size_t>(num_params_));
        for (const auto& srv : servers_) srv.gather(srv.params, out);
        return out;
    }
    void set_weights(const std::vector<T>& w) {
        for (auto& srv : servers_) srv.scatter(w, srv.params);
        ++version_;  // workers holding an older copy pull again
    }
    std::vector<std::pair<std::string, std::vector<T>>> slots() const {
        std::vector<std::pair<std::string, std::vector<T>>> out;
        if (!compiled_) return out;
        for (auto& [name, t] : const_cast<optim::OptimizerState<T, P>&>(servers_[0].opt).slots()) {
            std::vector<T> v(static_cast<std::size_t>(num_params_));
            for (const auto& srv : servers_)
                for (auto& [n2, t2] : const_cast<optim::OptimizerState<T, P>&>(srv.opt).slots())
                    if (n2 == name) srv.gather(t2, v);
            out.emplace_back(name, std::move(v));
        }
        return out;
    }
    bool set_slot(const std::string& name, const std::vector<T>& v) {
        bool found = false;
        for (auto& srv : servers_)
            for (auto& [n, t] : srv.opt.slots())
                if (n == name) {
                    srv.scatter(v, t);
                    found = true;
                }
        return found;
    }
    std::string optimizer_name() const { return compiled_ ? servers_[0].opt.name() : std::string(); }
    std::int64_t iterations() const { return compiled_ ? servers_[0].opt.iterations() : 0; }
    void set_iterations(std::int64_t it) {
        for (auto& srv : servers_) srv.opt.set_iterations(it);
    }
    double learning_rate() const { return compiled_ ? servers_[0].opt.current_learning_rate() : 0.0; }
    void set_learning_rate(double lr) {
        for (auto& srv : servers_) srv.opt.set_learning_rate(lr);
    }
    // The dynamic loss scale (precision::MixedFloat16): every server holds the same state, since
    // each decides from the whole update's sum of squares (PsTransport::apply).
    optim::LossScaleState loss_scale_state() const { return compiled_ ? servers_[0].opt.loss_scale_state() : optim::LossScaleState{}; }
    bool scales_loss() const { return compiled_ && servers_[0].opt.scales_loss(); }
    void set_loss_scale_state(const optim::LossScaleState& s) {
        for (auto& srv : servers_) srv.opt.set_loss_scale_state(s);
    }

    void log_placement() {
        if (!place::get_log_device_placement()) return;
        const auto& infos = infos_;
        const auto& devs = config_->server_devices();
        for (const auto& sh : shards_) {
            const auto& p = infos[std::size_t(sh.variable)];
            place::log_placement("variable " + p.name + " " + p.shape.str() + " shard " + std::to_string(sh.shard) + " rows [" +
                                     std::to_string(sh.row_first) + ", " + std::to_string(sh.row_first + sh.row_count) + ")",
                                 devs[std::size_t(sh.server)]);
        }
    }

private:
    using Role = ParameterServerProcesses::Role;
    using Job = PsWorkerPool::Job;
    using Result = PsWorkerPool::Result;
    enum class State { Idle, Computing, Waiting, Blocked, Lost };
    // One epoch as the coordinator runs it (defined below).
    template <class Y>
    class Coordinator;

    void plan();

    ReplicaRuntime<P>* runtime_;
    const ParameterServerConfig* config_;
    std::int64_t num_params_;
    std::vector<nn::ParamInfo> infos_;  // the network's variables
    ParameterServerProcesses* remote_;  // across processes: roles and messages; null in one process
    std::vector<int> lost_;             // across processes: workers lost (their indices)
    int num_workers_;                   // W: the workers (lost ones included)
    std::vector<ShardRange> shards_;
    std::vector<PsServer<P, T>> servers_;
    std::vector<PsWorkerCopy<P, T>> workers_;
    PsTransport<P, T> transport_;              // pull, push, apply; the servers' threads
    std::unique_ptr<PsAdmission> admission_;  // the sync mode's rule
    PsClock clock_;
    PsWorkerPool pool_;  // coordinator ↔ worker threads
    bool compiled_ = false, in_epoch_ = false;
    std::int64_t version_ = 0;
    ParameterServerStats epoch_, total_;
    std::function<void(const UpdateRecord&)> observer_;
};

/// One epoch of ParameterServerCore as the coordinator (the caller's thread) runs it: hands
/// mini-batches to the workers, takes their results in the clock's order, admits each push and
/// lets the sync mode's rule (PsAdmission) close updates and restart workers through the moves
/// of PsEpochMoves. Owns what lasts an epoch: each worker's mini-batch and state, the open
/// update's totals, the restarts deferred to the end of an instant (virtual clock).
template <class P, class T>
template <class Y>
class ParameterServerCore<P, T>::Coordinator final : public PsEpochMoves {
public:
    Coordinator(ParameterServerCore& core, Next<Y> next, std::uint64_t& step, Work<Y> work, OnStep on_step)
        : c_(core), rule_(*core.admission_), next_(next), step_(step), work_(work), on_step_(on_step),
          owned_(std::size_t(core.num_workers_)), state_(std::size_t(core.num_workers_), State::Idle),
          completed_(std::size_t(core.num_workers_), 0) {
        for (int w : c_.lost_) state_[std::size_t(w)] = State::Lost;  // lost in an earlier epoch
        c_.epoch_ = ParameterServerStats{};
        epoch_start_ = c_.clock_.begin_epoch(c_.num_workers_);
        // Under the virtual clock at most `slots` jobs compute at a time, soonest virtual finish
        // first: the schedule depends on the drawn times only, so a mini-batch that will be
        // cancelled before it would finish is never computed unless a core would otherwise be idle.
        c_.pool_.begin_epoch(std::max(1, hardware_threads() / std::max(1, c_.runtime_->devices()[0].cores)));
    }

    /// The coordinator's loop: until the data runs out or fit wants no more updates.
    void run() {
        if (rule_.rounds()) start_round();
        else
            for (int w = 0; w < workers(); ++w) hand_out(w);
        for (bool stopping = false; !stopping;) {
            release_deferred();
            if (computing() == 0) {
                // Nothing in flight: the data ran out (apply what has arrived), or waiting
                // workers can go on.
                if (pending_ > 0 && !close()) break;
                if (rule_.rounds()) start_round();
                else
                    for (int w = 0; w < workers(); ++w)
                        if (state_[std::size_t(w)] != State::Computing) hand_out(w);
                if (computing() == 0) break;
                continue;
            }
            const int w = next_finished();
            const Result r = take(w);
            if (r.failed && r.lost) {
                lose(w, r);
                continue;
            }
            if (r.failed) fail(w, r.error);
            state_[std::size_t(w)] = State::Idle;
            ++completed_[std::size_t(w)];
            if (rule_.rounds() && c_.workers_[std::size_t(w)].version != c_.version_) {  // finished after its update closed
                c_.transport_.discard(w, c_.pool_.job(w).step);
                ++c_.epoch_.dropped;
                continue;
            }
            admit(w, r.work);
            stopping = !rule_.admitted(w, *this);
        }
        cancel_computing();
        c_.epoch_.seconds = c_.clock_.now() - epoch_start_;
        c_.total_.add(c_.epoch_);
        c_.pool_.finish();
    }

    /// Worker w's thread: computes the jobs handed to it until the epoch ends.
    void serve(int w) {
        c_.pool_.serve(w, [&](const Job& job, std::atomic<bool>& cancel) { return compute(w, job, cancel); });
    }

    // ---- PsEpochMoves: what the admission rule may do ----------------------------------------------

    int workers() const override { return c_.num_workers_; }
    int pending() const override { return pending_; }
    int round_started() const override { return round_started_; }
    bool virtual_clock() const override { return c_.clock_.is_virtual(); }
    bool close() override;
    void cancel_computing() override;
    void start_round() override {
        round_started_ = 0;
        for (int w = 0; w < workers(); ++w) {
            if (state_[std::size_t(w)] == State::Lost) continue;
            if (!hand_out(w)) break;
            ++round_started_;
        }
    }
    void dispatch(int w) override { hand_out(w); }
    void wait(int w) override { state_[std::size_t(w)] = State::Waiting; }
    bool waiting(int w) const override { return state_[std::size_t(w)] == State::Waiting; }
    void defer(int w) override { deferred_.push_back(w); }
    void clear_deferred() override { deferred_.clear(); }
    std::int64_t lead(int w) const override { return completed_[std::size_t(w)] - slowest(); }
    void block(int w) override { state_[std::size_t(w)] = State::Blocked; }
    bool blocked(int w) const override { return state_[std::size_t(w)] == State::Blocked; }
    void idle(int w) override { state_[std::size_t(w)] = State::Idle; }
    void record_ssp_gap(std::int64_t gap) override { c_.epoch_.ssp_gap_max = std::max(c_.epoch_.ssp_gap_max, gap); }

private:
    bool hand_out(int w);
    UnitWork compute(int w, const Job& job, std::atomic<bool>& cancel);
    int next_finished();
    Result take(int w);
    void admit(int w, const UnitWork& u);
    void lose(int w, const Result& r);
    [[noreturn]] void fail(int w, const std::string& what) const {
        throw_error<DistributedError>("ParameterServer: worker ", w, " of ", workers(), " failed: ", what);
    }

    int computing() const {
        int n = 0;
        for (auto s : state_) n += s == State::Computing;
        return n;
    }
    // The smallest count of finished mini-batches among the workers still there (SSP).
    std::int64_t slowest() const {
        std::int64_t lo = std::numeric_limits<std::int64_t>::max();
        for (std::size_t i = 0; i < completed_.size(); ++i)
            if (state_[i] != State::Lost) lo = std::min(lo, completed_[i]);
        return lo == std::numeric_limits<std::int64_t>::max() ? 0 : lo;
    }
    // Virtual clock: posts the soonest unposted jobs while a core is free.
    void pump() {
        while (c_.clock_.is_virtual() && c_.pool_.running() < c_.pool_.slots()) {
            const int best = c_.clock_.soonest(workers(), [&](int v) {
                return state_[std::size_t(v)] == State::Computing && !c_.pool_.posted(v);
            });
            if (best < 0) return;
            c_.pool_.post(best);
        }
    }
    // Virtual clock: the deferred restarts, once no computing worker finishes at this instant.
    void release_deferred() {
        if (deferred_.empty()) return;
        const int s = c_.clock_.soonest(workers(), [&](int v) { return state_[std::size_t(v)] == State::Computing; });
        if (s >= 0 && !(c_.clock_.finish(s) > c_.clock_.seconds())) return;
        for (int v : deferred_)
            if (state_[std::size_t(v)] == State::Idle) hand_out(v);
        deferred_.clear();
    }

    ParameterServerCore& c_;
    PsAdmission& rule_;
    Next<Y> next_;
    std::uint64_t& step_;
    Work<Y> work_;
    OnStep on_step_;
    std::vector<ps_msg::OwnedBatch<Y>> owned_;  // each worker's mini-batch
    std::vector<State> state_;
    std::vector<std::int64_t> completed_;  // mini-batches each worker finished this epoch (SSP)
    std::vector<int> deferred_;            // virtual clock: restarts held until the instant's other arrivals
    double epoch_start_ = 0;
    bool exhausted_ = false;
    int round_started_ = 0;
    int pending_ = 0;  // pushes in the open update
    std::int64_t pending_max_staleness_ = 0;
    StepTotals totals_;  // the open update's
};

// Hands worker w its next mini-batch (pulling first if its copy is older than the current
// version); false when the data is exhausted.
template <class P, class T>
template <class Y>
bool ParameterServerCore<P, T>::Coordinator<Y>::hand_out(int w) {
    if (exhausted_ || state_[std::size_t(w)] == State::Lost) return false;
    auto b = next_();
    if (!b) {
        exhausted_ = true;
        return false;
    }
    owned_[std::size_t(w)].assign(*b);
    c_.transport_.pull(w, c_.version_);
    const std::uint64_t n = c_.workers_[std::size_t(w)].batches++;
    c_.clock_.start(w, n);
    double divisor = 1;
    if (c_.scales_loss())
        divisor = double(owned_[std::size_t(w)].size) * rule_.pushes_per_update(workers()) / c_.loss_scale_state().scale;
    c_.pool_.prepare(w, Job{true, ++step_, n, divisor});
    c_.transport_.send_shards(w, step_);
    state_[std::size_t(w)] = State::Computing;
    if (!c_.clock_.is_virtual()) c_.pool_.post(w);
    rule_.dispatched(w, *this);
    return true;
}

// On worker w's thread: its mini-batch computed here (or by its rank, across processes), then,
// under the real clock, the straggler model's delay slept.
template <class P, class T>
template <class Y>
UnitWork ParameterServerCore<P, T>::Coordinator<Y>::compute(int w, const Job& job, std::atomic<bool>& cancel) {
    bool reported = false;  // across processes: the worker rank finished and awaits a decision
    // Cancelled after it finished: across processes the worker rank is told to discard it.
    auto stop_if_cancelled = [&] {
        if (!cancel.load()) return;
        if (reported) c_.transport_.discard(w, job.step);
        throw Cancelled{};
    };
    const auto t0 = std::chrono::steady_clock::now();
    UnitWork u;
    if (c_.remote_) {
        u = c_.transport_.compute_remote(w, owned_[std::size_t(w)], job.step, job.divisor, cancel);
        reported = true;
    } else {
        auto& wk = c_.workers_[std::size_t(w)];
        // Under a loss scale the gradient is scaled as one device scales an update's batch
        // (Model leaves the denominator to this path; Job::divisor).
        u = work_(w, owned_[std::size_t(w)].view(), wk.params.data(), wk.grads.data(), job.divisor, job.step,
                  [&](std::int64_t, std::int64_t) {
            if (cancel.load(std::memory_order_relaxed)) throw Cancelled{};
        });
    }
    stop_if_cancelled();
    if (!c_.clock_.is_virtual()) {
        const double measured = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double delay = c_.clock_.delay(w, job.n, measured);
        if (delay > 0) c_.pool_.sleep(delay, cancel);
        stop_if_cancelled();
    }
    return u;
}

// The next worker to finish: under the virtual clock the soonest finish (the time jumps there,
// and its job is computed now if it was not yet); under the real clock the first to report.
template <class P, class T>
template <class Y>
int ParameterServerCore<P, T>::Coordinator<Y>::next_finished() {
    if (c_.clock_.is_virtual()) {
        const int w = c_.clock_.soonest(workers(), [&](int v) { return state_[std::size_t(v)] == State::Computing; });
        c_.clock_.advance_to(w);
        pump();
        if (!c_.pool_.posted(w)) c_.pool_.post(w);
        return w;
    }
    const auto w = c_.pool_.first_finished(c_.transport_.coordinator_wait());
    if (!w) {
        std::string who;
        for (int v = 0; v < workers(); ++v)
            if (state_[std::size_t(v)] == State::Computing) who += (who.empty() ? "" : ", ") + std::to_string(v);
        throw_error<DistributedError>("ParameterServer: worker(s) ", who, " of ", workers(), " did not finish a mini-batch within ",
                                      c_.transport_.timeout().count(), " ms");
    }
    c_.clock_.now();
    return *w;
}

template <class P, class T>
template <class Y>
typename ParameterServerCore<P, T>::Result ParameterServerCore<P, T>::Coordinator<Y>::take(int w) {
    auto r = c_.pool_.take_result(w, c_.transport_.coordinator_wait());
    if (!r)
        throw_error<DistributedError>("ParameterServer: worker ", w, " of ", workers(), " did not finish its mini-batch within ",
                                      c_.transport_.timeout().count(), " ms");
    return *r;
}

// Worker w's push into the open update.
template <class P, class T>
template <class Y>
void ParameterServerCore<P, T>::Coordinator<Y>::admit(int w, const UnitWork& u) {
    const std::int64_t staleness = c_.version_ - c_.workers_[std::size_t(w)].version;
    // Under a loss scale the servers take the sum of the update's gradients times the scale in
    // force now: the gradient computed as a share of an update (Job::divisor), under the scale
    // of its hand-out, is brought back to that (an update in between may have skipped, halving
    // the scale, or grown it; an inf stays an inf, and its update is skipped). 1 otherwise.
    const double rescale = c_.scales_loss() ? c_.loss_scale_state().scale * c_.pool_.job(w).divisor : 1.0;
    c_.transport_.push(w, c_.pool_.job(w).step, rescale);
    ++pending_;
    totals_.loss_sum += u.loss_sum;
    totals_.correct += double(u.correct);
    totals_.examples += u.examples;
    totals_.counted += u.counted;
    auto& e = c_.epoch_;
    ++e.gradients;
    e.staleness_sum += staleness;
    e.staleness_max = std::max(e.staleness_max, staleness);
    pending_max_staleness_ = std::max(pending_max_staleness_, staleness);
    if (std::size_t(staleness) >= e.histogram.size()) e.histogram.resize(std::size_t(staleness) + 1);
    ++e.histogram[std::size_t(staleness)];
}

template <class P, class T>
template <class Y>
bool ParameterServerCore<P, T>::Coordinator<Y>::close() {
    if (pending_ == 0) return true;
    // The mean over what the update counted: its examples, or with a token mask at the model's
    // output, its tokens that count (UnitWork::counted; one device's divisor on those batches).
    const T inv = T(1) / T(totals_.counted > 0 ? totals_.counted : 1);
    c_.transport_.apply(inv, c_.version_);
    ++c_.version_;
    ++c_.epoch_.updates;
    const StepTotals t = totals_;
    const int g = pending_;
    totals_ = StepTotals{};
    pending_ = 0;
    if (c_.observer_) c_.observer_(UpdateRecord{c_.version_, c_.clock_.now(), g, pending_max_staleness_});
    pending_max_staleness_ = 0;
    return on_step_(t);
}

template <class P, class T>
template <class Y>
void ParameterServerCore<P, T>::Coordinator<Y>::cancel_computing() {
    for (int w = 0; w < workers(); ++w)
        if (state_[std::size_t(w)] == State::Computing) c_.pool_.cancel(w);
    c_.pool_.notify();
    for (int w = 0; w < workers(); ++w) {
        if (state_[std::size_t(w)] != State::Computing) continue;
        if (!c_.pool_.posted(w)) {  // virtual clock: never started for real, nothing to stop
            state_[std::size_t(w)] = State::Idle;
            ++c_.epoch_.cancelled;
            continue;
        }
        const Result r = take(w);
        state_[std::size_t(w)] = State::Idle;
        if (r.failed && r.lost) {
            lose(w, r);
            continue;
        }
        if (r.failed) fail(w, r.error);
        if (!r.cancelled) c_.transport_.discard(w, c_.pool_.job(w).step);
        // Virtual clock: it was cancelled at this virtual time, whatever the threads did.
        // Real clock: one that finished before it saw the cancellation is a late push.
        if (r.cancelled || c_.clock_.is_virtual()) ++c_.epoch_.cancelled;
        else ++c_.epoch_.dropped;
    }
}

// A worker rank that did not report: every mode but Synchronous goes on without it (its
// mini-batch dropped); Synchronous, which needs every worker, stops naming it.
template <class P, class T>
template <class Y>
void ParameterServerCore<P, T>::Coordinator<Y>::lose(int w, const Result& r) {
    const int rank = c_.transport_.lose(w);
    if (rule_.needs_every_worker()) fail(w, r.error + " (Synchronous needs every worker; the asynchronous and K modes go on without a lost one)");
    state_[std::size_t(w)] = State::Lost;
    c_.lost_.push_back(w);
    c_.epoch_.lost_workers.push_back(w);  // into the report and the JSON (stats())
    c_.epoch_.lost_ranks.push_back(rank);
    ++c_.epoch_.dropped;
    int left = 0;
    for (auto st : state_) left += st != State::Lost;
    if (left == 0) fail(w, r.error + " (no worker left)");
    std::fprintf(stderr, "strata: warning: ParameterServer: %s; its mini-batch is dropped and training goes on with %d "
                         "of %d workers\n", r.error.c_str(), left, workers());
}

template <class P, class T>
ParameterServerCore<P, T>::ParameterServerCore(ReplicaRuntime<P>& runtime, const ParameterServerConfig& config, std::int64_t num_params,
                                               std::vector<nn::ParamInfo> infos, FunctionRef<collective::Settings()> model_settings,
                                               FunctionRef<void(T*)> init)
    : runtime_(&runtime), config_(&config), num_params_(num_params), infos_(std::move(infos)),
      remote_(config.ps_options().processes.get()), num_workers_(runtime.num_replicas_in_sync()),
      transport_(servers_, workers_, remote_, config.ps_options().timeout),
      admission_(make_admission(config.rule(), config.k(), config.staleness_bound())),
      clock_(config.ps_options().clock == Clock::Virtual, config.ps_options().stragglers, config.ps_options().straggler_seed,
             config.ps_options().virtual_batch_seconds),
      pool_(num_workers_) {
    plan();
    distribute::detail::check_units_fit_memory("ParameterServer", "workers", num_workers_, 2 * std::uint64_t(num_params_) * sizeof(T),
                                               "a pulled copy of the variables and a gradient");
    workers_.resize(std::size_t(num_workers_));
    runtime_->run_replicas([&](int w) {  // on the worker's thread: its logical device's memory
        workers_[std::size_t(w)].params.resize(Shape{num_params_});
        workers_[std::size_t(w)].grads.resize(Shape{num_params_});
    });
    transport_.start_servers();
    transport_.on_servers([&](int sv) {
        auto& srv = servers_[std::size_t(sv)];
        srv.params.resize(Shape{srv.size});
    });
    // The initial values, computed once and sent to each server as its shards.
    Tensor<T, P> full(Shape{num_params_});
    init(full.data());
    const auto host = to_vector(full.view());
    if (remote_) {  // every rank computes them from the seed: the same model and the same values
        auto same = model_settings();
        same.emplace_back("initial variables (the seed's)", distribute::detail::fnv1a_hex(host.data(), host.size() * sizeof(T)));
        remote_->agree(same, "the model");
    }
    set_weights(host);
}

template <class P, class T>
ParameterServerCore<P, T>::~ParameterServerCore() = default;

template <class P, class T>
void ParameterServerCore<P, T>::compile(const optim::Optimizer& o, const collective::Settings& agreed) {
    if (remote_) remote_->agree(agreed, "compile's settings");  // every rank the same optimizer and precision
    transport_.on_servers([&](int sv) {
        auto& srv = servers_[std::size_t(sv)];
        // The moving statistics among the server's ranges, at their places in its compact buffer.
        std::vector<optim::MovingAverageRange> moving;
        for (std::size_t i = 0; i < srv.ranges.size(); ++i)
            for (auto m : distribute::detail::moving_ranges(infos_, srv.ranges[i].first, srv.ranges[i].count)) {
                m.first += srv.compact[i];
                moving.push_back(m);
            }
        std::sort(moving.begin(), moving.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        srv.opt = optim::OptimizerState<T, P>(o, srv.size, std::move(moving));
    });
    compiled_ = true;
}

template <class P, class T>
template <class Y>
void ParameterServerCore<P, T>::epoch_run(Next<Y> next, std::uint64_t& step, Work<Y> work, OnStep on_step) {
    STRATA_CHECK(compiled_, ValueError, "ParameterServer: the model is not compiled");
    STRATA_CHECK(!in_epoch_, ValueError, "ParameterServer: fit or train_step called from inside an epoch (a callback)");
    in_epoch_ = true;
    struct EpochGuard {
        bool& flag;
        ~EpochGuard() { flag = false; }
    } guard{in_epoch_};
    if (remote_ && remote_->role() != Role::Coordinator) {
        // A server or worker rank serves the coordinator's epoch, then takes the state.
        if (remote_->role() == Role::Server) PsServerRank<P, T>(transport_).serve_epoch();
        else runtime_->run_replicas([&](int t) {
                if (t == remote_->index()) PsWorkerRank<P, T>(transport_, t).template work_epoch<Y>(work);
            });
        transport_.sync_mirror();
        return;
    }
    Coordinator<Y> epoch(*this, next, step, work, on_step);
    try {
        runtime_->pool().run_with([&](int w) { epoch.serve(w); }, [](int) {}, [&] { epoch.run(); }, [&] { pool_.stop_all(); });
    } catch (const std::exception& e) {
        transport_.abandon(e.what());
        throw;
    } catch (...) {
        for (auto& srv : servers_) srv.received = 0;  // the open update is abandoned
        throw;
    }
    transport_.end_epoch(lost_);
}

template <class P, class T>
void ParameterServerCore<P, T>::plan() {
    const auto& infos = infos_;
    std::vector<std::vector<std::int64_t>> shapes;
    std::vector<std::int64_t> offsets;
    for (const auto& p : infos) {
        shapes.emplace_back(p.shape.begin(), p.shape.end());
        offsets.push_back(p.offset);
    }
    if (const auto* f = std::get_if<FixedShards>(&config_->ps_options().partitioner)) {
        std::int64_t most_rows = 0;
        for (const auto& s : shapes) most_rows = std::max(most_rows, s.empty() ? 1 : s[0]);
        STRATA_CHECK(f->num_shards <= most_rows, ValueError, "ParameterServer: FixedShards(", f->num_shards,
                     ") asks for more shards than any variable has rows (the largest axis 0 is ", most_rows, ")");
    }
    shards_ = plan_shards(config_->ps_options().partitioner, shapes, offsets, sizeof(T), config_->num_servers());
    servers_.resize(std::size_t(config_->num_servers()));
    for (const auto& sh : shards_) {
        auto& srv = servers_[std::size_t(sh.server)];
        srv.ranges.push_back(sh);
        srv.compact.push_back(srv.size);
        srv.size += sh.count;
    }
}

}  // namespace detail

#if STRATA_INSTANCES
// The host's parameter-server path is compiled once in the compiled part, for every sync mode.
STRATA_TEMPLATE class detail::ParameterServerCore<place::Host, float>;
STRATA_TEMPLATE class detail::ParameterServerCore<place::Host, double>;
STRATA_TEMPLATE void detail::ParameterServerCore<place::Host, float>::epoch_run<std::int32_t>(
    detail::ParameterServerCore<place::Host, float>::Next<std::int32_t>, std::uint64_t&,
    detail::ParameterServerCore<place::Host, float>::Work<std::int32_t>, detail::ParameterServerCore<place::Host, float>::OnStep);
#endif

template <class P, class Sync, class Net, class T>
class GradientPath<ParameterServer<P, Sync>, Net, T> : public detail::PathBase<GradientPath<ParameterServer<P, Sync>, Net, T>>,
                                                       public detail::ParameterServerCore<P, T> {
    using Core = detail::ParameterServerCore<P, T>;

public:
    using value_type = T;
    using place_type = P;
    /// Workers take whole mini-batches on their own schedule: no global batch, no step pieces.
    static constexpr bool lockstep = false;

    template <class Init>
    GradientPath(ParameterServer<P, Sync>& s, Init&& init)
        : Core(s, s, Net::num_params, Net::parameters(), [] { return distribute::detail::model_settings<Net, T>(); },
               [&](T* p) { init(p); }) {}

    using Core::expected_updates;
    using Core::is_chief;
    // The defaults this path takes, by name (detail::PathBase says why).
    using Base = detail::PathBase<GradientPath>;
    using Base::pipelined, Base::captures_step, Base::unit_network, Base::gradient_buckets, Base::per_worker_input, Base::unit_share;
    using Base::sum_over_workers, Base::sum_outputs_over_workers, Base::after_save, Base::gathers_state, Base::bind_unit;
    using Base::model_summary;
    using Base::syncs_batch_statistics, Base::replica_sum, Base::run_where_loss_runs;
    /// A worker trains on whole mini-batches (evaluate's shares of a batch are smaller).
    std::int64_t largest_unit_share(std::int64_t n) const { return n; }

    /// One epoch: mini-batches from `source` (each one worker's), updates by the mode's rule,
    /// `on_step(StepTotals)` after every update (false: stop).
    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        using Y = std::remove_cv_t<std::remove_pointer_t<decltype(source.next())>>;
        using Yv = std::remove_cv_t<typename decltype(std::declval<Y>().y)::value_type>;
        auto next = [&]() -> std::optional<ReplicaBatch<Yv>> {
            const auto* b = source.next();
            if (!b) return std::nullopt;
            return split_batch(*b, 1, 0);
        };
        Core::template epoch_run<Yv>(next, step, work, on_step);
    }

    /// One update on one batch: its W slices are the workers' mini-batches.
    template <class Y, class Work>
    StepTotals train_step(const data::Batch<Y>& batch, std::uint64_t& step, Work&& work) {
        const int workers = this->units();
        int i = 0;
        auto next = [&]() -> std::optional<ReplicaBatch<Y>> {
            while (i < workers) {
                auto b = split_batch(batch, workers, i++);
                if (b.size > 0) return b;
            }
            return std::nullopt;
        };
        StepTotals out;
        auto first_update = [&](const StepTotals& t) {
            out = t;
            return false;
        };
        Core::template epoch_run<Y>(next, step, work, first_update);
        return out;
    }

    /// At an epoch's end: its figures into fit's logs, its staleness histogram into the History.
    template <class Logs, class History>
    void end_epoch(Logs& logs, History& history) const {
        epoch_figures(logs);
        history.staleness.push_back(this->staleness_histogram());
    }
    template <class Logs>
    void epoch_figures(Logs& logs) const {
        const auto& e = this->epoch_stats();
        logs.set("updates", double(e.updates));
        logs.set("cancelled", double(e.cancelled));
        logs.set("dropped", double(e.dropped));
        logs.set("staleness_max", double(e.staleness_max));
        logs.set("staleness_mean", e.staleness_mean());
        logs.set("seconds", e.seconds);
    }
};

}  // namespace strata::distribute
