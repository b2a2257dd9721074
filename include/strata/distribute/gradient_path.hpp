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
///   compile(optimizer, agreed)       optimizer slots where the variables live; across processes,
///                                    every rank's `agreed` (compile's settings: the loss, the
///                                    metrics, the optimizer and the precision, train/model.hpp)
///                                    compared first
///   run_epoch(source, work, on_step) the schedule: takes mini-batches from `source`, calls
///                                    `work` on units, combines and applies gradients; calls
///                                    `on_step(StepTotals)` after every update (false: stop)
///   train_step(batch, step, work)    one update on one batch (a global batch, split over units)
///   prepare_inference() / inference_params(unit)   the variables evaluate/predict compute with
///   get_weights() / set_weights(w)   the variables as one flat host vector (layer after layer)
///   slots() / set_slot(name, v)      optimizer slots, gathered into the same flat layout
///   optimizer_name(), iterations(), set_iterations(n), learning_rate(), set_learning_rate(lr)
///   log_placement()                  one placement-log line per variable copy or shard
/// and, through detail::PathBase (below), the optional parts with their defaults, which a path
/// takes by name (`using Base::after_save;`) so that a misspelt override is a compile error.
/// Lockstep paths (everything but ParameterServer) also expose the pieces of a step for custom
/// training loops: params(r), grads(r), gradient_ready(r, first), apply(r), end_step().

#include <algorithm>
#include <concepts>
#include <mutex>
#include <span>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/data/dataset.hpp"
#include "strata/detail/dependent_false.hpp"
#include "strata/distribute/combinations.hpp"
#include "strata/distribute/distributed_dataset.hpp"
#include "strata/distribute/rendezvous.hpp"
#include "strata/distribute/settings.hpp"
#include "strata/distribute/shard_group.hpp"
#include "strata/place/devices.hpp"
#include "strata/nn/layer.hpp"
#include "strata/optim/optimizers.hpp"

