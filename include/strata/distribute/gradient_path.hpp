#pragma once
/// \file strata/distribute/gradient_path.hpp
/// `GradientPath<Strategy, Net, T>`: how a strategy's gradients meet its variables. Model
/// holds one concrete path (no virtual calls) and knows nothing of the strategy: it gives the
/// path a *unit of work* (forward, loss, backward of one mini-batch with given parameters into
/// given gradients) and the path decides where the variables live, which copy a unit computes
/// with, how gradients are combined and applied, and the schedule of a step.
///
/// One specialisation per strategy, each in its own file under distribute/path/ (MultiWorkerMirrored
/// reuses Mirrored's), included by the strategy's header — Model includes none:
///
/// | strategy                 | variables                       | gradients meet variables         | schedule            |
/// |--------------------------|---------------------------------|----------------------------------|---------------------|
/// | Default, OneDevice       | one copy                        | applied directly                 | lockstep, 1 replica |
/// | Mirrored                 | a copy per replica              | all-reduce (buckets overlap      | lockstep            |
/// |                          |                                 | backward), same update everywhere|                     |
/// | CentralStorage           | one central copy                | reduced onto it by slices        | lockstep            |
/// | ParameterServer          | shards on servers, versioned;   | pushed to the servers, admitted  | the sync mode's:    |
/// |                          | workers pull copies             | by the sync mode's rule          | first K, any K, ... |
///
/// What every path provides (checked by the `GradientPathFor` concept where Model instantiates
/// it):
///   units()                          compute units (replicas, or parameter-server workers)
///   run_units(f)                     f(unit) on every unit's thread, inside its device scope
///   compile(optimizer)               optimizer slots where the variables live
///   run_epoch(source, work, on_step) the schedule: takes mini-batches from `source`, calls
///                                    `work` on units, combines and applies gradients; calls
///                                    `on_step(StepTotals)` after every update (false: stop)
///   train_step(batch, step, work)    one update on one batch (a global batch, split over units)
///   prepare_inference() / inference_params(unit)   the variables evaluate/predict compute with
///   get_weights() / set_weights(w)   the variables as one flat host vector (layer after layer)
///   slots() / set_slot(name, v)      optimizer slots, gathered into the same flat layout
///   optimizer_name(), iterations(), set_iterations(n), learning_rate(), set_learning_rate(lr)
///   log_placement()                  one placement-log line per variable copy or shard
/// and, through detail::PathBase (below), the optional parts with their defaults.
/// Lockstep paths (everything but ParameterServer) also expose the pieces of a step for custom
/// training loops: params(r), grads(r), gradient_ready(r, first), apply(r), end_step().

#include <concepts>
#include <span>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/data/dataset.hpp"
#include "strata/detail/dependent_false.hpp"
#include "strata/distribute/combinations.hpp"
#include "strata/distribute/distributed_dataset.hpp"
#include "strata/distribute/rendezvous.hpp"
#include "strata/place/devices.hpp"
#include "strata/nn/layer.hpp"
#include "strata/optim/optimizers.hpp"

