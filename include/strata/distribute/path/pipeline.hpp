#pragma once
/// \file strata/distribute/path/pipeline.hpp
/// The gradient path of `Pipeline<P, Schedule, Split>` (distribute/pipeline.hpp): every stage
/// of every replica keeps its own slice of the variables (the flat layout's range of its
/// layers), its gradients and its optimizer state on its own device, and runs its layers on
/// its own thread. A step cuts each replica's share of the global batch into micro-batches and
/// runs the schedule on every stage at once; the stages meet only through the copies of
/// activations (forward) and of their gradients (backward) between neighbours. The loss is
/// Model's: the last stage calls the unit of work's `loss` on each micro-batch's output.
///
/// Buffers: stage s keeps K_s network "slots" (activations of a micro-batch in flight):
/// K_s = m under GPipe, min(m, P - s) under 1F1B; micro-batch k uses slot k mod K_s. Stage s+1
/// copies micro-batch k's output from stage s's slot when it starts k's forward (that slot is
/// not reused before k's backward, which comes later); stage s+1 copies the gradient of its
/// input into stage s's slot for k, which stays reserved for k until k's backward there.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/pipeline.hpp"
#include "strata/distribute/slice.hpp"
#include "strata/nn/sequential.hpp"

namespace strata::distribute {

namespace detail {

/// An Input spec for a stage that starts inside a model: the shape its first layer takes.
template <class Shape>
struct ShapeInput {
    using shape = Shape;
};

template <class Net, std::size_t First>
struct InputOfLayer {
    using type = typename std::tuple_element_t<First - 1, typename Net::template bound_layers<float, place::Host>>::output_shape;
};
template <class Net>
struct InputOfLayer<Net, 0> {
    using type = typename Net::input_shape;
};

/// Layers [First, Last) of a Sequential, as a Sequential of their own.
template <class Net, std::size_t First, std::size_t Last>
struct StageOf;
template <class In, class... Specs, std::size_t First, std::size_t Last>
struct StageOf<nn::Sequential<In, Specs...>, First, Last> {
    using input_shape = typename InputOfLayer<nn::Sequential<In, Specs...>, First>::type;
    template <std::size_t... I>
    static auto make(std::index_sequence<I...>)
        -> nn::Sequential<ShapeInput<input_shape>, std::tuple_element_t<First + I, std::tuple<Specs...>>...>;
    using type = decltype(make(std::make_index_sequence<Last - First>{}));
};

/// One stage of one replica's pipeline: layers [First, Last) of Net.
template <class Net, class T, class P, std::size_t First, std::size_t Last>
struct StageData {
    using Seq = typename StageOf<Net, First, Last>::type;
    using Network = nn::Network<Seq, T, P>;
    static constexpr std::size_t first_layer = First, last_layer = Last;
    static constexpr std::int64_t param_first = Net::offsets[First];
    static constexpr std::int64_t num_params = Net::offsets[Last] - Net::offsets[First];
    static_assert(Seq::num_params == num_params, "strata::distribute::Pipeline: a stage's parameters are not its layers' block");