namespace strata::distribute {

/// What one unit's work on one mini-batch returns.
struct UnitWork {
    double loss_sum = 0;        ///< sum of the per-example losses
    double correct = 0;         ///< examples predicted right (accuracy metric; with per-token ids, shares of examples;
                                ///< with a token mask at the output, the tokens that count predicted right)
    std::int64_t examples = 0;  ///< examples in the mini-batch
    double counted = 0;         ///< what `correct` is out of: `examples`, or with a token mask at the output, the
                                ///< tokens that count (the accuracy is correct / counted, Keras' masked mean)
};

/// What a step (an update) did, summed over the mini-batches it applied.
struct StepTotals {
    double loss_sum = 0;
    double correct = 0;
    std::int64_t examples = 0;
    double counted = 0;  ///< the accuracy's denominator (UnitWork::counted, summed)
};

/// The primary template: a strategy × sync-mode combination that no path implements.
template <class Strategy, class Net, class T>
class GradientPath {
    static_assert(strata::detail::dependent_false<Strategy>,
                  "strata::distribute::GradientPath: this strategy × sync mode combination is not implemented. "
                  STRATA_VALID_COMBINATIONS);
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
    /// The dynamic loss scale (every copy takes the same decisions: they see the same gradient).
    optim::LossScaleState loss_scale_state() const { return states.empty() ? optim::LossScaleState{} : states[0].loss_scale_state(); }
    void set_loss_scale_state(const optim::LossScaleState& s) {
        for (auto& st : states) st.set_loss_scale_state(s);
    }
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

/// The variables among [first, first + count) of a flat buffer laid out as `params` lists them
/// (a network's Seq::parameters()) that are not trained (batch normalization's moving
/// statistics), as ranges relative to `first`: what every path's optimizer states are built
/// with, so that the optimizer moves them as averages and never trains them.
inline std::vector<optim::MovingAverageRange> moving_ranges(const std::vector<nn::ParamInfo>& params, std::int64_t first,
                                                            std::int64_t count) {
    std::vector<optim::MovingAverageRange> out;
    for (const auto& p : params) {
        if (p.trainable) continue;
        const std::int64_t a = std::max(p.offset, first), b = std::min(p.offset + p.shape.size(), first + count);
        if (a >= b) continue;
        if (!out.empty() && out.back().first + out.back().count == a - first && out.back().momentum == p.momentum)
            out.back().count += b - a;
        else
            out.push_back({a - first, b - a, p.momentum});
    }
    return out;
}
/// The same for a whole network's flat buffer, or its layers' block [first, first + count).
template <class Net>
std::vector<optim::MovingAverageRange> moving_ranges(std::int64_t first = 0, std::int64_t count = Net::num_params) {
    return moving_ranges(Net::parameters(), first, count);
}

/// The network a Model unit holds when the path names none of its own: the whole network
/// (nn::Network<Net, T, P>). PathBase's default `unit_network`.
struct WholeNetwork {};

/// The base of every gradient path: the optional parts of the interface, with their defaults
/// (one process, no gradient buckets, one update per batch). Model calls every member below
/// unconditionally (no `requires` probes).
///
/// The defaults are protected: a path either defines a member or takes the default by name
/// with a using-declaration in its public part (`using detail::PathBase<Path>::after_save;`).
/// So a misspelt override (`after_sav`) cannot fall back to the default without a word: the
/// path then has no public `after_save`, and GradientPathCheck (where Model instantiates the
/// path) names the member and both ways to provide it.
///
/// | member                            | default                | defined by                         |
/// |-----------------------------------|------------------------|------------------------------------|
/// | `lockstep`                        | true                   | ParameterServer (false)            |
/// | `pipelined`                       | false                  | Pipeline (true)                    |
/// | `captures_step`                   | false                  | OneDevice (true)                   |
/// | `unit_network`                    | WholeNetwork           | Pipeline (a handle on its stages)  |
/// | `gradient_buckets()`              | 0 (no all-reduce)      | Mirrored, MultiWorkerMirrored      |
/// | `expected_updates(batches)`       | batches                | ParameterServer (rounds, or -1)    |
/// | `end_epoch(logs, history)`        | nothing                | ParameterServer (figures, staleness)|
/// | `is_chief()`                      | shard_group_chief()    | MultiWorkerMirrored, Pipeline, ParameterServer (rank 0)|
/// | `per_worker_input()`              | false                  | MultiWorkerMirrored                |
/// | `unit_share(batch, r)`            | even split over units()| lockstep paths, MultiWorkerMirrored|
/// | `largest_unit_share(n)`           | its largest share      | the same, and ParameterServer (n:  |
/// |                                   |                        | a worker takes whole batches)      |
/// | `sum_over_workers(values)`        | nothing (one process)  | MultiWorkerMirrored, Pipeline      |
/// | `sum_outputs_over_workers(rows)`  | nothing (one process)  | MultiWorkerMirrored, Pipeline      |
/// | `after_save()`                    | nothing                | MultiWorkerMirrored, Pipeline      |
/// |                                   |                        | across processes (barrier)         |
/// | `gathers_state()`                 | false                  | Pipeline across processes (every   |
/// |                                   |                        | process takes part in get_weights) |
/// | `bind_unit(r, net)`               | nothing                | Pipeline (its units' networks are  |
/// |                                   |                        | handles on the path's stages)      |
/// | `model_summary<Net>()`            | Net::summary()         | Pipeline (adds the stage split)    |
/// | `run_where_loss_runs(f)`          | run_units(f)           | Pipeline (its last stages' threads)|
/// | `syncs_batch_statistics`,         | false, nothing         | the lockstep paths (LockstepPath:  |
/// | `replica_sum(r)`                  | (no replica to sum with)| the strategy's replica group)     |
template <class Derived>
class PathBase {
protected:
    /// Whether the path's units step together on shares of one global batch, so that a layer
    /// can combine statistics over them (synchronized batch normalization); Model refuses such a
    /// layer at compile time where this is false.
    static constexpr bool syncs_batch_statistics = false;
    /// What sums a layer's statistics over the units stepping with unit r (nn::Mode::replica_sum);
    /// empty where unit r is alone.
    FunctionRef<void(std::span<double>)> replica_sum(int) { return nullptr; }
    /// Whether every unit steps on its share of one global batch (custom training loops need it).
    static constexpr bool lockstep = true;
    /// Whether the path runs the layers itself, stage by stage (Pipeline): Model then hands it
    /// a staged unit of work (stage the mini-batch; the loss of each micro-batch).
    static constexpr bool pipelined = false;
    /// Whether a training step is one unit's work on the calling thread, with nothing between its
    /// forward and backward that another unit, thread or process takes part in (gradient_ready
    /// starts no transfer): a place that can capture work as one graph (a GPU,
    /// train/place_step.hpp) may then capture the whole step.
    static constexpr bool captures_step = false;
    using unit_network = WholeNetwork;
    std::size_t gradient_buckets() const { return 0; }
    std::int64_t expected_updates(std::int64_t batches) const { return batches; }
    template <class Logs, class History>
    void end_epoch(Logs&, History&) const {}
    bool is_chief() const { return shard_group_chief(); }  // true, but for tensor parallelism across processes
    bool per_worker_input() const { return false; }
    template <class Y>
    ReplicaBatch<Y> unit_share(const data::Batch<Y>& batch, int r) const {
        return split_batch(batch, static_cast<const Derived&>(*this).units(), r);
    }
    /// The most examples one unit of this process works on at once, for batches of `n` examples
    /// as the dataset yields them (what Model::build reserves), in step with unit_share: n split
    /// over units(), rounded up.
    std::int64_t largest_unit_share(std::int64_t n) const {
        const std::int64_t u = static_cast<const Derived&>(*this).units();
        return u > 0 ? (n + u - 1) / u : n;
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
    /// f(r) for every unit r of this process, on the thread where a training step computes unit
    /// r's loss (Model::build sizes the loss's and the metrics' per-thread scratch there): the
    /// unit's own thread, run_units'. Pipeline: its last stage's.
    template <class F>
    void run_where_loss_runs(F&& f) { static_cast<Derived&>(*this).run_units(std::forward<F>(f)); }
};

/// The network a Model unit holds under path `Path`: `Path::unit_network`, or `Default` where
/// that is PathBase's WholeNetwork. A path without a public unit_network also gets `Default`
/// here; GradientPathCheck reports that path.
template <class Path, class Default>
struct UnitNetwork {
    using type = Default;
};
template <class Path, class Default>
    requires requires { typename Path::unit_network; } && (!std::is_same_v<typename Path::unit_network, WholeNetwork>)
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

/// A lockstep path's own hook beyond the GradientPath interface, checked from outside the
/// path (where the protected default is out of reach).
template <class Path>
concept LockstepHooks = requires(Path& p, StepTotals& t) { p.combine_totals(t); };

/// Shared by the lockstep paths: one gradient buffer per replica, every replica computes its
/// share of the same global batch, then `Derived::apply(r)` combines and updates.
template <class Derived, class Strategy, class Net, class T>
class LockstepPath : public PathBase<Derived>, protected LockstepBuffers<Strategy, T> {
public:
    using value_type = T;
    using place_type = typename Strategy::place_type;
    using P = place_type;
    static constexpr std::int64_t num_params = Net::num_params;