namespace strata::distribute {

/// What one unit's work on one mini-batch returns.
struct UnitWork {
    double loss_sum = 0;        ///< sum of the per-example losses
    std::int64_t correct = 0;   ///< examples predicted right (accuracy metric)
    std::int64_t examples = 0;  ///< examples in the mini-batch
};

/// What a step (an update) did, summed over the mini-batches it applied.
struct StepTotals {
    double loss_sum = 0;
    double correct = 0;
    std::int64_t examples = 0;
};

/// The primary template: a strategy × sync-mode combination that no path implements.
template <class Strategy, class Net, class T>
class GradientPath {
    static_assert(strata::detail::dependent_false<Strategy>,
                  "strata::distribute::GradientPath: this strategy × sync mode combination is not implemented. "
                  STRATA_VALID_COMBINATIONS);
};

/// The interface Model relies on (see the file comment).
template <class Path>
concept GradientPathFor = requires(Path& p, const Path& cp, int unit, optim::Optimizer opt, std::vector<typename Path::value_type> w) {
    typename Path::value_type;
    typename Path::place_type;
    { cp.units() } -> std::convertible_to<int>;
    p.compile(opt);
    p.prepare_inference();
    { p.inference_params(unit) } -> std::convertible_to<const typename Path::value_type*>;
    { cp.get_weights() } -> std::same_as<std::vector<typename Path::value_type>>;
    p.set_weights(w);
    { cp.optimizer_name() } -> std::convertible_to<std::string>;
    { cp.iterations() } -> std::convertible_to<std::int64_t>;
    { cp.learning_rate() } -> std::convertible_to<double>;
    p.log_placement();
};

namespace detail {

/// A mini-batch source over a dataset iterator (what fit hands to run_epoch).
template <class Y, class It>
class IteratorSource {
public:
    explicit IteratorSource(It& it) : it_(&it) {}
    /// The next mini-batch, or nullptr when the dataset is exhausted. The pointer stays valid
    /// until the next call.
    const data::Batch<Y>* next() {
        STRATA_PROFILE_MODEL("input pipeline");
        if (!started_) started_ = true;
        else ++*it_;
        if (*it_ == std::default_sentinel) return nullptr;
        return &**it_;
    }

private:
    It* it_;
    bool started_ = false;
};

/// Optimizer bookkeeping over a set of optimizer states that move in lockstep (one per copy of
/// the variables): they all see the same gradients, so reading state 0 describes them all.
template <class T, class P>
struct OptimizerCopies {
    std::vector<optim::OptimizerState<T, P>> states;
    std::string optimizer_name() const { return states.empty() ? std::string() : states[0].name(); }
    std::int64_t iterations() const { return states.empty() ? 0 : states[0].iterations(); }
    void set_iterations(std::int64_t it) {
        for (auto& s : states) s.set_iterations(it);
    }
    double learning_rate() const { return states.empty() ? 0.0 : states[0].current_learning_rate(); }
    void set_learning_rate(double lr);
    /// Every slot of state 0, as flat host vectors.
    std::vector<std::pair<std::string, std::vector<T>>> slots() const;
    /// Sets slot `name` in every copy; false when the optimizer has no such slot.
    bool set_slot(const std::string& name, const std::vector<T>& v);
};

// Out of the class, not inline, so that the compiled part's instantiations below are the only
// ones (GCC instantiates inline members for inlining even where an `extern template` declares them).
template <class T, class P>
void OptimizerCopies<T, P>::set_learning_rate(double lr) {
    for (auto& s : states) s.set_learning_rate(lr);
}
template <class T, class P>
std::vector<std::pair<std::string, std::vector<T>>> OptimizerCopies<T, P>::slots() const {
    std::vector<std::pair<std::string, std::vector<T>>> out;
    if (states.empty()) return out;
    for (auto& [name, t] : const_cast<optim::OptimizerState<T, P>&>(states[0]).slots()) out.emplace_back(name, to_vector(t.view()));
    return out;
}
template <class T, class P>
bool OptimizerCopies<T, P>::set_slot(const std::string& name, const std::vector<T>& v) {
    bool found = false;
    for (auto& s : states)
        for (auto& [n, t] : s.slots())
            if (n == name) {
                copy(TensorView<T, place::Host>(const_cast<T*>(v.data()), Shape{std::int64_t(v.size())}), t.view());
                found = true;
            }
    return found;
}

#if STRATA_INSTANCES
// The host's optimizer bookkeeping, compiled once in the compiled part.
STRATA_TEMPLATE struct OptimizerCopies<float, place::Host>;
STRATA_TEMPLATE struct OptimizerCopies<double, place::Host>;
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE struct OptimizerCopies<float, place::Cuda>;
STRATA_CUDA_TEMPLATE struct OptimizerCopies<double, place::Cuda>;
#endif

/// The base of every gradient path: the optional parts of the interface, with their defaults
/// (one process, no gradient buckets, one update per batch). A path overrides what it does
/// differently by declaring a member of the same name; Model calls every member below
/// unconditionally (no `requires` probes), so a name Model expects that no path declares is a
/// compile error, not a feature silently switched off.
///
/// | member                            | default                | overridden by                      |
/// |-----------------------------------|------------------------|------------------------------------|
/// | `lockstep`                        | true                   | ParameterServer (false)            |
/// | `pipelined`                       | false                  | Pipeline (true)                    |
/// | `gradient_buckets()`              | 0 (no all-reduce)      | Mirrored, MultiWorkerMirrored      |
/// | `expected_updates(batches)`       | batches                | ParameterServer (rounds, or -1)    |
/// | `end_epoch(logs, history)`        | nothing                | ParameterServer (figures, staleness)|
/// | `is_chief()`                      | true                   | MultiWorkerMirrored, Pipeline (rank 0)|
/// | `per_worker_input()`              | false                  | MultiWorkerMirrored                |
/// | `unit_share(batch, r)`            | even split over units()| lockstep paths, MultiWorkerMirrored|
/// | `sum_over_workers(values)`        | nothing (one process)  | MultiWorkerMirrored, Pipeline      |
/// | `sum_outputs_over_workers(rows)`  | nothing (one process)  | MultiWorkerMirrored, Pipeline      |
/// | `after_save()`                    | nothing                | MultiWorkerMirrored, Pipeline      |
/// |                                   |                        | across processes (barrier)         |
/// | `gathers_state()`                 | false                  | Pipeline across processes (every   |
/// |                                   |                        | process takes part in get_weights) |
/// | `bind_unit(r, net)`               | nothing                | Pipeline (its units' networks are  |
/// |                                   |                        | handles on the path's stages)      |
/// | `model_summary<Net>()`            | Net::summary()         | Pipeline (adds the stage split)    |
///
/// A path may also name the network a Model unit holds (`unit_network`; Network<Net, T, P> by
/// default): Pipeline's is a handle whose forward runs the stages.
template <class Derived>
class PathBase {
public:
    /// Whether every unit steps on its share of one global batch (custom training loops need it).
    static constexpr bool lockstep = true;
    /// Whether the path runs the layers itself, stage by stage (Pipeline): Model then hands it
    /// a staged unit of work (stage the mini-batch; the loss of each micro-batch).
    static constexpr bool pipelined = false;
    std::size_t gradient_buckets() const { return 0; }
    std::int64_t expected_updates(std::int64_t batches) const { return batches; }
    template <class Logs, class History>
    void end_epoch(Logs&, History&) const {}
    bool is_chief() const { return true; }
    bool per_worker_input() const { return false; }
    template <class Y>
    ReplicaBatch<Y> unit_share(const data::Batch<Y>& batch, int r) const {
        return split_batch(batch, static_cast<const Derived&>(*this).units(), r);
    }
    template <class V>
    void sum_over_workers(std::span<V>) {}
    template <class V>
    void sum_outputs_over_workers(std::span<V>) {}
    void after_save() const {}
    bool gathers_state() const { return false; }
    template <class N>
    void bind_unit(int, N&) {}
    template <class Seq>
    static std::string model_summary() { return Seq::summary(); }
};

/// The network a Model unit holds under path `Path`: `Path::unit_network` where the path names
/// one, otherwise `Default`.
template <class Path, class Default>
struct UnitNetwork {
    using type = Default;
};
template <class Path, class Default>
    requires requires { typename Path::unit_network; }
struct UnitNetwork<Path, Default> {
    using type = typename Path::unit_network;
};

/// What of a lockstep path depends on neither the network nor the path (only on the strategy
/// and the element type): the strategy, one gradient buffer of `num_params` per replica
/// (zeroed, allocated on the replica's thread from its logical device's memory) and the
/// optimizer states. Its constructor and destructor are defined out of the class, so that the
/// compiled part's instantiations for the host strategies (`extern template`, at the end of
/// strategy.hpp) are the only ones a program uses.
template <class Strategy, class T>
class LockstepBuffers {
public:
    using P = typename Strategy::place_type;
    LockstepBuffers(Strategy& s, std::int64_t num_params);
    ~LockstepBuffers();
    LockstepBuffers(const LockstepBuffers&) = delete;
    LockstepBuffers& operator=(const LockstepBuffers&) = delete;

protected:
    Strategy* strategy_;
    std::vector<Tensor<T, P>> grads_;
    OptimizerCopies<T, P> opt_;  // one state per copy of the variables
};

template <class Strategy, class T>
LockstepBuffers<Strategy, T>::LockstepBuffers(Strategy& s, std::int64_t num_params) : strategy_(&s) {
    grads_.resize(std::size_t(s.local_replicas()));
    s.run_replicas([&](int r) {  // on the replica's thread: from its logical device's memory
        grads_[std::size_t(r)].resize(Shape{num_params});
        fill(grads_[std::size_t(r)].view(), T(0));
    });
}

template <class Strategy, class T>
LockstepBuffers<Strategy, T>::~LockstepBuffers() = default;

/// Shared by the lockstep paths: one gradient buffer per replica, every replica computes its
/// share of the same global batch, then `Derived::apply(r)` combines and updates.
template <class Derived, class Strategy, class Net, class T>
class LockstepPath : public PathBase<Derived>, protected LockstepBuffers<Strategy, T> {
public:
    using value_type = T;
    using place_type = typename Strategy::place_type;
    using P = place_type;
    static constexpr std::int64_t num_params = Net::num_params;