    Tensor<T, P> params, grads, scratch;  // scratch: micro-batch k > 0's gradient, then added
    optim::OptimizerState<T, P> opt;
    std::vector<std::unique_ptr<Network>> slots;  // the activations of micro-batches in flight
    std::vector<Tensor<T, P>> in, in_grad;        // per slot (stages after the first): copied input, its gradient
    Tensor<T, P> out, out_grad;                   // last stage, inference: every micro-batch's output
};

template <class Net, class T, class P, auto Bounds, class Seq>
struct StageTuple;
template <class Net, class T, class P, auto Bounds, std::size_t... I>
struct StageTuple<Net, T, P, Bounds, std::index_sequence<I...>> {
    using type = std::tuple<StageData<Net, T, P, Bounds[I], Bounds[I + 1]>...>;
};

/// Progress of one replica's pipeline in the current run: micro-batches each stage has done.
struct StageFlow {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::int64_t> forwards, backwards;
    bool aborted = false;
    // The virtual clock (see PipelineStats): each stage's time, and when each micro-batch's
    // forward and backward ended there; written by the stage, read by its neighbours after the
    // flow's counters say they are done.
    std::vector<double> clock;
    std::vector<std::vector<double>> forward_end, backward_end;
    std::vector<std::int64_t> in_flight;
};

}  // namespace detail

/// What a Pipeline's stages did while training (GradientPath::pipeline_stats(); replica 0's stages),
/// summed over the steps since the path was built or reset_pipeline_stats() was called.
///
/// Two clocks. The real one: `busy_seconds` is the time a stage spent on its forwards and
/// backwards (the copies from its neighbour included, the waits not), `wall_seconds` the steps'
/// schedules from the first stage's start to the last one's end. The virtual one charges every
/// forward 1 unit and every backward 2 on every stage (balanced stages, as the bubble formula
/// assumes) and lets each start when the schedule and its neighbours allow: it measures the
/// schedule the code runs, free of the machine's noise. A stage's idle fraction is
/// 1 − busy / wall on either clock; both schedules should give (P − 1) / (m + P − 1).
struct PipelineStageStats {
    double busy_seconds = 0;
    double virtual_busy = 0;
    /// The most micro-batches this stage held activations for at once (forwarded, not yet
    /// backwarded): m under GPipe, at most P − s under 1F1B.
    std::int64_t max_in_flight = 0;
};
struct PipelineStats {
    std::int64_t steps = 0;
    double wall_seconds = 0;
    double virtual_seconds = 0;
    std::vector<PipelineStageStats> stages;
    double idle_fraction(std::size_t s) const { return wall_seconds > 0 ? 1 - stages[s].busy_seconds / wall_seconds : 0; }
    double virtual_idle_fraction(std::size_t s) const {
        return virtual_seconds > 0 ? 1 - stages[s].virtual_busy / virtual_seconds : 0;
    }
};

namespace detail {

/// What Model holds as a unit's network under a Pipeline: a handle on the path, which owns the
/// stages' networks on their devices. evaluate/predict call forward and output_grad on it;
/// training goes through the path's own schedule.
template <class Path>
class PipelineUnit {
public:
    using T = typename Path::value_type;
    using P = typename Path::place_type;
    static constexpr bool pipelined = true;
    void bind(Path& path, int replica) {
        path_ = &path;
        replica_ = replica;
    }
    void reserve(std::int64_t n, bool training) { path_->reserve(replica_, n, training); }
    /// Runs x through the stages (micro-batched, the stages at once); the variables are the
    /// stages' own (`params` is not used).
    TensorView<T, P> forward(const T*, const TensorView<T, P>& x, const nn::Mode& mode) { return path_->infer(replica_, x, mode); }
    TensorView<T, P> output_grad() const { return path_->inference_output_grad(replica_); }

private:
    Path* path_ = nullptr;
    int replica_ = 0;
};

}  // namespace detail

template <class P, class Schedule, class Split, class Net, class T>
class GradientPath<Pipeline<P, Schedule, Split>, Net, T> : public detail::PathBase<GradientPath<Pipeline<P, Schedule, Split>, Net, T>> {
public:
    using Strategy = Pipeline<P, Schedule, Split>;
    using value_type = T;
    using place_type = P;
    using unit_network = detail::PipelineUnit<GradientPath>;
    static constexpr bool pipelined = true;
    static constexpr std::size_t S = std::size_t(Split::stages);
    static constexpr auto bounds = Split::template bounds<Net>();
    static_assert(S <= Net::num_layers, "strata::distribute::Pipeline: more stages than layers: every stage needs at least one "
                                        "layer of the Sequential");
    static constexpr std::int64_t num_params = Net::num_params;
    using Stages = typename detail::StageTuple<Net, T, P, bounds, std::make_index_sequence<S>>::type;

    template <class Init>
    GradientPath(Strategy& s, Init&& init) : strategy_(&s) {
        // Across processes every rank must build the same model (a ValueError on every rank).
        if (across()) strategy_->processes().agree(detail::model_settings<Net, T>(), "the model");
        reset_pipeline_stats();
        for (int r = 0; r < units(); ++r) {
            replicas_.push_back(std::make_unique<Replica>());
            replicas_.back()->flow.forwards.assign(S, 0);
            replicas_.back()->flow.backwards.assign(S, 0);
        }
        run_all([&](int r, int st) {  // on the stage's thread: from its device's memory
            with_stage(st, [&](auto I) {
                auto& d = std::get<I>(replicas_[std::size_t(r)]->stages);
                using D = std::remove_cvref_t<decltype(d)>;
                d.params.resize(Shape{D::num_params});
                d.grads.resize(Shape{D::num_params});
                d.scratch.resize(Shape{D::num_params});
                fill(d.grads.view(), T(0));
            });
        });
        Tensor<T, P> all(Shape{num_params});
        init(all.data());
        set_weights(to_vector(all.view()));
    }

    /// What the stages did while training (see PipelineStats).
    const PipelineStats& pipeline_stats() const { return stats_; }
    void reset_pipeline_stats() {
        stats_ = {};
        stats_.stages.resize(S);
    }

    /// The split, for summaries: stage s holds layers [stage_bounds()[s], stage_bounds()[s+1]).
    static constexpr auto stage_bounds() { return bounds; }

    int units() const { return strategy_->num_replicas_in_sync(); }
    /// f(replica) for every replica, on the caller's thread (each call runs the replica's stages).
    /// (Across processes: this process's replica only.)
    template <class F>
    void run_units(F&& f) {
        for (int r = 0; r < units(); ++r)
            if (!across() || r == my_replica()) f(r);
    }
    template <class N>
    void bind_unit(int r, N& net) { net.bind(*this, r); }

    void compile(const optim::Optimizer& o) {
        if (across()) strategy_->processes().agree({{"optimizer", optim::describe(o)}}, "the optimizer");
        run_all([&](int r, int st) {
            with_stage(st, [&](auto I) {
                auto& d = std::get<I>(replicas_[std::size_t(r)]->stages);
                d.opt = optim::OptimizerState<T, P>(o, d.num_params);  // slots on the stage's device
            });
        });
        compiled_ = true;
    }