    explicit LockstepPath(Strategy& s) : LockstepBuffers<Strategy, T>(s, num_params) {
        // replica_sum's callables, one per replica, made here: a step allocates nothing (the
        // pointer to the derived path is taken now and used only once it is built).
        summers_.reserve(std::size_t(units()));
        for (int q = 0; q < units(); ++q) summers_.push_back({static_cast<Derived*>(this), q});
    }

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
        static_assert(LockstepHooks<Derived>,
                      "strata::distribute::detail::LockstepPath: the path has no public combine_totals(StepTotals&) (what "
                      "makes a step's totals global); define it, or take the default (nothing: one process) with "
                      "`using Base::combine_totals;` in the path's public part");
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
            t.counted += res[r].counted;
        }
        return t;
    }

    /// Unit r's share of a global batch (evaluate and predict split batches as training does).
    template <class Y>
    ReplicaBatch<Y> unit_share(const data::Batch<Y>& batch, int r) const {
        return split_batch(batch, strategy_->num_replicas_in_sync(), strategy_->first_replica() + r);
    }
    /// unit_share's largest: a global batch split over every replica in sync, rounded up.
    std::int64_t largest_unit_share(std::int64_t n) const {
        const std::int64_t r = strategy_->num_replicas_in_sync();
        return (n + r - 1) / r;
    }