    explicit LockstepPath(Strategy& s) : LockstepBuffers<Strategy, T>(s, num_params) {}

    /// This process's replicas (under MultiWorkerMirrored, its share of num_replicas_in_sync).
    int units() const { return strategy_->local_replicas(); }
    template <class F>
    void run_units(F&& f) { strategy_->run_replicas(std::forward<F>(f)); }
    T* grads(int r) { return grads_[std::size_t(r)].data(); }
    void prepare_inference() {}
    const T* inference_params(int r) { return self().params(r); }

    /// One step on `batch` (a global batch): replica r computes its share, then the strategy's
    /// aggregation and update (Derived::apply) runs on every replica; end_step on the caller.
    template <class Y, class Work>
    StepTotals train_step(const data::Batch<Y>& batch, std::uint64_t& step_counter, Work&& work) {
        const int all = strategy_->num_replicas_in_sync(), first = strategy_->first_replica();
        StepTotals t = run_step(++step_counter, work, [&](int r) {
            const auto b = split_batch(batch, all, first + r);
            return std::pair{b, double(b.global_size)};
        });
        t.examples = std::int64_t(batch.size());
        self().combine_totals(t);
        return t;
    }

    /// The step every lockstep schedule runs: on every unit r, `work` on the share and
    /// denominator `share(r)` returns, then Derived::apply(r); then end_step on the caller.
    /// Returns the units' summed loss, correct count and examples (the caller makes them global).
    template <class Work, class Share>
    StepTotals run_step(std::uint64_t step, Work& work, Share&& share) {
        const int n = units();
        UnitWork out[64];
        std::vector<UnitWork> many;
        UnitWork* res = out;
        if (n > 64) {
            many.resize(std::size_t(n));
            res = many.data();
        }
        run_units([&](int r) {
            const auto [b, denominator] = share(r);
            res[r] = work(r, b, self().params(r), grads(r), denominator, step,
                          [this, r](std::int64_t first, std::int64_t) { self().gradient_ready(r, first); });
            self().apply(r);
        });
        self().end_step();
        StepTotals t;
        for (int r = 0; r < n; ++r) {
            t.loss_sum += res[r].loss_sum;
            t.correct += double(res[r].correct);
            t.examples += res[r].examples;
        }
        return t;
    }