    // ---- the step -----------------------------------------------------------------------------

    template <class Y, class Work>
    StepTotals train_step(const data::Batch<Y>& batch, std::uint64_t& step_counter, Work&& work) {
        const std::uint64_t step = ++step_counter;
        const int R = units();
        const auto units_n = static_cast<std::size_t>(R);
        std::vector<ReplicaBatch<Y>> shares(units_n);
        std::vector<TensorView<T, P>> xs(units_n);
        std::vector<nn::Mode> modes(units_n);
        for (int r = 0; r < R; ++r) {
            shares[std::size_t(r)] = split_batch(batch, R, r);
            if (!across() || r == my_replica()) xs[std::size_t(r)] = work.prepare(r, shares[std::size_t(r)]);
            modes[std::size_t(r)] = work.mode(shares[std::size_t(r)], step);
        }
        current_step_ = step;
        ++exchange_;
        for (int r = 0; r < R; ++r) {
            auto& f = replicas_[std::size_t(r)]->flow;
            const auto m = std::size_t(micro_count(shares[std::size_t(r)].size));
            f.clock.assign(S, 0.0);
            f.in_flight.assign(S, 0);
            f.forward_end.assign(S, std::vector<double>(m, 0.0));
            f.backward_end.assign(S, std::vector<double>(m, 0.0));
        }
        const auto t0 = std::chrono::steady_clock::now();
        run_all([&](int r, int st) {
            with_stage(st, [&](auto I) {
                train_stage<I>(r, shares[std::size_t(r)], xs[std::size_t(r)], modes[std::size_t(r)], work);
            });
        });
        {
            auto& f = replicas_[std::size_t(my_replica())]->flow;
            stats_.steps += 1;
            stats_.wall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            stats_.virtual_seconds += *std::max_element(f.clock.begin(), f.clock.end());
        }
        StepTotals t;
        for (int r = 0; r < R; ++r) {
            if (across() && r != my_replica()) continue;
            const UnitWork u = work.result(r, shares[std::size_t(r)]);
            t.loss_sum += u.loss_sum;
            t.correct += double(u.correct);
        }
        double totals[2] = {t.loss_sum, t.correct};  // across processes: the last stages' figures, on every rank
        sum_over_workers(std::span<double>(totals, 2));
        t.loss_sum = totals[0];
        t.correct = totals[1];
        t.examples = std::int64_t(batch.size());
        return t;
    }

    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        while (const auto* batch = source.next())
            if (!on_step(train_step(*batch, step, work))) return;
    }

    /// Builds every stage's slots for micro-batches of a share of `n` examples (unit r's).
    void reserve(int r, std::int64_t n, bool training) {
        if (n <= 0) return;
        const std::int64_t m = micro_count(n), mb = (n + m - 1) / m;
        run_all([&](int rr, int st) {
            if (rr != r) return;
            with_stage(st, [&](auto I) { ensure_slots<I>(r, slots_for(I, m), mb, training); });
        });
    }

    /// Inference on unit r: x ([n, input...]) through the stages, micro-batched; returns the
    /// last stage's outputs ([n, output...], on its device), valid until the next call.
    TensorView<T, P> infer(int r, const TensorView<T, P>& x, const nn::Mode& mode) {
        const std::int64_t n = x.dim(0);
        const std::int64_t m = micro_count(n);
        reset_flow(r);
        current_step_ = 0;
        ++exchange_;
        run_all([&](int rr, int st) {
            if (rr != r) return;
            with_stage(st, [&](auto I) {
                auto& d = stage<I>(r);
                ensure_slots<I>(r, slots_for(I, m), (n + m - 1) / m, false);
                if constexpr (I + 1 == S) {
                    d.out.resize(Net::output_shape::batched(n));
                    d.out_grad.resize(Net::output_shape::batched(n));
                }
                for (std::int64_t k = 0; k < m; ++k)
                    forward_micro<I>(r, k, m, n, x, mode, false, [&](std::int64_t first, const TensorView<T, P>& out) {
                        if constexpr (I + 1 == S) copy(out, d.out.view().slice(first, out.dim(0)));
                    });
            });
        });
        if (!strategy_->runs(r, int(S - 1))) {
            // Across processes the outputs are on the last stage's rank; the others compute on a
            // placeholder, and their figures are left out of the sums (sum_over_workers).
            placeholder_.resize(Net::output_shape::batched(n));
            placeholder_grad_.resize(Net::output_shape::batched(n));
            fill(placeholder_.view(), T(1) / T(Net::output_shape::size));
            return placeholder_.view();
        }
        return stage<S - 1>(r).out.view();
    }
    TensorView<T, P> inference_output_grad(int r) {
        return strategy_->runs(r, int(S - 1)) ? stage<S - 1>(r).out_grad.view() : placeholder_grad_.view();
    }

    // ---- across processes ------------------------------------------------------------------------