    /// The lockstep schedule: one step per global batch of the source.
    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        while (const auto* batch = source.next())
            if (!on_step(train_step(*batch, step, work))) return;
    }

    // The optimizer state(s) a path keeps in opt_, for checkpoints and callbacks.
    std::vector<std::pair<std::string, std::vector<T>>> slots() const { return opt_.slots(); }
    bool set_slot(const std::string& n, const std::vector<T>& v) { return opt_.set_slot(n, v); }
    std::string optimizer_name() const { return opt_.optimizer_name(); }
    std::int64_t iterations() const { return opt_.iterations(); }
    void set_iterations(std::int64_t it) { opt_.set_iterations(it); }
    double learning_rate() const { return opt_.learning_rate(); }
    void set_learning_rate(double lr) { opt_.set_learning_rate(lr); }
    optim::LossScaleState loss_scale_state() const { return opt_.loss_scale_state(); }
    void set_loss_scale_state(const optim::LossScaleState& s) { opt_.set_loss_scale_state(s); }

protected:
    // Pieces of a step with nothing to do by default. Protected, as PathBase's defaults are: a
    // path defines each or takes it by name (`using Base::end_step;`), so that a misspelt
    // override is reported (GradientPathCheck, LockstepHooks) instead of running this no-op.
    void gradient_ready(int, std::int64_t) {}
    void end_step() {}
    /// Makes a step's totals global (MultiWorkerMirrored sums them over the processes).
    void combine_totals(StepTotals&) {}

    /// Every replica in sync (in this process and, under MultiWorkerMirrored, across processes)
    /// steps on its share of the same global batch: a layer's statistics can be summed over them.
    static constexpr bool syncs_batch_statistics = true;
    /// Sums `values` over every replica in sync (synchronized batch normalization), through the
    /// strategy's replica group, with its deadlines (a replica that never comes is named); empty
    /// with one replica. A path whose replicas' group is busy with something else at that moment
    /// (Mirrored's communication threads, reducing gradient buckets during backward) defines
    /// `sum_over_replicas(r, values)` to route it.
    FunctionRef<void(std::span<double>)> replica_sum(int r) {
        if (strategy_->num_replicas_in_sync() <= 1) return nullptr;
        return summers_[std::size_t(r)];
    }
    void sum_over_replicas(int r, std::span<double> values) {
        strategy_->group().all_reduce(r, values);  // a sum (the default), by the group's own choice of algorithm
    }
    struct Summer {
        Derived* path;
        int r;
        void operator()(std::span<double> v) const { path->sum_over_replicas(r, v); }
    };
    std::vector<Summer> summers_;  // one per unit, made by the constructor

    Derived& self() { return static_cast<Derived&>(*this); }
    using LockstepBuffers<Strategy, T>::strategy_;
    using LockstepBuffers<Strategy, T>::grads_;
    using LockstepBuffers<Strategy, T>::opt_;
};

/// Logs each parameter `parameters()` lists (a network's Seq::parameters) on `devices[c]` for
/// every copy c < copies, when the placement log is on (place::set_log_device_placement).
STRATA_DECL void log_variable_copies(std::vector<nn::ParamInfo> (*parameters)(), const std::vector<place::LogicalDevice>& devices,
                                     int copies);

// ---- The interface check ------------------------------------------------------------------
// Stand-ins for what Model passes to the template members (its sources, units of work and
// callbacks), so that the checks below name a member and its arguments without a Model.
struct SourceArchetype {
    const data::Batch<std::int32_t>* next();
};
struct WorkArchetype {
    template <class... A>
    UnitWork operator()(A&&...) const;
};
struct OnStepArchetype {
    bool operator()(const StepTotals&) const;
};
struct UnitFnArchetype {
    void operator()(int) const;
};
struct LogsArchetype {
    void set(const std::string&, double);
};
struct HistoryArchetype {};
struct NetArchetype {
    static std::string summary();
};

