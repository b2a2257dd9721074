#pragma once
/// \file strata/distribute/path/pipeline.hpp
/// The gradient path of `Pipeline<P, Schedule, Split>` (distribute/pipeline.hpp): every stage
/// of every replica keeps its own slice of the variables (the flat layout's range of its
/// layers), its gradients and its optimizer state on its own device, and runs its layers on
/// its own thread. The stages are run-time ranges of the model's layers, each run by the one
/// compiled Network<Net, T, P> (its `Network(first, last)` form): the path's code,
/// detail::PipelinePath<P, Net, T>, is the same for every split and schedule, so a program
/// with several splits of one model compiles it once. A step cuts each replica's share of the global batch into micro-batches and
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
#include <utility>
#include <vector>

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/pipeline_strategy.hpp"
#include "strata/distribute/slice.hpp"
#include "strata/nn/sequential.hpp"

namespace strata::distribute {

namespace detail {

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
    /// Across processes: the messages this process sent its neighbouring stages (activations
    /// forward, their gradients backward; training and inference), and the bytes of the values
    /// they carried (heads left out). Under pipeline × tensor with scatter_gather, 1/N of each.
    std::int64_t messages_sent = 0, message_bytes_sent = 0;
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

namespace detail {

/// One stage of one replica's pipeline: layers [first_layer, last_layer) of Net, their block of
/// the flat layout ([param_first, param_first + num_params)), and the networks that run them.
template <class Net, class T, class P>
struct PipelineStage {
    using Network = nn::Network<Net, T, P>;
    std::size_t first_layer = 0, last_layer = 0;
    std::int64_t param_first = 0, num_params = 0;
    Tensor<T, P> params, grads, scratch;  // scratch: micro-batch k > 0's gradient, then added
    optim::OptimizerState<T, P> opt;
    std::vector<std::unique_ptr<Network>> slots;  // the activations of micro-batches in flight
    std::vector<Tensor<T, P>> in, in_grad;        // per slot (stages after the first): copied input, its gradient
    Tensor<T, P> out, out_grad;                   // last stage, inference: every micro-batch's output
};

/// What a Pipeline's gradient path does, for one network and element type, whatever the
/// split and schedule: they are the strategy's at run time (`bounds`, PipelineRuntime's
/// one_f_one_b()). GradientPath<Pipeline<P, Schedule, Split>, Net, T> derives from it.
template <class P, class Net, class T>
class PipelinePath : public PathBase<PipelinePath<P, Net, T>> {
    using Base = PathBase<PipelinePath<P, Net, T>>;

public:
    // The defaults this path takes, by name (PathBase says why).
    using Base::lockstep, Base::gradient_buckets, Base::expected_updates, Base::end_epoch, Base::per_worker_input, Base::unit_share;
    using Base::replica_sum, Base::largest_unit_share, Base::captures_step;
    /// Synchronized batch normalization in the hybrid (replicas > 1): each micro-batch's
    /// statistics are summed over the replicas' same micro-batch, through the stage's replica
    /// group in one process, over the stage's ranks across processes (StageSummer).
    static constexpr bool syncs_batch_statistics = true;
    using value_type = T;
    using place_type = P;
    using unit_network = PipelineUnit<PipelinePath>;
    static constexpr bool pipelined = true;
    static constexpr std::int64_t num_params = Net::num_params;