    bool is_chief() const { return strategy_->is_chief(); }
    /// Across processes: values of the last stages (the loss, the metrics' counts, the outputs)
    /// summed over every rank (the other ranks count zero), so that every rank has the job's.
    template <class V>
    void sum_over_workers(std::span<V> values) {
        if (!across()) return;
        if (!strategy_->runs(my_replica(), int(S - 1)))
            for (auto& v : values) v = V(0);
        strategy_->processes().sum_all(values);
    }
    template <class V>
    void sum_outputs_over_workers(std::span<V> values) { sum_over_workers(values); }
    /// Across processes get_weights and slots gather the stages: every rank takes part in save.
    bool gathers_state() const { return across(); }
    void after_save() const {
        if (across()) strategy_->processes().barrier();
    }

    void prepare_inference() {}
    const T* inference_params(int) { return nullptr; }

    // Pieces of a step for custom training loops: a pipeline's step is one schedule over all
    // its stages, so it offers none of them (Model's compute_gradients refuses it).
    T* params(int) { return nullptr; }
    T* grads(int) { return nullptr; }
    void gradient_ready(int, std::int64_t) {}
    void apply(int) {}
    void end_step() {}

    // ---- variables and optimizer state, in the flat layout of one model ------------------------

    // Replica 0's stages (across processes: gathered from their ranks, every rank taking part).
    std::vector<T> get_weights() const {
        std::vector<T> w(static_cast<std::size_t>(num_params));
        for_each_stage([&](auto I) {
            if (!strategy_->runs(0, int(I))) return;
            const auto& d = std::get<I>(replicas_[0]->stages);
            if (d.num_params > 0)
                copy(d.params.view(), TensorView<T, place::Host>(w.data() + d.param_first, Shape{d.num_params}));
        });
        if (across()) strategy_->processes().sum_all(std::span<T>(w));
        return w;
    }
    // Every stage this process runs takes its part of `w` (across processes: one stage).
    void set_weights(const std::vector<T>& w) {
        for_each_local([&](auto& d) {
            if (d.num_params > 0)
                copy(TensorView<T, place::Host>(const_cast<T*>(w.data()) + d.param_first, Shape{d.num_params}), d.params.view());
        });
    }
    std::vector<std::pair<std::string, std::vector<T>>> slots() const {
        std::vector<std::pair<std::string, std::vector<T>>> out;
        if (!compiled_) return out;
        for (auto& [name, t] : const_cast<optim::OptimizerState<T, P>&>(local_state()).slots())
            out.emplace_back(name, std::vector<T>(static_cast<std::size_t>(num_params)));
        for_each_stage([&](auto I) {
            if (!strategy_->runs(0, int(I))) return;
            auto& d = const_cast<std::tuple_element_t<I, Stages>&>(std::get<I>(replicas_[0]->stages));
            std::size_t i = 0;
            for (auto& [name, t] : d.opt.slots()) {
                if (d.num_params > 0)
                    copy(t.view(), TensorView<T, place::Host>(out[i].second.data() + d.param_first, Shape{d.num_params}));
                ++i;
            }
        });
        if (across())
            for (auto& [name, v] : out) strategy_->processes().sum_all(std::span<T>(v));
        return out;
    }
    bool set_slot(const std::string& name, const std::vector<T>& v) {
        bool found = false;
        for_each_local([&](auto& d) {
            for (auto& [n, t] : d.opt.slots())
                if (n == name) {
                    found = true;
                    if (d.num_params > 0)
                        copy(TensorView<T, place::Host>(const_cast<T*>(v.data()) + d.param_first, Shape{d.num_params}), t.view());
                }
        });
        return found;
    }
    std::string optimizer_name() const { return compiled_ ? local_state().name() : std::string(); }
    std::int64_t iterations() const { return compiled_ ? local_state().iterations() : 0; }
    void set_iterations(std::int64_t it) {
        each_state([&](auto& o) { o.set_iterations(it); });
    }
    double learning_rate() const { return compiled_ ? local_state().current_learning_rate() : 0.0; }
    void set_learning_rate(double lr) {
        each_state([&](auto& o) { o.set_learning_rate(lr); });
    }

    /// Which stage holds layer `l`.
    static constexpr int stage_of_layer(std::size_t l) {
        int s = 0;
        while (std::size_t(s + 1) < bounds.size() && bounds[std::size_t(s + 1)] <= l) ++s;
        return s;
    }

    /// One line per stage (its thread, layers and device) and per variable copy.
    void log_placement() {
        if (!place::get_log_device_placement()) return;
        detail::log_pipeline_placement(*strategy_, units(), bounds, Net::layer_names(), Net::parameters(), Net::offsets);
    }