// One concept per member, so that GradientPathCheck can name the one that is missing.
template <class P>
concept path_types = requires {
    typename P::value_type;
    typename P::place_type;
    typename P::unit_network;
};
template <class P>
concept path_flags = requires {
    { std::bool_constant<P::lockstep>{} } -> std::same_as<std::bool_constant<P::lockstep>>;
    { std::bool_constant<P::pipelined>{} } -> std::same_as<std::bool_constant<P::pipelined>>;
    { std::bool_constant<P::captures_step>{} } -> std::same_as<std::bool_constant<P::captures_step>>;
};
template <class P>
concept path_units = requires(P& p, const P& cp, UnitFnArchetype f) {
    { cp.units() } -> std::convertible_to<int>;
    p.run_units(f);
};
template <class P>
concept path_schedule = requires(P& p, SourceArchetype& source, std::uint64_t& step, WorkArchetype work, OnStepArchetype on_step,
                                 const data::Batch<std::int32_t>& batch) {
    p.run_epoch(source, step, work, on_step);
    { p.train_step(batch, step, work) } -> std::same_as<StepTotals>;
};
template <class P>
concept path_variables = requires(P& p, const P& cp, int unit, const optim::Optimizer& opt, const collective::Settings& agreed,
                                  std::vector<typename P::value_type> w) {
    p.compile(opt, agreed);
    p.prepare_inference();
    { p.inference_params(unit) } -> std::convertible_to<const typename P::value_type*>;
    { cp.get_weights() } -> std::same_as<std::vector<typename P::value_type>>;
    p.set_weights(w);
    p.log_placement();
};
template <class P>
concept path_optimizer = requires(P& p, const P& cp, const std::string& name, const std::vector<typename P::value_type>& v) {
    { cp.slots() } -> std::convertible_to<std::vector<std::pair<std::string, std::vector<typename P::value_type>>>>;
    p.set_slot(name, v);
    { cp.optimizer_name() } -> std::convertible_to<std::string>;
    { cp.iterations() } -> std::convertible_to<std::int64_t>;
    p.set_iterations(std::int64_t(0));
    { cp.learning_rate() } -> std::convertible_to<double>;
    p.set_learning_rate(0.0);
    { cp.loss_scale_state() } -> std::convertible_to<optim::LossScaleState>;
    p.set_loss_scale_state(optim::LossScaleState{});
};
template <class P>
concept path_gradient_buckets = requires(const P& cp) { { cp.gradient_buckets() } -> std::convertible_to<std::size_t>; };
template <class P>
concept path_expected_updates = requires(const P& cp) { { cp.expected_updates(std::int64_t(0)) } -> std::convertible_to<std::int64_t>; };
template <class P>
concept path_end_epoch = requires(P& p, LogsArchetype& logs, HistoryArchetype& history) { p.end_epoch(logs, history); };
template <class P>
concept path_is_chief = requires(const P& cp) { { cp.is_chief() } -> std::convertible_to<bool>; };
template <class P>
concept path_per_worker_input = requires(const P& cp) { { cp.per_worker_input() } -> std::convertible_to<bool>; };
template <class P>
concept path_unit_share = requires(const P& cp, const data::Batch<std::int32_t>& batch) {
    { cp.unit_share(batch, 0) } -> std::same_as<ReplicaBatch<std::int32_t>>;
};
template <class P>
concept path_sum_over_workers = requires(P& p, std::span<double> values) { p.sum_over_workers(values); };
template <class P>
concept path_sum_outputs_over_workers = requires(P& p, std::span<typename P::value_type> rows) { p.sum_outputs_over_workers(rows); };
template <class P>
concept path_after_save = requires(const P& cp) { cp.after_save(); };
template <class P>
concept path_gathers_state = requires(const P& cp) { { cp.gathers_state() } -> std::convertible_to<bool>; };
template <class P>
concept path_bind_unit = requires(P& p, NetArchetype& net) { p.bind_unit(0, net); };
template <class P>
concept path_largest_unit_share = requires(const P& cp) { { cp.largest_unit_share(std::int64_t(1)) } -> std::convertible_to<std::int64_t>; };
template <class P>
concept path_run_where_loss_runs = requires(P& p, UnitFnArchetype f) { p.run_where_loss_runs(f); };
template <class P>
concept path_model_summary = requires { { P::template model_summary<NetArchetype>() } -> std::convertible_to<std::string>; };
/// The pieces of a step a lockstep path hands to custom training loops (Model's
/// compute_gradients, apply_gradients, end_step).
template <class P>
concept path_step_pieces = requires(P& p, int unit) {
    { p.params(unit) } -> std::convertible_to<const typename P::value_type*>;
    { p.grads(unit) } -> std::convertible_to<typename P::value_type*>;
    p.gradient_ready(unit, std::int64_t(0));
    p.apply(unit);
    p.end_step();
};