    /// Unit r's share of a global batch (evaluate and predict split batches as training does).
    template <class Y>
    ReplicaBatch<Y> unit_share(const data::Batch<Y>& batch, int r) const {
        return split_batch(batch, strategy_->num_replicas_in_sync(), strategy_->first_replica() + r);
    }

    /// The lockstep schedule: one step per global batch of the source.
    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        while (const auto* batch = source.next())
            if (!on_step(train_step(*batch, step, work))) return;
    }

    // Pieces for custom loops; paths override what they do differently.
    void gradient_ready(int, std::int64_t) {}
    void end_step() {}
    /// Makes a step's totals global (MultiWorkerMirrored sums them over the processes).
    void combine_totals(StepTotals&) {}

    // The optimizer state(s) a path keeps in opt_, for checkpoints and callbacks.
    std::vector<std::pair<std::string, std::vector<T>>> slots() const { return opt_.slots(); }
    bool set_slot(const std::string& n, const std::vector<T>& v) { return opt_.set_slot(n, v); }
    std::string optimizer_name() const { return opt_.optimizer_name(); }
    std::int64_t iterations() const { return opt_.iterations(); }
    void set_iterations(std::int64_t it) { opt_.set_iterations(it); }
    double learning_rate() const { return opt_.learning_rate(); }
    void set_learning_rate(double lr) { opt_.set_learning_rate(lr); }

protected:
    Derived& self() { return static_cast<Derived&>(*this); }
    using LockstepBuffers<Strategy, T>::strategy_;
    using LockstepBuffers<Strategy, T>::grads_;
    using LockstepBuffers<Strategy, T>::opt_;
};

/// Logs each parameter `parameters()` lists (a network's Seq::parameters) on `devices[c]` for
/// every copy c < copies, when the placement log is on (place::set_log_device_placement).
STRATA_DECL void log_variable_copies(std::vector<nn::ParamInfo> (*parameters)(), const std::vector<place::LogicalDevice>& devices,
                                     int copies);

}  // namespace detail
}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/gradient_path.ipp"
#endif