    /// Net's summary, then the split: each stage's layers, parameters and FLOPs per example.
    template <class N>
    static std::string model_summary() {
        std::string out = N::summary();
        const auto names = N::layer_names();
        const auto params = split::layer_costs<N, split::ByParams>();
        const auto flops = split::layer_costs<N, split::ByFlops>();
        out += "Pipeline: " + std::to_string(S) + " stages (" + std::string(Split::name) + " split), " + Schedule::name +
               " schedule; stage s runs on logical device r*P + s of replica r\n";
        char line[200];
        std::snprintf(line, sizeof line, "%-6s %-40s %14s %16s\n", "Stage", "Layers", "Params", "MFLOPs/example");
        out += line;
        for (std::size_t s = 0; s < S; ++s) {
            std::string layers;
            double p = 0, f = 0;
            for (std::size_t l = bounds[s]; l < bounds[s + 1]; ++l) {
                layers += (layers.empty() ? "" : ", ") + names[l];
                p += params[l];
                f += flops[l];
            }
            if (layers.size() > 40) layers = layers.substr(0, 37) + "...";
            std::snprintf(line, sizeof line, "%-6zu %-40s %14.0f %16.3f\n", s, layers.c_str(), p, f / 1e6);
            out += line;
        }
        return out;
    }

private:
    struct Replica {
        Stages stages;
        detail::StageFlow flow;
    };

    template <std::size_t I>
    auto& stage(int r) {
        return std::get<I>(replicas_[std::size_t(r)]->stages);
    }

    bool across() const { return strategy_->across_processes(); }
    // The replica and stage this process runs across processes (replica 0, stage 0 in one process).
    int my_replica() const { return across() ? strategy_->rank() / int(S) : 0; }
    int my_stage() const { return across() ? strategy_->rank() % int(S) : 0; }
    // f(stage data) for every stage this process runs.
    template <class F>
    void for_each_local(F&& f) {
        for (int r = 0; r < units(); ++r)
            for_each_stage([&](auto I) {
                if (strategy_->runs(r, int(I))) f(std::get<I>(replicas_[std::size_t(r)]->stages));
            });
    }
    // The optimizer state of a stage this process runs (they all move in lockstep).
    const optim::OptimizerState<T, P>& local_state() const {
        const optim::OptimizerState<T, P>* o = nullptr;
        with_stage(my_stage(), [&](auto I) { o = &std::get<I>(replicas_[std::size_t(my_replica())]->stages).opt; });
        return *o;
    }