/// Whether `P` says it is lockstep (true while its flags are unreadable, so that only the
/// flags' own check reports it).
template <class P>
concept path_replica_sum = requires(P& p) {
    { P::syncs_batch_statistics } -> std::convertible_to<bool>;
    { p.replica_sum(0) } -> std::convertible_to<FunctionRef<void(std::span<double>)>>;
};

template <class P>
constexpr bool path_is_lockstep() {
    if constexpr (path_flags<P>) return P::lockstep;
    else return true;
}

}  // namespace detail

/// The interface Model relies on: every member of the file comment's list, and every member
/// detail::PathBase (and, for the lockstep paths, detail::LockstepPath) has a default for,
/// public. A default the path did not take by name is not public, so a misspelt override fails
/// here. detail::GradientPathCheck says which member is missing.
template <class Path>
concept GradientPathFor =
    detail::path_types<Path> && detail::path_flags<Path> && detail::path_units<Path> && detail::path_schedule<Path> &&
    detail::path_variables<Path> && detail::path_optimizer<Path> && detail::path_gradient_buckets<Path> &&
    detail::path_expected_updates<Path> && detail::path_end_epoch<Path> && detail::path_is_chief<Path> &&
    detail::path_per_worker_input<Path> && detail::path_unit_share<Path> && detail::path_sum_over_workers<Path> &&
    detail::path_sum_outputs_over_workers<Path> && detail::path_after_save<Path> && detail::path_gathers_state<Path> &&
    detail::path_bind_unit<Path> && detail::path_model_summary<Path> && detail::path_replica_sum<Path> &&
    detail::path_run_where_loss_runs<Path> && detail::path_largest_unit_share<Path> &&
    (!detail::path_is_lockstep<Path>() || detail::path_step_pieces<Path>);

