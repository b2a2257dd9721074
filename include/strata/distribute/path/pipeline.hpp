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
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
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
    template <class F>
    void run_units(F&& f) {
        for (int r = 0; r < units(); ++r) f(r);
    }
    template <class N>
    void bind_unit(int r, N& net) { net.bind(*this, r); }

    void compile(const optim::Optimizer& o) {
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
            xs[std::size_t(r)] = work.prepare(r, shares[std::size_t(r)]);
            modes[std::size_t(r)] = work.mode(shares[std::size_t(r)], step);
        }
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
            auto& f = replicas_[0]->flow;
            stats_.steps += 1;
            stats_.wall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            stats_.virtual_seconds += *std::max_element(f.clock.begin(), f.clock.end());
        }
        StepTotals t;
        for (int r = 0; r < R; ++r) {
            const UnitWork u = work.result(r, shares[std::size_t(r)]);
            t.loss_sum += u.loss_sum;
            t.correct += double(u.correct);
        }
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
        return stage<S - 1>(r).out.view();
    }
    TensorView<T, P> inference_output_grad(int r) { return stage<S - 1>(r).out_grad.view(); }

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

    std::vector<T> get_weights() const {
        std::vector<T> w(static_cast<std::size_t>(num_params));
        for_each_stage([&](auto I) {
            const auto& d = std::get<I>(replicas_[0]->stages);
            if (d.num_params > 0)
                copy(d.params.view(), TensorView<T, place::Host>(w.data() + d.param_first, Shape{d.num_params}));
        });
        return w;
    }
    void set_weights(const std::vector<T>& w) {
        for (auto& rep : replicas_)
            for_each_stage([&](auto I) {
                auto& d = std::get<I>(rep->stages);
                if (d.num_params > 0)
                    copy(TensorView<T, place::Host>(const_cast<T*>(w.data()) + d.param_first, Shape{d.num_params}), d.params.view());
            });
    }
    std::vector<std::pair<std::string, std::vector<T>>> slots() const {
        std::vector<std::pair<std::string, std::vector<T>>> out;
        if (!compiled_) return out;
        for (auto& [name, t] : const_cast<optim::OptimizerState<T, P>&>(std::get<0>(replicas_[0]->stages).opt).slots())
            out.emplace_back(name, std::vector<T>(static_cast<std::size_t>(num_params)));
        for_each_stage([&](auto I) {
            auto& d = const_cast<std::tuple_element_t<I, Stages>&>(std::get<I>(replicas_[0]->stages));
            std::size_t i = 0;
            for (auto& [name, t] : d.opt.slots()) {
                if (d.num_params > 0)
                    copy(t.view(), TensorView<T, place::Host>(out[i].second.data() + d.param_first, Shape{d.num_params}));
                ++i;
            }
        });
        return out;
    }
    bool set_slot(const std::string& name, const std::vector<T>& v) {
        bool found = false;
        for (auto& rep : replicas_)
            for_each_stage([&](auto I) {
                auto& d = std::get<I>(rep->stages);
                for (auto& [n, t] : d.opt.slots())
                    if (n == name) {
                        found = true;
                        if (d.num_params > 0)
                            copy(TensorView<T, place::Host>(const_cast<T*>(v.data()) + d.param_first, Shape{d.num_params}), t.view());
                    }
            });
        return found;
    }
    std::string optimizer_name() const { return compiled_ ? stage0().opt.name() : std::string(); }
    std::int64_t iterations() const { return compiled_ ? stage0().opt.iterations() : 0; }
    void set_iterations(std::int64_t it) {
        each_state([&](auto& o) { o.set_iterations(it); });
    }
    double learning_rate() const { return compiled_ ? stage0().opt.current_learning_rate() : 0.0; }
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
        const auto names = Net::layer_names();
        for (int r = 0; r < units(); ++r)
            for (std::size_t s = 0; s < S; ++s) {
                std::string what = std::string(Schedule::name) + " pipeline stage " + std::to_string(s) +
                                   (units() > 1 ? " of replica " + std::to_string(r) : std::string()) + " (layers";
                for (std::size_t l = bounds[s]; l < bounds[s + 1]; ++l) what += " " + names[l];
                place::log_placement(what + "; its thread and work)", strategy_->device(r, int(s)));
            }
        for (const auto& p : Net::parameters()) {
            std::size_t layer = 0;
            while (layer + 1 < Net::num_layers && Net::offsets[layer + 1] <= p.offset) ++layer;
            for (int r = 0; r < units(); ++r)
                place::log_placement("variable " + p.name + " " + p.shape.str() + " (stage " + std::to_string(stage_of_layer(layer)) +
                                         (units() > 1 ? ", copy " + std::to_string(r) : std::string()) + ")",
                                     strategy_->device(r, stage_of_layer(layer)));
        }
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
    const auto& stage0() const { return std::get<0>(replicas_[0]->stages); }

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
        for (auto& rep : replicas_) for_each_stage([&](auto I) { f(std::get<I>(rep->stages).opt); });
    }

    // m micro-batches for a share of n examples (uneven sizes, see pipeline.hpp).
    std::int64_t micro_count(std::int64_t n) const { return std::max<std::int64_t>(1, std::min<std::int64_t>(strategy_->micro_batches(), n)); }
    static std::size_t slots_for(std::size_t s, std::int64_t m) {
        if constexpr (Schedule::one_f_one_b) return std::size_t(std::min<std::int64_t>(m, std::int64_t(S - s)));
        else return std::size_t(m);
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
    template <class Ready>
    void wait_for(int r, int s, const char* what, int from, std::int64_t k, Ready&& ready) {
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
    template <class F>
    void run_all(F&& fn) {
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
                        std::string layers;
                        const auto names = Net::layer_names();
                        for (std::size_t l = bounds[std::size_t(s)]; l < bounds[std::size_t(s) + 1]; ++l)
                            layers += (layers.empty() ? "" : ", ") + names[l];
                        first = "Pipeline: stage " + std::to_string(s) + " (" + layers + ")" +
                                (units() > 1 ? " of replica " + std::to_string(r) : std::string()) + " on " +
                                strategy_->device(r, s).name + " failed: " + e.what();
                    }
                }
                if (cause) abort_all(r, s);
                throw;
            }
        };
        try {
            strategy_->run_stages(wrapped, [](int, int) {});
        } catch (...) {
            for (std::size_t s = 0; s < S; ++s) strategy_->stage_group(int(s)).reset();
            if (failed) throw_error<DistributedError>(first);
            throw;
        }
    }
    void abort_all(int r, int s) {
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
        const auto sl = replica_slice(n, int(m), int(k));
        const std::size_t K = d.slots.size(), slot = std::size_t(k) % K;
        if constexpr (I + 1 < S) {
            // In inference nothing frees a slot but the next stage's copy of what it held.
            if (!training && std::size_t(k) >= K)
                wait_for(r, int(I), "the copy of its output", int(I + 1), k - std::int64_t(K),
                         [&](const detail::StageFlow& f) { return f.forwards[I + 1] > k - std::int64_t(K); });
        }
        TensorView<T, P> in;
        std::chrono::steady_clock::time_point t0;
        if constexpr (I == 0) {
            t0 = std::chrono::steady_clock::now();
            in = x.slice(sl.first, sl.count);
        } else {
            wait_for(r, int(I), "the activations", int(I - 1), k, [&](const detail::StageFlow& f) { return f.forwards[I - 1] > k; });
            t0 = std::chrono::steady_clock::now();
            auto& prev = stage<I - 1>(r);
            const TensorView<T, P> src = prev.slots[std::size_t(k) % prev.slots.size()]->output();
            d.in[slot].resize(src.shape());
            copy(src, d.in[slot].view());
            in = d.in[slot].view();
        }
        nn::Mode mm = mode;
        mm.first_example = mode.first_example + sl.first;
        if constexpr (I + 1 < S) mm.skip_activation = false;
        const TensorView<T, P> out = d.slots[slot]->forward(d.params.data(), in, mm);
        if constexpr (I + 1 == S) on_output(sl.first, out);
        P::synchronize();  // the output is complete before the next stage copies it
        if (training) {
            auto& f = replicas_[std::size_t(r)]->flow;
            double start = f.clock[I];
            if constexpr (I > 0) start = std::max(start, f.forward_end[I - 1][std::size_t(k)]);
            f.clock[I] = f.forward_end[I][std::size_t(k)] = start + 1.0;
            f.in_flight[I] += 1;
            if (r == 0) {
                auto& st = stats_.stages[I];
                st.busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                st.virtual_busy += 1.0;
                st.max_in_flight = std::max(st.max_in_flight, f.in_flight[I]);
            }
        }
        done(r, &detail::StageFlow::forwards, I, k + 1);
    }

    // Backward of micro-batch k on stage I of replica r: its gradient is added to the stage's
    // (micro-batch 0's written directly), its input's gradient copied into stage I-1's slot.
    template <std::size_t I>
    void backward_micro(int r, std::int64_t k, std::int64_t m, std::int64_t n, const nn::Mode& mode) {
        auto& d = stage<I>(r);
        const auto sl = replica_slice(n, int(m), int(k));
        const std::size_t slot = std::size_t(k) % d.slots.size();
        auto& net = *d.slots[slot];
        if constexpr (I + 1 < S)
            wait_for(r, int(I), "the gradient of its output", int(I + 1), k, [&](const detail::StageFlow& f) { return f.backwards[I + 1] > k; });
        const auto t0 = std::chrono::steady_clock::now();
        nn::Mode mm = mode;
        mm.first_example = mode.first_example + sl.first;
        if constexpr (I + 1 < S) mm.skip_activation = false;
        T* g = k == 0 ? d.grads.data() : d.scratch.data();
        if constexpr (I > 0) {
            d.in_grad[slot].resize(d.in[slot].shape());
            net.backward(d.params.data(), g, mm, [](std::int64_t, std::int64_t) {}, d.in_grad[slot].view());
            auto& prev = stage<I - 1>(r);
            copy(d.in_grad[slot].view(), prev.slots[std::size_t(k) % prev.slots.size()]->output_grad());
        } else {
            net.backward(d.params.data(), g, mm);
        }
        if (k > 0 && d.num_params > 0) axpy(T(1), d.scratch.view(), d.grads.view());
        P::synchronize();
        {
            auto& f = replicas_[std::size_t(r)]->flow;
            double start = f.clock[I];
            if constexpr (I + 1 < S) start = std::max(start, f.backward_end[I + 1][std::size_t(k)]);
            f.clock[I] = f.backward_end[I][std::size_t(k)] = start + 2.0;
            f.in_flight[I] -= 1;
            if (r == 0) {
                stats_.stages[I].busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                stats_.stages[I].virtual_busy += 2.0;
            }
        }
        done(r, &detail::StageFlow::backwards, I, k + 1);
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
            if constexpr (Schedule::one_f_one_b) {
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
            if constexpr (place::host_accessible_v<P>)
                strategy_->stage_group(int(I)).all_reduce(r, std::span<T>(d.grads.data(), std::size_t(d.num_params)), ReduceOp::Sum,
                                                          strategy_->options().all_reduce);
            else
                throw_error<ValueError>("Pipeline: replicas > 1 (the hybrid) needs host memory; on GPUs use replicas = 1");
        }
        d.opt.apply(d.params.data(), d.grads.data());
    }

    Strategy* strategy_;
    std::vector<std::unique_ptr<Replica>> replicas_;
    PipelineStats stats_;
    bool compiled_ = false;
};

}  // namespace strata::distribute