    template <class F>
    static void for_each_stage(F&& f) {
        [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::integral_constant<std::size_t, I>{}), ...); }(std::make_index_sequence<S>{});
    }
    template <class F>
    static void with_stage(int s, F&& f) {
        for_each_stage([&](auto I) {
            if (std::size_t(s) == I) f(I);
        });
    }
    template <class F>
    void each_state(F&& f) {
        for_each_local([&](auto& d) { f(d.opt); });
    }

    // m micro-batches for a share of n examples (uneven sizes, see pipeline.hpp).
    std::int64_t micro_count(std::int64_t n) const { return std::max<std::int64_t>(1, std::min<std::int64_t>(strategy_->micro_batches(), n)); }
    std::size_t slots_for(std::size_t s, std::int64_t m) const {
        if (strategy_->one_f_one_b()) return std::size_t(std::min<std::int64_t>(m, std::int64_t(S - s)));
        return std::size_t(m);
    }

    template <std::size_t I>
    void ensure_slots(int r, std::size_t count, std::int64_t micro, bool training) {
        auto& d = stage<I>(r);
        using D = std::remove_cvref_t<decltype(d)>;
        while (d.slots.size() < count) {
            d.slots.push_back(std::make_unique<typename D::Network>());
            d.slots.back()->number_layers_from(D::first_layer);
            d.in.emplace_back();
            d.in_grad.emplace_back();
        }
        for (std::size_t k = 0; k < d.slots.size(); ++k) {
            d.slots[k]->reserve(micro, training);
            if constexpr (I > 0) {
                const Shape s = D::Seq::input_shape::batched(micro);
                if (d.in[k].capacity() < std::size_t(s.size())) {
                    d.in[k].resize(s);
                    fill(d.in[k].view(), T(0));
                }
                if (training && d.in_grad[k].capacity() < std::size_t(s.size())) {
                    d.in_grad[k].resize(s);
                    fill(d.in_grad[k].view(), T(0));
                }
            }
        }
    }

    void reset_flow(int r) {
        auto& f = replicas_[std::size_t(r)]->flow;
        std::lock_guard<std::mutex> lock(f.mu);
        std::fill(f.forwards.begin(), f.forwards.end(), 0);
        std::fill(f.backwards.begin(), f.backwards.end(), 0);
        f.aborted = false;
    }

    // Waits (with the strategy's deadline) until `ready()` holds under replica r's flow lock.
    void wait_for(int r, int s, const char* what, int from, std::int64_t k, FunctionRef<bool(const detail::StageFlow&)> ready) {
        auto& f = replicas_[std::size_t(r)]->flow;
        std::unique_lock<std::mutex> lock(f.mu);
        const auto timeout = strategy_->options().timeout;
        if (!f.cv.wait_for(lock, timeout, [&] { return f.aborted || ready(f); }))
            throw_error<DistributedError>("Pipeline: stage ", s, " (", strategy_->device(r, s).name, ") waited more than ",
                                          timeout.count(), " ms for ", what, " of micro-batch ", k, " from stage ", from, " (",
                                          strategy_->device(r, from).name, ")");
        if (f.aborted) throw_error<DistributedError>("Pipeline: stage ", s, " stopped: another stage failed");
    }
    void done(int r, std::vector<std::int64_t> detail::StageFlow::*which, std::size_t s, std::int64_t count) {
        auto& f = replicas_[std::size_t(r)]->flow;
        {
            std::lock_guard<std::mutex> lock(f.mu);
            (f.*which)[s] = count;
        }
        f.cv.notify_all();
    }

    // Runs fn(replica, stage) on every stage's thread. The first stage to throw wakes the
    // others (its flow and the stage groups abort) and is named in the error.
    void run_all(FunctionRef<void(int, int)> fn) {
        if (!failed_across_.empty())
            throw_error<DistributedError>("Pipeline: the pipeline across processes failed earlier (", failed_across_,
                                          "); restart the job");
        for (int r = 0; r < units(); ++r) reset_flow(r);
        std::mutex mu;
        std::string first;
        bool failed = false;
        auto wrapped = [&](int r, int s) {
            try {
                fn(r, s);
            } catch (const std::exception& e) {
                bool cause = false;
                {
                    std::lock_guard<std::mutex> lock(mu);
                    if (!failed) {
                        failed = cause = true;
                        first = detail::pipeline_stage_failure(*strategy_, units(), r, s, bounds, Net::layer_names(), e);
                    }
                }
                if (cause) abort_all(r, s, first);
                throw;
            }
        };
        try {
            strategy_->run_stages(wrapped, [](int, int) {});
        } catch (...) {
            if (!across())
                for (std::size_t s = 0; s < S; ++s) strategy_->stage_group(int(s)).reset();
            if (failed) throw_error<DistributedError>(first);
            throw;
        }
    }
    void abort_all(int r, int s, const std::string& why) {
        if (across()) {
            // The neighbours may be waiting for this stage: they stop at once, and tell theirs.
            failed_across_ = why;
            for (int to : {s - 1, s + 1})
                if (to >= 0 && to < int(S)) {
                    const auto text = std::as_bytes(std::span<const char>(why.data(), why.size()));
                    try {
                        strategy_->processes().send(Strategy::rank_of(r, to), abort_kind, exchange_, text);
                    } catch (...) {  // the neighbour is gone: it needs no telling
                    }
                }
            strategy_->processes().fail(why);
            return;
        }
        for (auto& rep : replicas_) {
            {
                std::lock_guard<std::mutex> lock(rep->flow.mu);
                rep->flow.aborted = true;
            }
            rep->flow.cv.notify_all();
        }
        for (std::size_t q = 0; q < S; ++q) strategy_->stage_group(int(q)).abort(r, "stage " + std::to_string(s) + " threw");
    }

    // Forward of micro-batch k (of m, over a share of n examples) on stage I of replica r.
    // `on_output(first, out)` gets the last stage's output (the loss, or the inference copy).
    template <std::size_t I, class OnOutput>
    void forward_micro(int r, std::int64_t k, std::int64_t m, std::int64_t n, const TensorView<T, P>& x, const nn::Mode& mode,
                       bool training, OnOutput&& on_output) {
        auto& d = stage<I>(r);
        using D = std::remove_cvref_t<decltype(d)>;
        const auto sl = replica_slice(n, int(m), int(k));
        const std::size_t K = d.slots.size(), slot = std::size_t(k) % K;
        if constexpr (I + 1 < S) {
            // In inference nothing frees a slot but the next stage's copy of what it held (a
            // message across processes is a copy already).
            if (!training && !across() && std::size_t(k) >= K)
                wait_for(r, int(I), "the copy of its output", int(I + 1), k - std::int64_t(K),
                         [&](const detail::StageFlow& f) { return f.forwards[I + 1] > k - std::int64_t(K); });
        }
        auto& f = replicas_[std::size_t(r)]->flow;
        TensorView<T, P> in;
        double ready = 0;  // on the virtual clock: when the input was ready
        std::chrono::steady_clock::time_point t0;
        if constexpr (I == 0) {
            t0 = std::chrono::steady_clock::now();
            in = x.slice(sl.first, sl.count);
        } else if (across()) {
            d.in[slot].resize(D::Seq::input_shape::batched(sl.count));
            ready = receive_from(r, int(I), int(I - 1), activations_kind, k, d.in[slot].view());
            t0 = std::chrono::steady_clock::now();
            in = d.in[slot].view();
        } else {
            wait_for(r, int(I), "the activations", int(I - 1), k, [&](const detail::StageFlow& fl) { return fl.forwards[I - 1] > k; });
            t0 = std::chrono::steady_clock::now();
            auto& prev = stage<I - 1>(r);
            const TensorView<T, P> src = prev.slots[std::size_t(k) % prev.slots.size()]->output();
            d.in[slot].resize(src.shape());
            copy(src, d.in[slot].view());
            in = d.in[slot].view();
            if (training) ready = f.forward_end[I - 1][std::size_t(k)];
        }
        nn::Mode mm = mode;
        mm.first_example = mode.first_example + sl.first;
        if constexpr (I + 1 < S) mm.skip_activation = false;
        const TensorView<T, P> out = d.slots[slot]->forward(d.params.data(), in, mm);
        if constexpr (I + 1 == S) on_output(sl.first, out);
        P::synchronize();  // the output is complete before the next stage copies it
        double end = 0;
        if (training) {
            end = f.clock[I] = f.forward_end[I][std::size_t(k)] = std::max(f.clock[I], ready) + 1.0;
            f.in_flight[I] += 1;
            if (r == my_replica()) {
                auto& st = stats_.stages[I];
                st.busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                st.virtual_busy += 1.0;
                st.max_in_flight = std::max(st.max_in_flight, f.in_flight[I]);
            }
        }
        if constexpr (I + 1 < S)
            if (across()) send_to(r, int(I + 1), activations_kind, k, end, out);
        done(r, &detail::StageFlow::forwards, I, k + 1);
    }

    // Backward of micro-batch k on stage I of replica r: its gradient is added to the stage's
    // (micro-batch 0's written directly), its input's gradient copied into stage I-1's slot
    // (across processes: sent to stage I-1's rank).
    template <std::size_t I>
    void backward_micro(int r, std::int64_t k, std::int64_t m, std::int64_t n, const nn::Mode& mode) {
        auto& d = stage<I>(r);
        const auto sl = replica_slice(n, int(m), int(k));
        const std::size_t slot = std::size_t(k) % d.slots.size();
        auto& net = *d.slots[slot];
        auto& f = replicas_[std::size_t(r)]->flow;
        double ready = 0;  // on the virtual clock: when the gradient of the output was ready
        if constexpr (I + 1 < S) {
            if (across()) {
                ready = receive_from(r, int(I), int(I + 1), gradient_kind, k, net.output_grad());
            } else {
                wait_for(r, int(I), "the gradient of its output", int(I + 1), k,
                         [&](const detail::StageFlow& fl) { return fl.backwards[I + 1] > k; });
                ready = f.backward_end[I + 1][std::size_t(k)];
            }
        }
        const auto t0 = std::chrono::steady_clock::now();
        nn::Mode mm = mode;
        mm.first_example = mode.first_example + sl.first;
        if constexpr (I + 1 < S) mm.skip_activation = false;
        T* g = k == 0 ? d.grads.data() : d.scratch.data();
        if constexpr (I > 0) {
            d.in_grad[slot].resize(d.in[slot].shape());
            net.backward(d.params.data(), g, mm, [](std::int64_t, std::int64_t) {}, d.in_grad[slot].view());
            if (!across()) {
                auto& prev = stage<I - 1>(r);
                copy(d.in_grad[slot].view(), prev.slots[std::size_t(k) % prev.slots.size()]->output_grad());
            }
        } else {
            net.backward(d.params.data(), g, mm);
        }
        if (k > 0 && d.num_params > 0) axpy(T(1), d.scratch.view(), d.grads.view());
        P::synchronize();
        const double end = f.clock[I] = f.backward_end[I][std::size_t(k)] = std::max(f.clock[I], ready) + 2.0;
        f.in_flight[I] -= 1;
        if (r == my_replica()) {
            stats_.stages[I].busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            stats_.stages[I].virtual_busy += 2.0;
        }
        if constexpr (I > 0)
            if (across()) send_to(r, int(I - 1), gradient_kind, k, end, d.in_grad[slot].view());
        done(r, &detail::StageFlow::backwards, I, k + 1);
    }

    // ---- across processes: the messages between neighbouring stages -------------------------------
    // A message is a head (the micro-batch, its end on the virtual clock) and the values; its
    // step is the run's number (exchange_), the same on every rank, so that nothing stale matches.
    static constexpr std::uint32_t activations_kind = 1, gradient_kind = 2, abort_kind = 3;
    struct MessageHead {
        std::int64_t micro;
        double clock;
    };
    // Sends micro-batch k's `values` to stage `to` of replica r.
    void send_to(int r, int to, std::uint32_t kind, std::int64_t k, double clock, const TensorView<T, P>& values) {
        std::vector<std::byte>& bytes = send_buffer_;
        bytes.resize(sizeof(MessageHead) + std::size_t(values.size()) * sizeof(T));
        const MessageHead head{k, clock};
        std::memcpy(bytes.data(), &head, sizeof head);
        copy(values, TensorView<T, place::Host>(reinterpret_cast<T*>(bytes.data() + sizeof head), values.shape()));
        strategy_->processes().send(Strategy::rank_of(r, to), kind, exchange_, bytes);
    }
    // Receives micro-batch k's values from stage `from` of replica r into `dst`; returns the
    // virtual clock they carry. A neighbour that failed and said so ends the wait at once. The
    // wait is the timeout times the stages on that side (`from` and those beyond it): a stage
    // that stops far away is named by its own neighbour first, whose word then travels back,
    // so that no stage names a live neighbour that was only waiting too.
    double receive_from(int r, int s, int from, std::uint32_t kind, std::int64_t k, const TensorView<T, P>& dst) {
        const int beyond = from < s ? from + 1 : int(S) - from;
        const auto timeout = strategy_->options().timeout * beyond;
        const std::string what = "Pipeline: stage " + std::to_string(s) + (units() > 1 ? " of replica " + std::to_string(r) : std::string()) +
                                 " (rank " + std::to_string(strategy_->rank()) + ") waited for " +
                                 (kind == activations_kind ? "the activations" : "the gradient of its output") + " of micro-batch " +
                                 std::to_string(k) + (current_step_ > 0 ? " of step " + std::to_string(current_step_) : std::string(" (inference)"));
        auto msg = strategy_->processes().receive(Strategy::rank_of(r, from), what, timeout);
        if (msg.kind == abort_kind)
            throw_error<DistributedError>("Pipeline: stage ", s, " (rank ", strategy_->rank(), ") stopped because its neighbour ",
                                          strategy_->processes().name(Strategy::rank_of(r, from)), " failed: ",
                                          std::string_view(reinterpret_cast<const char*>(msg.payload.data()), msg.payload.size()));
        MessageHead head{-1, 0};
        if (msg.payload.size() >= sizeof head) std::memcpy(&head, msg.payload.data(), sizeof head);
        STRATA_CHECK(msg.kind == kind && msg.step == exchange_ && head.micro == k &&
                         msg.payload.size() == sizeof head + std::size_t(dst.size()) * sizeof(T),
                     DistributedError, what, ": ", strategy_->processes().name(Strategy::rank_of(r, from)),
                     " sent another message (kind ", msg.kind, ", run ", msg.step, ", micro-batch ", head.micro, ", ",
                     msg.payload.size(), " bytes; expected kind ", kind, ", run ", exchange_, ", micro-batch ", k, ", ",
                     sizeof head + std::size_t(dst.size()) * sizeof(T), " bytes): is every process the same program?");
        copy(TensorView<T, place::Host>(reinterpret_cast<T*>(msg.payload.data() + sizeof head), dst.shape()), dst);
        return head.clock;
    }

    template <std::size_t I, class Y, class Work>
    void train_stage(int r, const ReplicaBatch<Y>& b, const TensorView<T, P>& x, const nn::Mode& mode, Work& work) {
        auto& d = stage<I>(r);
        const std::int64_t n = b.size;
        if (n == 0) {
            if (d.num_params > 0) fill(d.grads.view(), T(0));
        } else {
            const std::int64_t m = micro_count(n);
            ensure_slots<I>(r, slots_for(I, m), (n + m - 1) / m, true);
            const double denominator = double(b.global_size);
            auto F = [&](std::int64_t k) {
                forward_micro<I>(r, k, m, n, x, mode, true, [&](std::int64_t first, const TensorView<T, P>& out) {
                    if constexpr (I + 1 == S) work.loss(r, b, first, out, d.slots[std::size_t(k) % d.slots.size()]->output_grad(), denominator);
                });
            };
            auto B = [&](std::int64_t k) { backward_micro<I>(r, k, m, n, mode); };
            if (strategy_->one_f_one_b()) {
                const std::int64_t warm = std::min<std::int64_t>(std::int64_t(S - 1 - I), m);
                for (std::int64_t k = 0; k < warm; ++k) F(k);
                for (std::int64_t i = 0; i < m - warm; ++i) {
                    F(warm + i);
                    B(i);
                }
                for (std::int64_t k = m - warm; k < m; ++k) B(k);
            } else {
                for (std::int64_t k = 0; k < m; ++k) F(k);
                for (std::int64_t k = 0; k < m; ++k) B(k);
            }
        }
        if (units() > 1 && d.num_params > 0) {
            STRATA_PROFILE_MODEL("all-reduce");
            if constexpr (place::host_accessible_v<P>) {
                const std::span<T> grads(d.grads.data(), std::size_t(d.num_params));
                if (across()) strategy_->processes().sum_copies(grads);  // over the R ranks of stage I
                else strategy_->stage_group(int(I)).all_reduce(r, grads, ReduceOp::Sum, strategy_->options().all_reduce);
            } else
                throw_error<ValueError>("Pipeline: replicas > 1 (the hybrid) needs host memory; on GPUs use replicas = 1");
        }
        d.opt.apply(d.params.data(), d.grads.data());
    }

    Strategy* strategy_;
    std::vector<std::unique_ptr<Replica>> replicas_;
    PipelineStats stats_;
    bool compiled_ = false;
    // Across processes: the runs (steps and inference passes) so far, the step being trained
    // (0: inference), a message being built, the outputs of a rank without the last stage, and
    // why the pipeline failed (empty while it has not).
    std::uint64_t exchange_ = 0, current_step_ = 0;
    std::vector<std::byte> send_buffer_;
    Tensor<T, P> placeholder_, placeholder_grad_;
    std::string failed_across_;
};

}  // namespace strata::distribute