namespace detail {

/// GradientPathFor, one member at a time: each missing member is its own error, whose sentence
/// names it and how to provide it. Model instantiates it with its path; `value` is the concept.
template <class Path>
struct GradientPathCheck {
#define STRATA_PATH_DEFAULT(member) \
    "; define it, or take detail::PathBase's default by name in the path's public part (`using Base::" member ";`, Base being the path's base class)"
    static_assert(path_types<Path>,
                  "strata::distribute::GradientPath: the path lacks a public value_type, place_type or unit_network (for "
                  "unit_network, take PathBase's WholeNetwork by name: `using Base::unit_network;`)");
    static_assert(path_flags<Path>,
                  "strata::distribute::GradientPath: the path has no public constant lockstep, pipelined or captures_step"
                  STRATA_PATH_DEFAULT("lockstep"));
    static_assert(path_units<Path>,
                  "strata::distribute::GradientPath: the path has no public units() or run_units(f) (its compute units, and f on each "
                  "unit's thread); every path defines them (detail::LockstepPath does for the lockstep paths)");
    static_assert(path_schedule<Path>,
                  "strata::distribute::GradientPath: the path has no public run_epoch(source, step, work, on_step) or "
                  "train_step(batch, step, work) returning StepTotals (fit's schedule and one update); every path defines "
                  "them (detail::LockstepPath does for the lockstep paths)");
    static_assert(path_variables<Path>,
                  "strata::distribute::GradientPath: the path lacks one of compile(optimizer, agreed), prepare_inference(), "
                  "inference_params(unit), get_weights(), set_weights(w), log_placement(); every path defines them");
    static_assert(path_optimizer<Path>,
                  "strata::distribute::GradientPath: the path lacks one of slots(), set_slot(name, v), optimizer_name(), "
                  "iterations(), set_iterations(n), learning_rate(), set_learning_rate(lr), loss_scale_state(), "
                  "set_loss_scale_state(s) (the optimizer state checkpoints "
                  "and callbacks read); every path defines them (detail::LockstepPath does for the lockstep paths)");
    static_assert(path_gradient_buckets<Path>,
                  "strata::distribute::GradientPath: the path has no public gradient_buckets()" STRATA_PATH_DEFAULT("gradient_buckets"));
    static_assert(path_expected_updates<Path>,
                  "strata::distribute::GradientPath: the path has no public expected_updates(batches)" STRATA_PATH_DEFAULT("expected_updates"));
    static_assert(path_end_epoch<Path>,
                  "strata::distribute::GradientPath: the path has no public end_epoch(logs, history)" STRATA_PATH_DEFAULT("end_epoch"));
    static_assert(path_is_chief<Path>,
                  "strata::distribute::GradientPath: the path has no public is_chief()" STRATA_PATH_DEFAULT("is_chief"));
    static_assert(path_per_worker_input<Path>,
                  "strata::distribute::GradientPath: the path has no public per_worker_input()" STRATA_PATH_DEFAULT("per_worker_input"));
    static_assert(path_unit_share<Path>,
                  "strata::distribute::GradientPath: the path has no public unit_share(batch, unit)" STRATA_PATH_DEFAULT("unit_share"));
    static_assert(path_sum_over_workers<Path>,
                  "strata::distribute::GradientPath: the path has no public sum_over_workers(values)" STRATA_PATH_DEFAULT("sum_over_workers"));
    static_assert(path_sum_outputs_over_workers<Path>,
                  "strata::distribute::GradientPath: the path has no public sum_outputs_over_workers(rows)"
                  STRATA_PATH_DEFAULT("sum_outputs_over_workers"));
    static_assert(path_after_save<Path>,
                  "strata::distribute::GradientPath: the path has no public after_save()" STRATA_PATH_DEFAULT("after_save"));
    static_assert(path_gathers_state<Path>,
                  "strata::distribute::GradientPath: the path has no public gathers_state()" STRATA_PATH_DEFAULT("gathers_state"));
    static_assert(path_bind_unit<Path>,
                  "strata::distribute::GradientPath: the path has no public bind_unit(unit, net)" STRATA_PATH_DEFAULT("bind_unit"));
    static_assert(path_model_summary<Path>,
                  "strata::distribute::GradientPath: the path has no public static model_summary<Net>()" STRATA_PATH_DEFAULT("model_summary"));
    static_assert(path_largest_unit_share<Path>,
                  "strata::distribute::GradientPath: the path has no public largest_unit_share(n)" STRATA_PATH_DEFAULT("largest_unit_share"));
    static_assert(path_run_where_loss_runs<Path>,
                  "strata::distribute::GradientPath: the path has no public run_where_loss_runs(f)" STRATA_PATH_DEFAULT("run_where_loss_runs"));
    static_assert(path_replica_sum<Path>,
                  "strata::distribute::GradientPath: the path has no public syncs_batch_statistics or replica_sum(unit)"
                  STRATA_PATH_DEFAULT("replica_sum, Base::syncs_batch_statistics"));
    static_assert(!path_is_lockstep<Path>() || path_step_pieces<Path>,
                  "strata::distribute::GradientPath: a lockstep path lacks one of params(unit), grads(unit), gradient_ready(unit, "
                  "first), apply(unit), end_step() (the pieces of a step for custom loops); define it, or take "
                  "detail::LockstepPath's no-op with a using-declaration (`using Base::end_step;`) in the path's public part");
#undef STRATA_PATH_DEFAULT
    static constexpr bool value = GradientPathFor<Path>;
};

}  // namespace detail
}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/gradient_path.ipp"
#endif