    /// Stage s of every replica holds layers [bounds[s], bounds[s + 1]); `init(all)` writes the
    /// initial values of every variable, in the flat layout.
    PipelinePath(PipelineRuntime& s, std::vector<std::size_t> bounds, FunctionRef<void(T*)> init)
        : strategy_(&s), bounds_(std::move(bounds)), S(bounds_.size() - 1) {
        STRATA_CHECK(S >= 1 && int(S) == s.num_stages() && bounds_.front() == 0 && bounds_.back() == Net::num_layers,
                     ValueError, "Pipeline: the split does not cover the model's ", Net::num_layers, " layers in ", s.num_stages(),
                     " stages");
        for (std::size_t i = 0; i < S; ++i)
            STRATA_CHECK(bounds_[i] < bounds_[i + 1], ValueError, "Pipeline: stage ", i, " holds no layer (layers [", bounds_[i],
                         ", ", bounds_[i + 1], ")); every stage needs at least one");
        // Across processes every rank must build the same model (a ValueError on every rank).
        if (across()) strategy_->processes().agree(model_settings<Net, T>(), "the model");
        reset_pipeline_stats();
        step_x_.resize(std::size_t(units()));
        step_mode_.resize(std::size_t(units()));
        for (int r = 0; r < units(); ++r)
            for (std::size_t st = 0; st < S; ++st) stage_summers_.push_back({this, r, int(st)});
        for (int r = 0; r < units(); ++r) {
            replicas_.push_back(std::make_unique<Replica>());
            auto& rep = *replicas_.back();
            rep.flow.forwards.assign(S, 0);
            rep.flow.backwards.assign(S, 0);
            rep.stages.resize(S);
            for (std::size_t st = 0; st < S; ++st) {
                auto& d = rep.stages[st];
                d.first_layer = bounds_[st];
                d.last_layer = bounds_[st + 1];
                d.param_first = Net::offsets[d.first_layer];
                d.num_params = Net::offsets[d.last_layer] - d.param_first;
            }
        }
        run_all([&](int r, int st) {  // on the stage's thread: from its device's memory
            auto& d = stage(r, std::size_t(st));
            d.params.resize(Shape{d.num_params});
            d.grads.resize(Shape{d.num_params});
            d.scratch.resize(Shape{d.num_params});
            fill(d.grads.view(), T(0));
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

    /// The split: stage s holds layers [stage_bounds()[s], stage_bounds()[s+1]).
    const std::vector<std::size_t>& stage_bounds() const { return bounds_; }
    /// Which stage holds layer `l`.
    int stage_of_layer(std::size_t l) const {
        int s = 0;
        while (std::size_t(s + 1) < bounds_.size() && bounds_[std::size_t(s + 1)] <= l) ++s;
        return s;
    }

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
    /// f(r) on the thread of unit r's last stage, where a training step computes its loss (for
    /// every unit this process runs a last stage of).
    template <class F>
    void run_where_loss_runs(F&& f) {
        run_all([&](int r, int st) {
            if (std::size_t(st) == S - 1) f(r);
        });
    }

    void compile(const optim::Optimizer& o, const collective::Settings& agreed) {
        if (across()) strategy_->processes().agree(agreed, "compile's settings");
        const auto infos = Net::parameters();
        run_all([&](int r, int st) {
            auto& d = stage(r, std::size_t(st));
            d.opt = optim::OptimizerState<T, P>(o, d.num_params, detail::moving_ranges(infos, d.param_first, d.num_params));  // slots on the stage's device
        });
        compiled_ = true;
    }

    // ---- the step -----------------------------------------------------------------------------

    template <class Y, class Work>
    StepTotals train_step(const data::Batch<Y>& batch, std::uint64_t& step_counter, Work&& work) {
        const std::uint64_t step = ++step_counter;
        const int R = units();
        if constexpr (Net::synchronizes_replicas) {
            if (R > 1) {
                // Every replica must run the same micro-batches, so that each sum has all of them
                // (across processes every rank computes the same condition, before any sum).
                STRATA_CHECK(std::int64_t(batch.size()) / R >= strategy_->micro_batches(), ValueError,
                             "Pipeline: synchronized batch normalization needs every replica's share of the batch to "
                             "fill its ", strategy_->micro_batches(), " micro-batches; a batch of ", batch.size(), " over ", R,
                             " replicas gives ", std::int64_t(batch.size()) / R, " examples to the smallest share");
            }
        }
        // Unit r's share is split_batch(batch, R, r), recomputed where needed (a few integer
        // operations); its input and mode live in buffers the path keeps: a step allocates nothing.
        if constexpr (requires { work.begin_step(batch); }) work.begin_step(batch);
        for (int r = 0; r < R; ++r) {
            const auto share = split_batch(batch, R, r);
            if (!across() || r == my_replica()) step_x_[std::size_t(r)] = work.prepare(r, share);
            step_mode_[std::size_t(r)] = work.mode(share, step);
        }
        current_step_ = step;
        ++exchange_;
        for (int r = 0; r < R; ++r) reset_flow_clock(r, micro_count(split_batch(batch, R, r).size));
        const auto t0 = std::chrono::steady_clock::now();
        run_all([&](int r, int st) {
            const auto b = split_batch(batch, R, r);
            const double denominator = double(b.global_size);
            train_stage(r, std::size_t(st), b.size, step_x_[std::size_t(r)], step_mode_[std::size_t(r)],
                        [&](std::int64_t first, const TensorView<T, P>& out, const TensorView<T, P>& out_grad) {
                            work.loss(r, b, first, out, out_grad, denominator);
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
            const UnitWork u = work.result(r, split_batch(batch, R, r));
            t.loss_sum += u.loss_sum;
            t.correct += double(u.correct);
            t.counted += u.counted;
        }
        double totals[3] = {t.loss_sum, t.correct, t.counted};  // across processes: the last stages' figures, on every rank
        sum_over_workers(std::span<double>(totals, 3));
        t.loss_sum = totals[0];
        t.correct = totals[1];
        t.counted = totals[2];
        t.examples = std::int64_t(batch.size());
        return t;
    }

    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        while (const auto* batch = source.next())
            if (!on_step(train_step(*batch, step, work))) return;
    }

    /// Builds every stage's slots for micro-batches of a share of `n` examples (unit r's), and
    /// the step's virtual clock for as many micro-batches.
    void reserve(int r, std::int64_t n, bool training) {
        if (n <= 0) return;
        const std::int64_t m = micro_count(n), mb = (n + m - 1) / m;
        reset_flow_clock(r, m);
        run_all([&](int rr, int st) {
            if (rr == r) ensure_slots(r, std::size_t(st), slots_for(std::size_t(st), m), mb, training);
        });
    }

    /// Inference on unit r: x ([n, input...]) through the stages, micro-batched; returns the
    /// last stage's outputs ([n, output...], on its device), valid until the next call.
    TensorView<T, P> infer(int r, const TensorView<T, P>& x, const nn::Mode& mode);
    TensorView<T, P> inference_output_grad(int r) {
        return strategy_->runs(r, int(S - 1)) ? stage(r, S - 1).out_grad.view() : placeholder_grad_.view();
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
    std::vector<T> get_weights() const;
    // Every stage this process runs takes its part of `w` (across processes: one stage).
    void set_weights(const std::vector<T>& w);
    std::vector<std::pair<std::string, std::vector<T>>> slots() const;
    bool set_slot(const std::string& name, const std::vector<T>& v);
    std::string optimizer_name() const { return compiled_ ? local_state().name() : std::string(); }
    std::int64_t iterations() const { return compiled_ ? local_state().iterations() : 0; }
    void set_iterations(std::int64_t it) {
        for_each_local([&](Stage& d) { d.opt.set_iterations(it); });
    }
    double learning_rate() const { return compiled_ ? local_state().current_learning_rate() : 0.0; }
    void set_learning_rate(double lr) {
        for_each_local([&](Stage& d) { d.opt.set_learning_rate(lr); });
    }
    // No loss scale here: Model refuses precision::MixedFloat16 under Pipeline (each stage
    // applies its own part of the gradient; a skip would need every stage's verdict).
    optim::LossScaleState loss_scale_state() const { return compiled_ ? local_state().loss_scale_state() : optim::LossScaleState{}; }
    void set_loss_scale_state(const optim::LossScaleState& s) {
        for_each_local([&](Stage& d) { d.opt.set_loss_scale_state(s); });
    }

    /// One line per stage (its thread, layers and device) and per variable copy.
    void log_placement() {
        if (!place::get_log_device_placement()) return;
        log_pipeline_placement(*strategy_, units(), bounds_, Net::layer_names(), Net::parameters(), Net::offsets);
    }

private:
    using Stage = PipelineStage<Net, T, P>;
    struct Replica {
        std::vector<Stage> stages;
        StageFlow flow;
    };
    // The loss of the last stage's micro-batch: (its first example, its output, the gradient to fill).
    using LossFn = FunctionRef<void(std::int64_t, const TensorView<T, P>&, const TensorView<T, P>&)>;

    // Zeroes unit r's virtual clock for a step of m micro-batches; grows its vectors only when
    // m is larger than any before (Model::build reserves them).
    void reset_flow_clock(int r, std::int64_t m) {
        auto& f = replicas_[std::size_t(r)]->flow;
        f.clock.assign(S, 0.0);
        f.in_flight.assign(S, 0);
        f.forward_end.resize(S);
        f.backward_end.resize(S);
        for (std::size_t st = 0; st < S; ++st) {
            f.forward_end[st].assign(std::size_t(m), 0.0);
            f.backward_end[st].assign(std::size_t(m), 0.0);
        }
    }

    Stage& stage(int r, std::size_t s) { return replicas_[std::size_t(r)]->stages[s]; }
    const Stage& stage(int r, std::size_t s) const { return replicas_[std::size_t(r)]->stages[s]; }

    bool across() const { return strategy_->across_processes(); }
    // The replica and stage this process runs across processes (replica 0, stage 0 in one process).
    int my_replica() const { return across() ? strategy_->rank() / int(S) : 0; }
    int my_stage() const { return across() ? strategy_->rank() % int(S) : 0; }
    // f(stage) for every stage this process runs.
    void for_each_local(FunctionRef<void(Stage&)> f) {
        for (int r = 0; r < units(); ++r)
            for (std::size_t s = 0; s < S; ++s)
                if (strategy_->runs(r, int(s))) f(stage(r, s));
    }
    // The optimizer state of a stage this process runs (they all move in lockstep).
    const optim::OptimizerState<T, P>& local_state() const { return stage(my_replica(), std::size_t(my_stage())).opt; }

    // m micro-batches for a share of n examples (uneven sizes, see pipeline.hpp).
    std::int64_t micro_count(std::int64_t n) const { return std::max<std::int64_t>(1, std::min<std::int64_t>(strategy_->micro_batches(), n)); }
    std::size_t slots_for(std::size_t s, std::int64_t m) const {
        if (strategy_->one_f_one_b()) return std::size_t(std::min<std::int64_t>(m, std::int64_t(S - s)));
        return std::size_t(m);
    }

    void ensure_slots(int r, std::size_t s, std::size_t count, std::int64_t micro, bool training);
    void reset_flow(int r);
    // Waits (with the strategy's deadline) until `ready()` holds under replica r's flow lock.
    void wait_for(int r, int s, const char* what, int from, std::int64_t k, FunctionRef<bool(const StageFlow&)> ready);
    void done(int r, std::vector<std::int64_t> StageFlow::*which, std::size_t s, std::int64_t count);
    // Runs fn(replica, stage) on every stage's thread. The first stage to throw wakes the
    // others (its flow and the stage groups abort) and is named in the error.
    void run_all(FunctionRef<void(int, int)> fn);
    void abort_all(int r, int s, const std::string& why);
    // Forward of micro-batch k (of m, over a share of n examples) on stage s of replica r.
    // `loss` (training) or `keep` (inference) gets the last stage's output.
    void forward_micro(int r, std::size_t s, std::int64_t k, std::int64_t m, std::int64_t n, const TensorView<T, P>& x,
                       const nn::Mode& mode, bool training, LossFn loss);
    // Backward of micro-batch k on stage s of replica r: its gradient is added to the stage's
    // (micro-batch 0's written directly), its input's gradient copied into stage s-1's slot
    // (across processes: sent to stage s-1's rank).
    void backward_micro(int r, std::size_t s, std::int64_t k, std::int64_t m, std::int64_t n, const nn::Mode& mode);
    // Stage s of replica r's part of a training step over a share of n examples.
    void train_stage(int r, std::size_t s, std::int64_t n, const TensorView<T, P>& x, const nn::Mode& mode, LossFn loss);
    // Stage s of replica r's update, once its gradient is complete (and summed over its copies).
    void apply_stage(int r, std::size_t s);

    // ---- across processes: the messages between neighbouring stages -------------------------------
    // A message is a head (the micro-batch, its end on the virtual clock) and the values; its
    // step is the run's number (exchange_), the same on every rank, so that nothing stale matches.
    static constexpr std::uint32_t activations_kind = 1, gradient_kind = 2, abort_kind = 3;
    struct MessageHead {
        std::int64_t micro;
        double clock;
    };
    // Sends micro-batch k's `values` to stage `to` of replica r.
    void send_to(int r, int to, std::uint32_t kind, std::int64_t k, double clock, const TensorView<T, P>& values);
    // Receives micro-batch k's values from stage `from` of replica r into `dst`; returns the
    // virtual clock they carry. A neighbour that failed and said so ends the wait at once. The
    // wait is the timeout times the stages on that side (`from` and those beyond it): a stage
    // that stops far away is named by its own neighbour first, whose word then travels back,
    // so that no stage names a live neighbour that was only waiting too. With the stages split
    // over a tensor-parallel group (pipeline × tensor), each of those stages may also wait out
    // the group's deadline in a sum for a shard that left: that is added per stage too.
    double receive_from(int r, int s, int from, std::uint32_t kind, std::int64_t k, const TensorView<T, P>& dst);
    // The part of a message of `size` values this process sends and receives: its shard's under
    // pipeline × tensor with scatter_gather (PipelineRuntime::scatter_gather), else the whole.
    detail::ShardPart message_part(std::int64_t size) const;

    PipelineRuntime* strategy_;
    std::vector<std::size_t> bounds_;
    std::size_t S;  // stages
    std::vector<std::unique_ptr<Replica>> replicas_;
    // A training step's input and mode of each unit (train_step; sized by the constructor).
    std::vector<TensorView<T, P>> step_x_;
    std::vector<nn::Mode> step_mode_;
    // Sums a synchronized layer's statistics over the replicas of stage s (unit r's thread of it):
    // in one process through the stage's replica group, across processes over the R ranks that
    // run stage s (the sub-communicator the stage's gradients are summed over, with its deadline).
    // Every copy of a stage runs the same micro-batches in the same order under either schedule,
    // so the sums meet in the same order on every copy.
    struct StageSummer {
        PipelinePath* path;
        int r, s;
        void operator()(std::span<double> v) const {
            if (path->across()) path->strategy_->processes().sum_copies(v);
            else path->strategy_->stage_group(s).all_reduce(r, v);
        }
    };
    std::vector<StageSummer> stage_summers_;  // [r · S + s], made by the constructor
    // What a training micro-batch of a synchronized network on stage s of unit r adds to its mode.
    void synchronize_statistics(nn::Mode& mm, int r, std::size_t s) {
        if constexpr (Net::synchronizes_replicas) {
            if (units() > 1 && mm.training) {
                mm.replica_sum = stage_summers_[std::size_t(r) * S + s];
                mm.partial_statistics = true;
            }
        }
    }
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

template <class P, class Net, class T>
TensorView<T, P> PipelinePath<P, Net, T>::infer(int r, const TensorView<T, P>& x, const nn::Mode& mode) {
    const std::int64_t n = x.dim(0);
    const std::int64_t m = micro_count(n);
    reset_flow(r);
    current_step_ = 0;
    ++exchange_;
    run_all([&](int rr, int st) {
        if (rr != r) return;
        const auto s = std::size_t(st);
        auto& d = stage(r, s);
        ensure_slots(r, s, slots_for(s, m), (n + m - 1) / m, false);
        if (s + 1 == S) {
            d.out.resize(Net::output_shape::batched(n));
            d.out_grad.resize(Net::output_shape::batched(n));
        }
        for (std::int64_t k = 0; k < m; ++k)
            forward_micro(r, s, k, m, n, x, mode, false, [&](std::int64_t first, const TensorView<T, P>& out, const TensorView<T, P>&) {
                copy(out, d.out.view().slice(first, out.dim(0)));
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
    return stage(r, S - 1).out.view();
}

template <class P, class Net, class T>
std::vector<T> PipelinePath<P, Net, T>::get_weights() const {
    std::vector<T> w(static_cast<std::size_t>(num_params));
    for (std::size_t s = 0; s < S; ++s) {
        if (!strategy_->runs(0, int(s))) continue;
        const auto& d = stage(0, s);
        if (d.num_params > 0) copy(d.params.view(), TensorView<T, place::Host>(w.data() + d.param_first, Shape{d.num_params}));
    }
    if (across()) strategy_->processes().sum_all(std::span<T>(w));
    return w;
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::set_weights(const std::vector<T>& w) {
    for_each_local([&](Stage& d) {
        if (d.num_params > 0)
            copy(TensorView<T, place::Host>(const_cast<T*>(w.data()) + d.param_first, Shape{d.num_params}), d.params.view());
    });
}

template <class P, class Net, class T>
std::vector<std::pair<std::string, std::vector<T>>> PipelinePath<P, Net, T>::slots() const {
    std::vector<std::pair<std::string, std::vector<T>>> out;
    if (!compiled_) return out;
    for (auto& [name, t] : const_cast<optim::OptimizerState<T, P>&>(local_state()).slots())
        out.emplace_back(name, std::vector<T>(static_cast<std::size_t>(num_params)));
    for (std::size_t s = 0; s < S; ++s) {
        if (!strategy_->runs(0, int(s))) continue;
        auto& d = const_cast<Stage&>(stage(0, s));
        std::size_t i = 0;
        for (auto& [name, t] : d.opt.slots()) {
            if (d.num_params > 0)
                copy(t.view(), TensorView<T, place::Host>(out[i].second.data() + d.param_first, Shape{d.num_params}));
            ++i;
        }
    }
    if (across())
        for (auto& [name, v] : out) strategy_->processes().sum_all(std::span<T>(v));
    return out;
}

template <class P, class Net, class T>
bool PipelinePath<P, Net, T>::set_slot(const std::string& name, const std::vector<T>& v) {
    bool found = false;
    for_each_local([&](Stage& d) {
        for (auto& [n, t] : d.opt.slots())
            if (n == name) {
                found = true;
                if (d.num_params > 0)
                    copy(TensorView<T, place::Host>(const_cast<T*>(v.data()) + d.param_first, Shape{d.num_params}), t.view());
            }
    });
    return found;
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::ensure_slots(int r, std::size_t s, std::size_t count, std::int64_t micro, bool training) {
    auto& d = stage(r, s);
    while (d.slots.size() < count) {
        d.slots.push_back(std::make_unique<typename Stage::Network>(d.first_layer, d.last_layer));
        d.in.emplace_back();
        d.in_grad.emplace_back();
    }
    for (std::size_t k = 0; k < d.slots.size(); ++k) {
        d.slots[k]->reserve(micro, training);
        if (s > 0) {
            const Shape sh = Stage::Network::layer_input_shape(d.first_layer, micro);
            if (d.in[k].capacity() < std::size_t(sh.size())) {
                d.in[k].resize(sh);
                fill(d.in[k].view(), T(0));
            }
            if (training && d.in_grad[k].capacity() < std::size_t(sh.size())) {
                d.in_grad[k].resize(sh);
                fill(d.in_grad[k].view(), T(0));
            }
        }
    }
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::reset_flow(int r) {
    auto& f = replicas_[std::size_t(r)]->flow;
    std::lock_guard<std::mutex> lock(f.mu);
    std::fill(f.forwards.begin(), f.forwards.end(), 0);
    std::fill(f.backwards.begin(), f.backwards.end(), 0);
    f.aborted = false;
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::wait_for(int r, int s, const char* what, int from, std::int64_t k,
                                       FunctionRef<bool(const StageFlow&)> ready) {
    auto& f = replicas_[std::size_t(r)]->flow;
    std::unique_lock<std::mutex> lock(f.mu);
    const auto timeout = strategy_->options().timeout;
    if (!f.cv.wait_for(lock, timeout, [&] { return f.aborted || ready(f); }))
        throw_error<DistributedError>("Pipeline: stage ", s, " (", strategy_->device(r, s).name, ") waited more than ", timeout.count(),
                                      " ms for ", what, " of micro-batch ", k, " from stage ", from, " (",
                                      strategy_->device(r, from).name, ")");
    if (f.aborted) throw_error<DistributedError>("Pipeline: stage ", s, " stopped: another stage failed");
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::done(int r, std::vector<std::int64_t> StageFlow::*which, std::size_t s, std::int64_t count) {
    auto& f = replicas_[std::size_t(r)]->flow;
    {
        std::lock_guard<std::mutex> lock(f.mu);
        (f.*which)[s] = count;
    }
    f.cv.notify_all();
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::run_all(FunctionRef<void(int, int)> fn) {
    if (!failed_across_.empty())
        throw_error<DistributedError>("Pipeline: the pipeline across processes failed earlier (", failed_across_, "); restart the job");
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
                    first = pipeline_stage_failure(*strategy_, units(), r, s, bounds_, Net::layer_names(), e);
                }
            }
            if (cause) abort_all(r, s, first);
            throw;
        }
    };
    try {
        strategy_->run_stages(wrapped, [](int, int) {});
    } catch (...) {
        if (!across()) {
            for (std::size_t s = 0; s < S; ++s) strategy_->stage_group(int(s)).reset();
            for (int q = 0; q < units(); ++q) strategy_->pipeline_group(q).reset();
        }
        if (failed) throw_error<DistributedError>(first);
        throw;
    }
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::abort_all(int r, int s, const std::string& why) {
    if (across()) {
        // The neighbours may be waiting for this stage: they stop at once, and tell theirs.
        failed_across_ = why;
        for (int to : {s - 1, s + 1})
            if (to >= 0 && to < int(S)) {
                const auto text = std::as_bytes(std::span<const char>(why.data(), why.size()));
                try {
                    strategy_->processes().send(strategy_->rank_of(r, to), abort_kind, exchange_, text);
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
    // (Every replica's group has the S stages as members: stage s names the thrower in each.)
    for (int q = 0; q < units(); ++q) strategy_->pipeline_group(q).abort(int(s), "stage " + std::to_string(s) + " threw");
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::forward_micro(int r, std::size_t s, std::int64_t k, std::int64_t m, std::int64_t n,
                                            const TensorView<T, P>& x, const nn::Mode& mode, bool training, LossFn loss) {
    auto& d = stage(r, s);
    const bool last = s + 1 == S;
    const auto sl = replica_slice(n, int(m), int(k));
    const std::size_t K = d.slots.size(), slot = std::size_t(k) % K;
    // In inference nothing frees a slot but the next stage's copy of what it held (a message
    // across processes is a copy already).
    if (!last && !training && !across() && std::size_t(k) >= K)
        wait_for(r, int(s), "the copy of its output", int(s + 1), k - std::int64_t(K),
                 [&](const StageFlow& f) { return f.forwards[s + 1] > k - std::int64_t(K); });
    auto& f = replicas_[std::size_t(r)]->flow;
    TensorView<T, P> in;
    double ready = 0;  // on the virtual clock: when the input was ready
    std::chrono::steady_clock::time_point t0;
    if (s == 0) {
        t0 = std::chrono::steady_clock::now();
        in = x.slice(sl.first, sl.count);
    } else if (across()) {
        d.in[slot].resize(Stage::Network::layer_input_shape(d.first_layer, sl.count));
        ready = receive_from(r, int(s), int(s - 1), activations_kind, k, d.in[slot].view());
        t0 = std::chrono::steady_clock::now();
        in = d.in[slot].view();
    } else {
        wait_for(r, int(s), "the activations", int(s - 1), k, [&](const StageFlow& fl) { return fl.forwards[s - 1] > k; });
        t0 = std::chrono::steady_clock::now();
        auto& prev = stage(r, s - 1);
        const TensorView<T, P> src = prev.slots[std::size_t(k) % prev.slots.size()]->output();
        d.in[slot].resize(src.shape());
        copy(src, d.in[slot].view());
        in = d.in[slot].view();
        if (training) ready = f.forward_end[s - 1][std::size_t(k)];
    }
    nn::Mode mm = mode;
    mm.first_example = mode.first_example + sl.first;
    if (!last) mm.skip_activation = false;
    synchronize_statistics(mm, r, s);  // (training only)
    auto& net = *d.slots[slot];
    // A stage between a masking Embedding (mask_zero) and the layer that consumes its mask makes
    // the mask from the replica's input ids, as the Embedding's stage does (every process running
    // a stage of this replica staged that input).
    if (s > 0 && net.needs_token_ids()) net.set_token_ids(x.slice(sl.first, sl.count));
    const TensorView<T, P> out = net.forward(d.params.data(), in, mm);
    if (last) loss(sl.first, out, net.output_grad());
    P::synchronize();  // the output is complete before the next stage copies it
    double end = 0;
    if (training) {
        end = f.clock[s] = f.forward_end[s][std::size_t(k)] = std::max(f.clock[s], ready) + 1.0;
        f.in_flight[s] += 1;
        if (r == my_replica()) {
            auto& st = stats_.stages[s];
            st.busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            st.virtual_busy += 1.0;
            st.max_in_flight = std::max(st.max_in_flight, f.in_flight[s]);
        }
    }
    if (!last && across()) send_to(r, int(s + 1), activations_kind, k, end, out);
    done(r, &StageFlow::forwards, s, k + 1);
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::backward_micro(int r, std::size_t s, std::int64_t k, std::int64_t m, std::int64_t n,
                                             const nn::Mode& mode) {
    auto& d = stage(r, s);
    const bool last = s + 1 == S;
    const auto sl = replica_slice(n, int(m), int(k));
    const std::size_t slot = std::size_t(k) % d.slots.size();
    auto& net = *d.slots[slot];
    auto& f = replicas_[std::size_t(r)]->flow;
    double ready = 0;  // on the virtual clock: when the gradient of the output was ready
    if (!last) {
        if (across()) {
            ready = receive_from(r, int(s), int(s + 1), gradient_kind, k, net.output_grad());
        } else {
            wait_for(r, int(s), "the gradient of its output", int(s + 1), k, [&](const StageFlow& fl) { return fl.backwards[s + 1] > k; });
            ready = f.backward_end[s + 1][std::size_t(k)];
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    nn::Mode mm = mode;
    mm.first_example = mode.first_example + sl.first;
    if (!last) mm.skip_activation = false;
    synchronize_statistics(mm, r, s);  // (training only)
    T* g = k == 0 ? d.grads.data() : d.scratch.data();
    if (s > 0) {
        d.in_grad[slot].resize(d.in[slot].shape());
        net.backward(d.params.data(), g, mm, nullptr, d.in_grad[slot].view());  // no gradient hook; the input gradient
        if (!across()) {
            auto& prev = stage(r, s - 1);
            copy(d.in_grad[slot].view(), prev.slots[std::size_t(k) % prev.slots.size()]->output_grad());
        }
    } else {
        net.backward(d.params.data(), g, mm);
    }
    if (k > 0 && d.num_params > 0) axpy(T(1), d.scratch.view(), d.grads.view());
    P::synchronize();
    const double end = f.clock[s] = f.backward_end[s][std::size_t(k)] = std::max(f.clock[s], ready) + 2.0;
    f.in_flight[s] -= 1;
    if (r == my_replica()) {
        stats_.stages[s].busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stats_.stages[s].virtual_busy += 2.0;
    }
    if (s > 0 && across()) send_to(r, int(s - 1), gradient_kind, k, end, d.in_grad[slot].view());
    done(r, &StageFlow::backwards, s, k + 1);
}

template <class P, class Net, class T>
detail::ShardPart PipelinePath<P, Net, T>::message_part(std::int64_t size) const {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        if (strategy_->scatter_gather()) {
            const ShardGroup* g = job_shard_group();
            return detail::shard_part(size, g->shards(), g->shard());
        }
    }
    return {0, size};
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::send_to(int r, int to, std::uint32_t kind, std::int64_t k, double clock, const TensorView<T, P>& values) {
    // Pipeline × tensor with scatter_gather: only this shard's part (the neighbour's same shard
    // gathers the rest from its group); otherwise the whole.
    const auto [first, count] = message_part(values.size());
    std::vector<std::byte>& bytes = send_buffer_;
    bytes.resize(sizeof(MessageHead) + std::size_t(count) * sizeof(T));
    const MessageHead head{k, clock};
    std::memcpy(bytes.data(), &head, sizeof head);
    copy(TensorView<T, P>(values.data() + first, Shape{count}), TensorView<T, place::Host>(reinterpret_cast<T*>(bytes.data() + sizeof head), Shape{count}));
    strategy_->processes().send(strategy_->rank_of(r, to), kind, exchange_, bytes);
    stats_.messages_sent += 1;
    stats_.message_bytes_sent += count * std::int64_t(sizeof(T));
}

template <class P, class Net, class T>
double PipelinePath<P, Net, T>::receive_from(int r, int s, int from, std::uint32_t kind, std::int64_t k, const TensorView<T, P>& dst) {
    const int beyond = from < s ? from + 1 : int(S) - from;
    const ShardGroup* shards = job_shard_group();
    const auto timeout = (strategy_->options().timeout + (shards ? shards->deadline() : std::chrono::milliseconds(0))) * beyond;
    const std::string what = "Pipeline: stage " + std::to_string(s) + (units() > 1 ? " of replica " + std::to_string(r) : std::string()) +
                             " (rank " + std::to_string(strategy_->job_rank()) + ") waited for " +
                             (kind == activations_kind ? "the activations" : "the gradient of its output") + " of micro-batch " +
                             std::to_string(k) + (current_step_ > 0 ? " of step " + std::to_string(current_step_) : std::string(" (inference)"));
    auto msg = strategy_->processes().receive(strategy_->rank_of(r, from), what, timeout);
    if (msg.kind == abort_kind)
        throw_error<DistributedError>("Pipeline: stage ", s, " (rank ", strategy_->job_rank(), ") stopped because its neighbour ",
                                      strategy_->processes().name(strategy_->rank_of(r, from)), " failed: ",
                                      std::string_view(reinterpret_cast<const char*>(msg.payload.data()), msg.payload.size()));
    MessageHead head{-1, 0};
    if (msg.payload.size() >= sizeof head) std::memcpy(&head, msg.payload.data(), sizeof head);
    const auto [first, count] = message_part(dst.size());  // (scatter_gather: this shard's part)
    STRATA_CHECK(msg.kind == kind && msg.step == exchange_ && head.micro == k &&
                     msg.payload.size() == sizeof head + std::size_t(count) * sizeof(T),
                 DistributedError, what, ": ", strategy_->processes().name(strategy_->rank_of(r, from)), " sent another message (kind ",
                 msg.kind, ", run ", msg.step, ", micro-batch ", head.micro, ", ", msg.payload.size(), " bytes; expected kind ", kind,
                 ", run ", exchange_, ", micro-batch ", k, ", ", sizeof head + std::size_t(count) * sizeof(T),
                 " bytes): is every process the same program?");
    copy(TensorView<T, place::Host>(reinterpret_cast<T*>(msg.payload.data() + sizeof head), Shape{count}),
         TensorView<T, P>(dst.data() + first, Shape{count}));
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        if (strategy_->scatter_gather())  // the other shards' parts, from the stage's own group (every shard
                                          // gathers, also one whose part is the whole or empty)
            job_shard_group()->gather(std::span<T>(dst.data(), std::size_t(dst.size())),
                                      kind == activations_kind ? "Pipeline: the stage's shards gather the activations (scatter_gather)"
                                                               : "Pipeline: the stage's shards gather the gradient (scatter_gather)");
    }
    return head.clock;
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::train_stage(int r, std::size_t s, std::int64_t n, const TensorView<T, P>& x, const nn::Mode& mode,
                                          LossFn loss) {
    auto& d = stage(r, s);
    if (n == 0) {
        if (d.num_params > 0) fill(d.grads.view(), T(0));
    } else {
        const std::int64_t m = micro_count(n);
        ensure_slots(r, s, slots_for(s, m), (n + m - 1) / m, true);
        auto F = [&](std::int64_t k) { forward_micro(r, s, k, m, n, x, mode, true, loss); };
        auto B = [&](std::int64_t k) { backward_micro(r, s, k, m, n, mode); };
        if (strategy_->one_f_one_b()) {
            const std::int64_t warm = std::min<std::int64_t>(std::int64_t(S - 1 - s), m);
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
            if (across()) strategy_->processes().sum_copies(grads);  // over the R ranks of stage s
            else strategy_->stage_group(int(s)).all_reduce(r, grads, ReduceOp::Sum, strategy_->options().all_reduce);
        } else
            throw_error<ValueError>("Pipeline: replicas > 1 (the hybrid) needs host memory; on GPUs use replicas = 1");
    }
    apply_stage(r, s);
}

template <class P, class Net, class T>
void PipelinePath<P, Net, T>::apply_stage(int r, std::size_t s) {
    auto& d = stage(r, s);
    if (!d.opt.clips_gradients()) {
        d.opt.apply(d.params.data(), d.grads.data());
        return;
    }
    // global_clipnorm's norm and the loss scale's finiteness are the whole model's gradient's:
    // each stage's sum of squares is summed over the stages of its replica (every copy of a
    // stage holds the same gradient once the hybrid's all-reduce is done, so every stage of
    // every replica takes the same decision: one scale, or one skip, for the whole step).
    double squares = d.num_params > 0 ? d.opt.squared_gradient_norm(d.grads.data()) : 0.0;
    if (S > 1) {
        STRATA_PROFILE_MODEL("all-reduce");
        const std::span<double> v(&squares, 1);
        if (across()) strategy_->processes().sum_stages(v);
        else strategy_->pipeline_group(r).all_reduce(int(s), v);
    }
    d.opt.prepare_step_from_squared_norm(squares);
    d.opt.apply_range(d.params.data(), d.grads.data(), 0, d.num_params);
    d.opt.advance();
}

}  // namespace detail

/// Pipeline<P, Schedule, Split>'s path: detail::PipelinePath with the split of the strategy.
template <class P, class Schedule, class Split, class Net, class T>
class GradientPath<Pipeline<P, Schedule, Split>, Net, T> : public detail::PipelinePath<P, Net, T> {
public:
    using Strategy = Pipeline<P, Schedule, Split>;
    static_assert(Split::stages <= 0 || std::size_t(Split::stages) <= Net::num_layers,
                  "strata::distribute::Pipeline: more stages than layers: every stage needs at least one layer of the Sequential");

    template <class Init>
    GradientPath(Strategy& s, Init&& init) : detail::PipelinePath<P, Net, T>(s, s.template split_bounds<Net>(), init) {}

    /// Net's summary, then the split: each stage's layers, parameters and FLOPs per example.
    /// (A split chosen at run time is not known here: Pipeline::split_summary<Net>() prints it.)
    template <class N>
    static std::string model_summary() {
        if constexpr (Split::stages == 0) {
            return N::summary() + "Pipeline: " + Split::name + " split by " + Split::cost_name +
                   ", its stage count chosen at run time (PipelineOptions::stages; Pipeline::split_summary<Net>() prints it), " +
                   Schedule::name + " schedule\n";
        } else {
            constexpr auto b = Split::template bounds<N>();
            return N::summary() + detail::pipeline_split_table(b, N::layer_names(), split::layer_costs<N, split::ByParams>(),
                                                               split::layer_costs<N, split::ByFlops>(), Split::name, Schedule::name);
        }
    }
};

}  // namespace strata::distribute
