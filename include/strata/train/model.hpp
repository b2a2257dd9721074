#pragma once
/// \file strata/train/model.hpp
/// `Model<Net, Strategy, T>`: a Sequential network trained the Keras way (`compile`, `fit`,
/// `evaluate`, `predict`) under a distribution strategy chosen at compile time.
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<10, Softmax>>;
/// strata::Model<Net> model(/*seed=*/42);
/// model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
/// auto history = model.fit(train.shuffle(10000, 1).batch(128), {.epochs = 3, .validation_data = test.batch(1000)});
/// \endcode
///
/// The unit of work, for every compute unit r of the strategy (a replica, or a parameter
/// server's worker; on r's thread): forward on r's mini-batch → loss and its gradient (each
/// example's weighed by its sample weight and class weight, if any; scaled by 1 / the batch the
/// update averages over) → backward. What happens to the gradients — nothing, an all-reduce, a
/// reduction onto the central copy, a push to the servers — and when the optimizer applies them
/// is the strategy's gradient path's business (distribute/gradient_path.hpp), never Model's.
/// The unit of work is one inlined call chain over the layers; once the buffers have grown to
/// the batch size it allocates nothing. What does not depend on the network or the strategy
/// lives outside this template: the fit loop (train/fit_loop.hpp), the checkpoint code
/// (train/checkpoint.hpp, through train::ModelState), and the model's settings, counters, state,
/// save/load and logs (train::ModelBase<T>, train/model_base.hpp, which Model derives from).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/data/dataset.hpp"
#include "strata/distribute/distributed_dataset.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/metrics/metric.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/sequential.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/compile_settings.hpp"
#include "strata/train/fit_loop.hpp"
#include "strata/train/model_base.hpp"
#include "strata/train/place_step.hpp"
#include "strata/train/progress.hpp"

namespace strata {

/// Options of Model::fit (Keras's keyword arguments).
template <class Y = std::int32_t>
struct FitOptions {
    int epochs = 1;
    /// Steps per epoch; -1 = one full pass over the dataset.
    std::int64_t steps_per_epoch = -1;
    /// Evaluated at the end of every epoch (val_loss, val_accuracy).
    std::optional<data::Dataset<Y>> validation_data{};
    train::CallbackList callbacks{};
    /// 0 silent, 1 progress bar, 2 one line per epoch.
    int verbose = 1;
    int initial_epoch = 0;
    /// Used by the array overload of fit only.
    std::int64_t batch_size = 32;
    bool shuffle = true;
    /// Array overload of fit only (Keras's validation_split): the last fraction of the examples,
    /// taken before shuffling, is held out and evaluated at the end of every epoch; the first
    /// floor(n * (1 - validation_split)) train. In [0, 1); 0 holds nothing out. validation_data,
    /// when given, takes precedence and nothing is held out, as in Keras. With a Dataset it is a
    /// ValueError: pass validation_data instead.
    double validation_split = 0.0;
    /// Keras's class_weight: class id -> weight. Each training example's loss (and gradient) is
    /// multiplied by the weight of its class (class id = the label, rounded, for one label per
    /// example; the argmax of the target row otherwise); classes not listed weigh 1. The loss
    /// fit reports is then the weighted sum over the examples divided by their number, as
    /// Keras computes it. Validation figures and metrics are not weighted (Keras's `metrics`).
    /// With sample weights too, an example weighs its sample weight × its class weight (Keras).
    std::map<std::int64_t, double> class_weight{};
    /// Array overload of fit only (Keras's sample_weight): one weight per example of x, finite
    /// and >= 0; empty = unweighted. Each example's loss and gradient is multiplied by its
    /// weight (and by its class weight, if any); the reported loss is the weighted sum divided
    /// by the number of examples (Keras's sum_over_batch_size), so a zero weight removes an
    /// example from the numerator only. Accuracy and the other metrics are not weighted.
    /// The weights are shuffled with their examples, and validation_split holds out the last
    /// fraction of them with theirs, so val_loss is weighted too (as Keras slices every array).
    /// With a Dataset it is a ValueError (as in Keras): build the dataset with its weights,
    /// `data::from_arrays(x, shape, y, sample_weight)`.
    std::vector<float> sample_weight{};
};

namespace detail {
template <class Seq>
struct LastActivation;
template <class In, class... Specs>
struct LastActivation<nn::Sequential<In, Specs...>> {
    using last = std::tuple_element_t<sizeof...(Specs) - 1, std::tuple<Specs...>>;
    static constexpr bool softmax = [] {
        if constexpr (requires { typename last::activation; }) return std::is_same_v<typename last::activation, nn::Softmax>;
        else return false;
    }();
};
/// The token weights of a model whose output carries Embedding's token mask, from its input ids
/// ([n, S]), one output token per index on any place (Model::stage_token_weights): `factor` where
/// the token counts (its id is not 0, as the Embedding's mask has it; a prepended class token
/// always), 0 where it is padding; and into `ones` 1 where it counts.
template <class T>
struct IdTokenWeights {
    const T* ids;
    T* out;
    T* ones;
    T factor;
    std::int64_t S;        // ids per example
    bool prepend = false;  // the output has a class token before them
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t K = prepend ? S + 1 : S, e = i / K, t = i % K;
        const bool counts = (prepend && t == 0) || ids[e * S + t - (prepend ? 1 : 0)] != T(0);
        out[i] = counts ? factor : T(0);
        ones[i] = counts ? T(1) : T(0);
    }
};
}  // namespace detail

/// A model: a Sequential network `Net`, trained under `Strategy` with element type `T`.
///
/// Model does not know which strategy it runs under: it holds the strategy's
/// `distribute::GradientPath` (variables, gradient aggregation, the step's schedule) and gives
/// it one unit of work — forward, loss, backward of one mini-batch — to run where and when the
/// path says.
template <class Net, class Strategy, class Precision>
class Model : public train::ModelBase<precision::variable_t<Precision>> {
    static_assert(distribute::Strategy<Strategy>,
                  "strata::Model<Net, Strategy, T>: Strategy must be a strategy (strata::distribute::Default, OneDevice<P>, "
                  "Mirrored<P>, CentralStorage<P>, ParameterServer<P, Sync>, MultiWorkerMirrored<P>)");
    static_assert(std::is_floating_point_v<Precision> || precision::is_policy_v<Precision>,
                  "strata::Model<Net, Strategy, T>: T must be float, double or a precision policy (strata::precision::"
                  "Float32, TF32, MixedBFloat16, MixedFloat16, Any)");
    /// The variables' element type (float under every precision policy).
    using T = precision::variable_t<Precision>;
    using P = typename Strategy::place_type;  // the class's own shorthand; users name place_type

public:
    using precision_type = Precision;
    using value_type = T;
    using place_type = typename Strategy::place_type;
    using path_type = distribute::GradientPath<Strategy, Net, T>;
    /// What each compute unit runs: the whole network (a Pipeline's unit runs its stages).
    // Before anything else reads the path: each member it lacks is one error naming it.
    static_assert(distribute::detail::GradientPathCheck<path_type>::value,
                  "strata::Model: the strategy's GradientPath lacks a member the Model needs (named above)");
    static_assert(!Net::synchronizes_replicas || path_type::syncs_batch_statistics,
                  "strata::Model: synchronized batch normalization needs replicas that step together on shares of one "
                  "global batch, which this strategy's do not (ParameterServer workers step on their own): use "
                  "BatchNormalization<> without synchronized");
    using network_type = typename distribute::detail::UnitNetwork<path_type, nn::Network<Net, T, P>>::type;
    static constexpr std::int64_t num_params = Net::num_params;
    static constexpr std::int64_t input_size = Net::input_shape::size;
    static constexpr std::int64_t output_size = Net::output_shape::size;
    /// Sparse targets of one class id per token: the output's positions before its last (class)
    /// axis ([K, classes] gives K; a rank-1 output gives 1).
    static constexpr std::int64_t sequence_tokens =
        Net::output_shape::rank >= 2 ? output_size / Net::output_shape::dims[Net::output_shape::rank >= 2 ? Net::output_shape::rank - 1 : 0] : 1;
    static constexpr bool last_is_softmax = detail::LastActivation<Net>::softmax;
    /// Whether the strategy steps all replicas in lockstep on one global batch (everything but
    /// ParameterServer); only then are the pieces of a step (compute_gradients, ...) offered.
    static constexpr bool lockstep = path_type::lockstep;
    /// The output carries the token mask of an Embedding with mask_zero (one row per token, no
    /// pooling): the loss and the accuracy are the means over the tokens that count in the global
    /// batch (Keras' masked reduction), with the mask passed to them as token weights.
    static constexpr bool masked_output = nn::Network<Net, T, P>::masks_output;

    /// A model with its own Default strategy (one replica, all host cores).
    explicit Model(std::uint64_t seed = 0)
        : train::ModelBase<T>(seed, Net::num_params, &Net::parameters), owned_(std::make_unique<Strategy>()), strategy_(owned_.get()),
          path_(*strategy_, initializer()) {
        build();
    }
    /// A model distributed by `strategy` (which must outlive it).
    explicit Model(Strategy& strategy, std::uint64_t seed = 0)
        : train::ModelBase<T>(seed, Net::num_params, &Net::parameters), strategy_(&strategy), path_(strategy, initializer()) {
        build();
    }

    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    /// Sets the loss, the optimizer and the metrics (strata/metrics/metric.hpp: "accuracy",
    /// "sparse_top_k_categorical_accuracy" or metrics::sparse_top_k_categorical_accuracy(k),
    /// "precision", "recall"). Resets the optimizer state.
    /// Under precision::MixedFloat16 the optimizer gets a dynamic loss scale (optim::LossScale,
    /// with the settings `optimizer` gives it; Keras wraps it in a LossScaleOptimizer).
    void compile(loss::Loss loss, optim::Optimizer optimizer = optim::RMSprop{}, std::vector<metrics::Metric> metrics = {"accuracy"}) {
        if (precision::scales_loss(compute_)) {
            auto names = std::make_shared<std::vector<std::pair<std::int64_t, std::string>>>();
            for (const auto& p : Net::parameters()) names->emplace_back(p.offset, p.name);
            std::visit(
                [&](auto& o) {
                    o.loss_scale.enabled = true;
                    o.loss_scale.names = names;
                },
                optimizer);
        }
        if constexpr (masked_output) {
            STRATA_CHECK(!std::holds_alternative<loss::Custom>(loss), ValueError, "Model::compile: the model's per-token "
                         "output carries Embedding's token mask (mask_zero), which the built-in losses leave out of their mean "
                         "token by token; loss::Custom '", loss::name(loss), "' sees whole examples and takes no mask");
        }
        this->compile_settings_for(std::move(loss), optimizer, metrics, output_size, last_is_softmax, output_size / sequence_tokens);
        // What compile decided, which every process of a job must share (the path compares it
        // across processes, a ValueError on every rank naming who has what): under
        // precision::Any each rank's set_precision may have chosen another policy.
        // The loss and the metrics too: a rank with another loss all-reduces other gradients, one
        // with other metrics sums other counts into the job's.
        path_.compile(optimizer, distribute::collective::Settings{{"loss", loss::describe(this->loss_)},
                                                                  {"metrics", train::describe_metrics(this->settings_)},
                                                                  {"optimizer", optim::describe(optimizer)},
                                                                  {"precision", precision::name_of(compute_)}});
        // A captured step holds the loss, the metrics and the softmax fusion it was captured with.
        for (auto& u : units_) u->capture.reset();
        compiled_ = true;
    }

    /// The precision the layers compute in (Precision's; under precision::Any, set_precision's).
    precision::Compute dtype_policy() const { return compute_; }
    /// precision::Any only: the policy, chosen at run time, before compile.
    void set_precision(precision::Compute c) {
        static_assert(std::is_same_v<Precision, precision::Any>,
                      "strata::Model::set_precision: the precision is fixed at compile time (Model's third argument); "
                      "only precision::Any chooses it at run time");
        STRATA_CHECK(!compiled_, ValueError, "set_precision: call it before compile (the optimizer's loss scale depends on it)");
        STRATA_CHECK((!std::is_same_v<T, double> || c == precision::Compute::Float32), ValueError,
                     "set_precision: a double model computes in double");
        compute_ = c;
    }
    /// Optimizer updates applied (a step skipped by the loss scale is not one).
    std::int64_t optimizer_iterations() const { return path_.iterations(); }
    /// The dynamic loss scale's state (scale 1 and zeros unless the precision is mixed_float16).
    optim::LossScaleState loss_scale() const { return path_.loss_scale_state(); }

    /// Number of units that compute every step: the replicas in sync, or the parameter
    /// server's workers.
    int replicas() const { return path_.units(); }
    /// Gradient buckets a step all-reduces (StrategyOptions::bucket_bytes; 1 = after backward).
    std::size_t gradient_buckets() const { return path_.gradient_buckets(); }
    Strategy& strategy() { return *strategy_; }
    /// The strategy's gradient path (its statistics, for ParameterServer).
    path_type& gradient_path() { return path_; }
    const path_type& gradient_path() const { return path_; }
    /// The Keras-like summary table.
    static std::string summary() { return path_type::template model_summary<Net>(); }

    // ---- training -------------------------------------------------------------------------

    /// One training step on `batch`: a global batch split over the replicas (under
    /// ParameterServer, one update whose workers take the batch's slices as their mini-batches).
    /// Training steps replayed so far from a captured CUDA graph (OneDevice<Cuda> with graphs on,
    /// place::set_cuda_graphs; 0 elsewhere): what a benchmark checks before it names a figure.
    std::int64_t cuda_graph_replays() const {
        std::int64_t n = 0;
        for (const auto& u : units_) n += u->capture.replays();
        return n;
    }

    /// Why the last training step that was not a replayed CUDA graph ran its kernels one by one
    /// (place/cuda_graph.hpp says when a step can be a graph); "" off OneDevice<Cuda>, or when no
    /// step has run eagerly yet.
    std::string cuda_graph_note() const {
        for (const auto& u : units_)
            if (!u->capture.why_eager().empty()) return u->capture.why_eager();
        return {};
    }

    template <class Y>
    StepResult train_step(const data::Batch<Y>& batch) {
        require_compiled("train_step");
        check_batch(batch, "train_step");
        return result_of(path_.train_step(batch, step_, make_unit_work<Y>()));
    }

    // ---- the pieces of a step, for custom training loops (lockstep strategies) ---------------

    /// Starts a step: call once on the caller's thread before the replicas' compute_gradients.
    void begin_step()
        requires lockstep
    {
        require_compiled("begin_step");
        ++step_;
    }

    /// In a replica (inside strategy.run): forward on the replica's share of the global batch,
    /// the loss scaled by 1 / the global batch size (each example's multiplied by its weight
    /// in `b.w` when the share has weights), backward into the replica's gradients.
    /// Returns the sum of the per-example (weighted) losses of this replica's examples.
    template <class Y>
    double compute_gradients(distribute::ReplicaContext& ctx, const distribute::ReplicaBatch<Y>& b)
        requires lockstep
    {
        static_assert(!path_type::pipelined,
                      "strata::Model::compute_gradients: a Pipeline's step is one schedule over all its stages; "
                      "train it with train_step or fit, not the pieces of a step");
        const int r = ctx.replica_id_in_sync_group();
        const auto w = make_unit_work<Y>()(r, b, path_.params(r), path_.grads(r), double(b.global_size), step_,
                                      [&](std::int64_t first, std::int64_t) { path_.gradient_ready(r, first); });
        return w.loss_sum;
    }

    /// In a replica (inside strategy.run), after compute_gradients: combines the replicas'
    /// gradients as the strategy does (nothing, all-reduce, or reduction onto the central
    /// copy) and applies the optimizer.
    void apply_gradients(distribute::ReplicaContext& ctx)
        requires lockstep
    {
        path_.apply(ctx.replica_id_in_sync_group());
    }

    /// Ends a step on the caller's thread; returns the global batch's mean loss and accuracy.
    StepResult end_step(std::int64_t global_size)
        requires lockstep
    {
        path_.end_step();
        distribute::StepTotals t;
        for (const auto& u : units_) {
            t.loss_sum += u->loss_sum;
            t.correct += double(u->correct);
            t.counted += u->counted;
        }
        t.examples = global_size;
        return result_of(t);
    }

    /// Trains on `train` for `options.epochs` epochs (Keras's fit) and returns the History.
    /// Under ParameterServer each batch of `train` is one worker's mini-batch and
    /// steps_per_epoch counts updates. When `train` carries sample weights
    /// (data::Dataset::has_sample_weight), each example's loss and gradient is multiplied by
    /// its weight (see FitOptions::sample_weight); so is val_loss when validation_data does.
    template <class Y>
    train::History fit(const data::Dataset<Y>& train, const FitOptions<Y>& options = {}) {
        this->check_fit_options(options.epochs, options.validation_split, options.sample_weight.size(), options.class_weight,
                                output_size, train.batch_size(), options.steps_per_epoch,
                                train.cardinality() == data::infinite_cardinality);
        // Read by every unit's loss while this fit runs; cleared however fit ends.
        struct ClassWeights {
            std::map<std::int64_t, double>& held;
            ~ClassWeights() { held.clear(); }
        } class_weights{class_weight_};
        class_weight_ = options.class_weight;
        build(std::int64_t(train.batch_size()), true);
        FitHooks<Y> hooks(*this, train, options);
        const train::FitSettings settings{options.epochs, options.steps_per_epoch, options.verbose, options.initial_epoch,
                                          settings_.accuracy, is_chief()};
        return train::run_fit(*this, hooks, options.callbacks, settings, &this->last_epoch_seconds_, &this->last_epoch_examples_);
    }

    /// fit on in-memory arrays: `x` holds n examples (n × input size floats), `y` their labels,
    /// options.sample_weight (when not empty) their weights; shuffled each epoch (from the
    /// model's seed) and batched by options.batch_size. options.validation_split holds out the
    /// last fraction of the examples (with their weights), before shuffling.
    template <class Y>
    train::History fit(std::vector<float> x, std::vector<Y> y, const FitOptions<Y>& options) {
        auto shape = std::vector<std::size_t>(Net::input_shape::dims.begin(), Net::input_shape::dims.end());
        const std::size_t per = y.size() && x.size() ? y.size() / (x.size() / std::size_t(input_size)) : 1;
        FitOptions<Y> opts = options;
        opts.validation_split = 0.0;
        std::vector<float> sw = std::move(opts.sample_weight);  // the dataset carries them from here on
        opts.sample_weight.clear();
        const double split = options.validation_split;
        STRATA_CHECK(split >= 0.0 && split < 1.0, ValueError, "fit: validation_split must be in [0, 1), got ", split);
        if (!sw.empty()) {
            // Checked here, before the split, so that the index named is the caller's.
            const std::size_t n = x.size() / std::size_t(input_size);
            STRATA_CHECK(sw.size() == n, ShapeError, "fit: x holds ", n, " examples, so options.sample_weight must hold ", n,
                         " weights (one per example) or none, but it holds ", sw.size());
            for (std::size_t i = 0; i < sw.size(); ++i)
                if (!(std::isfinite(sw[i]) && sw[i] >= 0.0f))
                    throw_error<ValueError>("fit: options.sample_weight[", i, "] is ", sw[i],
                                            "; sample weights must be finite and >= 0");
        }
        if (split > 0.0 && !opts.validation_data) {
            // Keras (trainers/data_adapters/array_slicing.py, train_validation_split): the first
            // floor(n * (1 - split)) examples train, the rest validate; both parts non-empty.
            // Keras's fit splits only when validation_data is not given.
            const std::size_t n = x.size() / std::size_t(input_size);
            const auto split_at = std::size_t(std::floor(double(n) * (1.0 - split)));
            STRATA_CHECK(split_at > 0 && split_at < n, ValueError, "fit: ", n, " examples cannot be split into a training "
                         "and a validation set by validation_split = ", split, " (", split_at, " would train, ",
                         n - split_at, " validate); give more data or another fraction");
            STRATA_CHECK(y.size() == n * (per ? per : 1), ShapeError, "fit: ", n, " examples but ", y.size(), " labels");
            const auto xs = std::ptrdiff_t(split_at * std::size_t(input_size));
            const auto ys = std::ptrdiff_t(split_at * (per ? per : 1));
            std::vector<float> vx(x.begin() + xs, x.end());
            std::vector<Y> vy(y.begin() + ys, y.end());
            // Keras slices sample_weight with x and y: the held-out examples keep their weights.
            std::vector<float> vw(sw.empty() ? sw.end() : sw.begin() + std::ptrdiff_t(split_at), sw.end());
            opts.validation_data = data::Dataset<Y>::from_arrays(std::move(vx), shape, std::move(vy), per ? per : 1,
                                                                 std::move(vw))
                                       .batch(std::size_t(options.batch_size));
            x.resize(split_at * std::size_t(input_size));
            y.resize(split_at * (per ? per : 1));
            if (!sw.empty()) sw.resize(split_at);
        }
        auto ds = data::Dataset<Y>::from_arrays(std::move(x), shape, std::move(y), per ? per : 1, std::move(sw));
        const auto n = std::size_t(ds.cardinality());
        if (opts.shuffle) ds = ds.shuffle(n > 0 ? n : 1, seed_);
        ds = ds.batch(std::size_t(opts.batch_size));
        return fit(ds, opts);
    }

    /// Allocates, on every replica's thread, what a step on global batches of `batch_size`
    /// examples needs (with `training`, the gradients and training workspaces too), and touches
    /// that memory, so that the first step does not pay for it (Keras's `build`). fit calls it with
    /// its dataset's batch size, evaluate and predict with their first batch's size (a set smaller
    /// than one batch reserves for its examples only); a custom training loop can call it
    /// before its first step. Batch sizes no larger than one already built for cost nothing.
    void build(std::int64_t batch_size, bool training = true) {
        STRATA_CHECK(batch_size > 0, ValueError, "build: the batch size must be positive, got ", batch_size);
        // A unit's largest share of a batch, as the path splits it (lockstep strategies over all
        // the replicas in sync, or with per-worker input over this worker's; ParameterServer's
        // workers take whole batches).
        const std::int64_t share = path_.largest_unit_share(batch_size);
        path_.run_units([&](int r) {
            Unit& u = *units_[std::size_t(r)];
            u.net.reserve(share, training);
            reserve_step_buffers(u, share);
        });
        // A pipelined path computes a training step's loss on another thread (its last stage's).
        if (training) path_.run_where_loss_runs([&](int) { reserve_scratches(share); });
    }

    /// Loss and accuracy over a batched dataset (one pass), distributed like training. When the
    /// dataset carries sample weights, the loss is the weighted sum over the examples divided
    /// by their number (Keras's evaluate with sample_weight); accuracy and the other metrics
    /// are not weighted. Class weights never apply here (Keras's evaluate has none).
    template <class Y>
    Evaluation evaluate(const data::Dataset<Y>& ds) {
        return *evaluate_unless_stopped(ds, false);
    }

    /// predict's outputs below; first evaluate's pass, which fit's validation may cut short.
    /// `stoppable`: after each batch every rank agrees whether a signal asked the job to stop
    /// (distribute::agree_stop) and, if one did, the pass ends there with no figures (nullopt):
    /// under mpirun SIGKILL follows SIGTERM within a second, and a validation pass over a test
    /// set of MNIST's size took longer than that, so the model was lost. Only where every rank
    /// reads the same batches (lockstep, not per-worker input); elsewhere the pass runs whole.
    template <class Y>
    std::optional<Evaluation> evaluate_unless_stopped(const data::Dataset<Y>& ds, bool stoppable) {
        require_compiled("evaluate");
        warn_if_statistics_untrained("evaluate");
        STRATA_CHECK(ds.batch_size() > 0, ValueError, "evaluate: the dataset is not batched; call .batch(n) first");
        STRATA_CHECK(ds.cardinality() != data::infinite_cardinality, ValueError, "evaluate: the dataset repeats forever");
        double loss_sum = 0, correct = 0, counted = 0;
        std::int64_t seen = 0, built = 0;
        const int N = replicas();
        path_.prepare_inference();
        for (auto& u : units_) u->counts = {};
        for (auto it = ds.iterate(0); it != std::default_sentinel; ++it) {
            const auto& batch = *it;
            check_batch(batch, "evaluate");
            const std::int64_t n = std::int64_t(batch.size());
            build_for_inference(n, built);
            double factor = 0;  // masked_output: the batch's (every unit's) tokens that count
            if constexpr (masked_output) factor = token_factor(n, double(counted_tokens(batch.x.data(), n)));
            path_.run_units([&](int r) {
                Unit& u = *units_[std::size_t(r)];
                const auto b = path_.unit_share(batch, r);
                u.loss_sum = 0;
                u.correct = 0;
                u.counted = 0;
                if (b.size == 0) return;
                const nn::Mode mode{.training = false, .skip_activation = settings_.fused_softmax, .step = step_, .seed = seed_,
                                    .no_backward = true, .compute = compute_};
                auto x = stage_input(u, b.x.data(), b.size);
                auto target = stage_target(u, b.y.data(), b.size, b.y_per_example);
                auto out = u.net.forward(path_.inference_params(r), x, mode);
                const T* weights = b.w.empty() ? nullptr : stage_weights(u, b.w, b.size, b.y_per_example, false);
                if constexpr (masked_output) stage_token_weights(u, x, factor);
                score(u, out, target, u.net.output_grad(), 1.0, weights,
                      masked_output ? double(counted_tokens(b.x.data(), b.size)) : double(b.size),
                      masked_output ? u.token_weights.data() : nullptr, masked_output ? u.token_ones.data() : nullptr);
            });
            for (int r = 0; r < N; ++r) {
                loss_sum += units_[std::size_t(r)]->loss_sum;
                correct += double(units_[std::size_t(r)]->correct);
                counted += units_[std::size_t(r)]->counted;
            }
            seen += n;
            if (stoppable && lockstep && !path_.per_worker_input() &&
                distribute::agree_stop({false, stop_signal().load()}).signal != 0)
                return std::nullopt;
        }
        return this->evaluation_of(loss_sum, correct, counted, seen, path_.per_worker_input(), unit_counts());
    }

    /// The model's outputs for every example of a batched dataset, in order, on the host:
    /// [examples, output_shape...]. Distributed like training.
    template <class Y>
    Tensor<T, place::Host> predict(const data::Dataset<Y>& ds) {
        warn_if_statistics_untrained("predict");
        STRATA_CHECK(ds.batch_size() > 0, ValueError, "predict: the dataset is not batched; call .batch(n) first");
        STRATA_CHECK(ds.cardinality() != data::infinite_cardinality, ValueError, "predict: the dataset repeats forever");
        std::vector<T> all;
        std::int64_t built = 0;
        path_.prepare_inference();
        for (auto it = ds.iterate(0); it != std::default_sentinel; ++it) {
            const auto& batch = *it;
            check_input(batch, "predict");
            const std::int64_t n = std::int64_t(batch.size());
            build_for_inference(n, built);
            const std::size_t base = all.size();
            all.resize(base + std::size_t(n * output_size));
            path_.run_units([&](int r) {
                Unit& u = *units_[std::size_t(r)];
                const auto b = path_.unit_share(batch, r);
                if (b.size == 0) return;
                auto x = stage_input(u, b.x.data(), b.size);
                const nn::Mode mode{.training = false, .skip_activation = false, .step = step_, .seed = seed_, .no_backward = true,
                                    .compute = compute_};
                auto out = u.net.forward(path_.inference_params(r), x, mode);
                copy(out, TensorView<T, place::Host>(all.data() + base + std::size_t(b.first * output_size), out.shape()));
            });
        }
        // Across processes each one computed its replicas' rows (the others are zeros): the sum
        // gives every process every row.
        path_.sum_outputs_over_workers(std::span<T>(all));
        const auto count = std::int64_t(all.size()) / output_size;
        return from_vector(all, Net::output_shape::batched(count));
    }

    /// predict on in-memory examples ([n, input_shape...] floats), `batch_size` at a time.
    Tensor<T, place::Host> predict(const std::vector<float>& x, std::int64_t batch_size = 32) {
        STRATA_CHECK(x.size() % std::size_t(input_size) == 0, ShapeError, "predict: ", x.size(),
                     " floats are not a whole number of examples of ", input_size, " floats");
        const std::size_t n = x.size() / std::size_t(input_size);
        auto ds = data::Dataset<std::int32_t>::from_arrays(
            x, std::vector<std::size_t>(Net::input_shape::dims.begin(), Net::input_shape::dims.end()),
            std::vector<std::int32_t>(n, 0));
        return predict(ds.batch(std::size_t(batch_size)));
    }

    // ---- weights and checkpoints ------------------------------------------------------------

    /// All parameters as one flat host vector (layer after layer; Net::parameters() names them).
    std::vector<T> get_weights() const override { return path_.get_weights(); }
    void set_weights(const std::vector<T>& w) override {
        STRATA_CHECK(std::int64_t(w.size()) == num_params, ShapeError, "set_weights: the model has ", num_params,
                     " parameters, got ", w.size());
        path_.set_weights(w);
        weights_given_ = true;
    }

    /// Whether the network's statistics that are not trained by gradients (batch
    /// normalization's moving mean and variance) still hold their initial values (0 and 1): the
    /// model has such statistics and has taken no optimizer step, and no weights were given to
    /// it (set_weights, load, a backup restored). evaluate and predict then say so once, on
    /// stderr (the chief only): their figures are those of a network whose batch normalization
    /// divides by sqrt(1 + epsilon), not by the variance of any data.
    bool statistics_untrained() const {
        return Net::num_non_trainable() > 0 && path_.iterations() == 0 && !weights_given_;
    }

    /// The sentence evaluate and predict print when statistics_untrained() holds.
    static std::string untrained_statistics_message(const char* what) {
        return std::string("strata: warning: ") + what + ": the model has not been trained or loaded: its " +
               std::to_string(Net::num_non_trainable()) +
               " batch normalization statistics (moving mean and variance) are still their initial values (0 and 1), "
               "so these are the outputs of an untrained network";
    }

    // save(path, extra_metadata) and load(path, strict): train::ModelBase.
    static constexpr int checkpoint_version = train::checkpoint_format_version;

    // ---- TrainingContext ------------------------------------------------------------------
    /// Whether this process prints and writes files (always, but under MultiWorkerMirrored
    /// only on rank 0).
    bool is_chief() const override { return path_.is_chief(); }
    bool gathers_state() const override { return path_.gathers_state(); }

private:
    void warn_if_statistics_untrained(const char* what) {
        if (untrained_warned_ || !statistics_untrained()) return;
        untrained_warned_ = true;
        if (is_chief()) std::fprintf(stderr, "%s\n", untrained_statistics_message(what).c_str());
    }
    precision::Compute compute_ = precision::compute_of<Precision>();  // what the layers compute in
    bool weights_given_ = false;     // set_weights (and so load and a restored backup) gave them
    double staged_loss_scale_ = 1;   // a pipelined step's loss scale (StagedWork::prepare)
    double staged_token_factor_ = 0; // masked_output: a pipelined step's token factor (StagedWork::begin_step)
    bool untrained_warned_ = false;  // statistics_untrained() said once

    using Base = train::ModelBase<T>;
    using Base::class_weight_;
    using Base::compiled_;
    using Base::loss_;
    using Base::require_compiled;
    using Base::result_of;
    using Base::seed_;
    using Base::settings_;
    using Base::step_;

    // ---- what ModelBase asks of the path ----------------------------------------------------
    std::string path_optimizer_name() const override { return path_.optimizer_name(); }
    std::vector<std::pair<std::string, std::vector<T>>> path_slots() const override { return path_.slots(); }
    void path_set_slot(const std::string& name, const std::vector<T>& v) override { path_.set_slot(name, v); }
    std::int64_t path_iterations() const override { return path_.iterations(); }
    void path_set_iterations(std::int64_t it) override { path_.set_iterations(it); }
    std::optional<typename Base::LossScaleFigures> path_loss_scale_state() const override {
        if (!precision::scales_loss(compute_)) return std::nullopt;
        const auto s = path_.loss_scale_state();
        return typename Base::LossScaleFigures{s.scale, s.good_steps, s.skipped_steps};
    }
    void path_set_loss_scale_state(double scale, std::int64_t good, std::int64_t skipped) override {
        if (precision::scales_loss(compute_)) path_.set_loss_scale_state({.scale = scale, .good_steps = good, .skipped_steps = skipped});
    }
    double path_learning_rate() const override { return path_.learning_rate(); }
    void path_set_learning_rate(double lr) override { path_.set_learning_rate(lr); }
    void path_sum_over_workers(std::span<double> v) override { path_.sum_over_workers(v); }
    void path_after_save() const override { path_.after_save(); }

    // What one compute unit (replica or worker) owns: its network's activations, and what its
    // place stages and captures (train/place_step.hpp). Variables, gradients and optimizer slots
    // belong to the path.
    // Whether a layer draws random numbers (Dropout: its kernels take the step as an argument).
    template <class L>
    static constexpr bool layer_draws_random = requires(L& l) { l.set_stream(std::uint64_t(0)); };
    template <class Layers>
    struct DrawsRandom;
    template <class... L>
    struct DrawsRandom<std::tuple<L...>> {
        static constexpr bool value = (layer_draws_random<L> || ...);
    };
    // Layers whose pass reads values back to the host (batch normalization's statistics) cannot
    // be captured.
    template <class L>
    static constexpr bool layer_round_trips = [] {
        if constexpr (requires { L::host_round_trips; }) return bool(L::host_round_trips);
        else return false;
    }();
    template <class Layers>
    struct RoundTrips;
    template <class... L>
    struct RoundTrips<std::tuple<L...>> {
        static constexpr bool value = (layer_round_trips<L> || ...);
    };
    using capture_t = train::detail::StepCapture<T, P>;
    /// Whether a training step may run as one captured graph (today: OneDevice<Cuda>, graphs on,
    /// place::set_cuda_graphs): the place can capture one (StepCapture), the path's step is one
    /// unit with nothing between forward and backward that a graph cannot hold (the path's
    /// `captures_step`), and no layer draws random numbers or reads values back to the host. The
    /// optimizer's update runs after it, outside the graph.
    static constexpr bool step_capturable = capture_t::possible && path_type::captures_step &&
                                            !DrawsRandom<typename Net::template bound_layers<T, P>>::value &&
                                            !RoundTrips<typename Net::template bound_layers<T, P>>::value;
    struct Unit {
        network_type net;
        train::detail::UnitStaging<T, P> staging;
        capture_t capture;
        metrics::Counts counts;                  // since the epoch or evaluated pass began
        double loss_sum = 0;
        double correct = 0;                      // examples right (per-token ids: the shares right; masked: tokens)
        double counted = 0;                      // what correct is out of (UnitWork::counted)
        TensorView<T, P> staged_target;          // a pipelined unit's mini-batch (StagedWork)
        const T* staged_weights = nullptr;
        Tensor<T, P> token_weights{};            // masked_output: the loss's token weights (stage_token_weights)
        Tensor<T, P> token_ones{};               // masked_output: the metrics' (the mask: 1 or 0)
        TensorView<T, P> staged_x;               // a pipelined unit's input (its ids, for the token weights)
    };

    // evaluate's and predict's build: for the batches the dataset yields, not its batch size, so
    // that a set smaller than one batch (a test set of 100 examples batched by 1000) reserves and
    // touches what its examples need (strata_train --model resnet, 2 steps of 16 on such a set:
    // 724 MB resident and 0.51 s of system time before, the pages of 1000 examples' activations).
    // The first batch is the largest but where a set grows; `built` is the pass's largest so far.
    void build_for_inference(std::int64_t n, std::int64_t& built) {
        if (n <= built) return;
        build(n, false);
        built = n;
    }

    // masked_output: the output's tokens that count among n examples of host ids x: the ids that
    // are not 0, and a ClassToken's token per example where one is prepended (it always counts).
    static std::int64_t counted_tokens(const float* x, std::int64_t n) {
        std::int64_t v = 0;
        for (std::int64_t i = 0; i < n * input_size; ++i) v += x[i] != 0.0f ? 1 : 0;
        using N = nn::Network<Net, T, P>;
        if constexpr (N::mask_prepend_at < N::L) v += n;
        return v;
    }
    // masked_output: unit u's token weights for the examples whose input ids are `ids` ([n, S] on
    // P): the loss's into u.token_weights, each token that counts weighing `factor` (the global
    // batch's examples × tokens / its tokens that count, so that the loss's sum over the examples,
    // divided by the examples, is the mean over the tokens that count), and the metrics' into
    // u.token_ones (1 for a token that counts). From the ids rather than a network's mask, so
    // that a pipeline's last stage, which does not run the Embedding, weighs its outputs too.
    void stage_token_weights(Unit& u, const TensorView<T, P>& ids, double factor) {
        if constexpr (masked_output) {
            using N = nn::Network<Net, T, P>;
            constexpr bool prepend = N::mask_prepend_at < N::L;
            static_assert(sequence_tokens == input_size + (prepend ? 1 : 0),
                          "strata::Model: a masked per-token output has one token per input id (and a class token)");
            const std::int64_t n = ids.dim(0);
            u.token_weights.resize(Shape{n * sequence_tokens > 0 ? n * sequence_tokens : 1});
            u.token_ones.resize(Shape{n * sequence_tokens > 0 ? n * sequence_tokens : 1});
            if (n > 0) {
                place::for_each_n<P>(n * sequence_tokens, detail::IdTokenWeights<T>{ids.data(), u.token_weights.data(),
                                                                                    u.token_ones.data(), T(factor), input_size,
                                                                                    prepend});
            }
        } else {
            (void)u, (void)ids, (void)factor;
        }
    }
    // The factor above for a global batch of `examples` with `counted` tokens that count.
    static double token_factor(std::int64_t examples, double counted) {
        return counted > 0 ? double(examples) * double(sequence_tokens) / counted : 0.0;
    }

    // The unit of work of a pipelined path (a Pipeline's stages run forward and backward; Model
    // stages the mini-batch and computes the loss of each micro-batch on the last stage).
    template <class Y>
    struct StagedWork {
        Model* m;
        // On the caller's thread, before any unit's prepare, with the whole global batch (every
        // process of a pipeline reads it): with a masked per-token output, the factor of its
        // token weights (the global batch's tokens that count).
        void begin_step(const data::Batch<Y>& batch) {
            if constexpr (masked_output)
                m->staged_token_factor_ = token_factor(std::int64_t(batch.size()),
                                                       double(counted_tokens(batch.x.data(), std::int64_t(batch.size()))));
            else (void)batch;
        }
        // On the caller's thread before the step: stages unit r's mini-batch, returns its input.
        TensorView<T, P> prepare(int r, const distribute::ReplicaBatch<Y>& b) {
            Unit& u = *m->units_[std::size_t(r)];
            u.loss_sum = 0;
            u.correct = 0;
            u.counted = 0;
            if (b.size == 0) return {};
            STRATA_CHECK(b.example_size == input_size, ShapeError, "compute_gradients: examples of ", b.example_size,
                         " values do not fit the model's input ", nn::detail::shape_text<typename Net::input_shape>());
            STRATA_CHECK(b.w.empty() || std::int64_t(b.w.size()) == b.size, ShapeError, "compute_gradients: ", b.size,
                         " examples need ", b.size, " sample weights (one each) or none, got ", b.w.size());
            auto x = m->stage_input(u, b.x.data(), b.size);
            u.staged_x = x;
            u.staged_target = m->stage_target(u, b.y.data(), b.size, b.y_per_example);
            u.staged_weights = b.w.empty() && m->class_weight_.empty() ? nullptr
                                                                       : m->stage_weights(u, b.w, b.size, b.y_per_example, true);
            // Under a loss scale the loss's gradient is S times the loss's (see make_unit_work);
            // read here, on the caller's thread, before any stage runs (the stages' updates at
            // the step's end change it).
            m->staged_loss_scale_ = precision::scales_loss(m->compute_) ? m->path_.loss_scale_state().scale : 1.0;
            // The stages read the batch from their own threads and streams: the copies are done.
            P::synchronize();
            return x;
        }
        nn::Mode mode(const distribute::ReplicaBatch<Y>& b, std::uint64_t step) const {
            return {.training = true, .skip_activation = m->settings_.fused_softmax, .step = step, .seed = m->seed_, .first_example = b.first,
                    .global_examples = b.global_size, .compute = m->compute_};
        }
        // On the last stage's thread: the loss of examples [first, first + out.dim(0)) of unit
        // r's mini-batch, its gradient (scaled by 1 / denominator) into `out_grad`.
        void loss(int r, const distribute::ReplicaBatch<Y>& b, std::int64_t first, const TensorView<T, P>& out,
                  const TensorView<T, P>& out_grad, double denominator) {
            Unit& u = *m->units_[std::size_t(r)];
            const std::int64_t count = out.dim(0);
            const TensorView<T, P> target = u.staged_target.slice(first, count);
            const T* weights = u.staged_weights ? u.staged_weights + first : nullptr;
            if constexpr (masked_output) {
                m->stage_token_weights(u, u.staged_x.slice(first, count), m->staged_token_factor_);
                m->score(u, out, target, out_grad, denominator / m->staged_loss_scale_, weights,
                         double(counted_tokens(b.x.data() + first * input_size, count)), u.token_weights.data(),
                         u.token_ones.data());
            } else {
                m->score(u, out, target, out_grad, denominator / m->staged_loss_scale_, weights, double(count));
            }
        }
        distribute::UnitWork result(int r, const distribute::ReplicaBatch<Y>& b) const {
            const Unit& u = *m->units_[std::size_t(r)];
            return {u.loss_sum, u.correct, b.size, u.counted};
        }
    };

    // What the network-independent fit loop (train/fit_loop.hpp) asks of this model.
    template <class Y>
    struct FitHooks final : train::FitDriver {
        Model& m;
        const data::Dataset<Y>& train;
        const FitOptions<Y>& options;
        FitHooks(Model& model, const data::Dataset<Y>& t, const FitOptions<Y>& o) : m(model), train(t), options(o) {}

        std::int64_t expected_steps() override { return m.expected_steps(train); }
        // One mechanism for every lockstep strategy across processes: the job's stop channel
        // (the ProcessGroup every such strategy joins through). Not the parameter server's: its
        // workers and servers do not step, and a lost worker (which that strategy trains on
        // without) would make any sum over every rank wait for it.
        distribute::StopRequest agree_stop(distribute::StopRequest mine, bool) override {
            if constexpr (!lockstep) return mine;
            else return distribute::agree_stop(mine);
        }
        bool resumes_mid_epoch() const override { return lockstep; }
        void epoch_done(int epochs) override { m.epoch_ = epochs; }
        void begin_epoch() override {
            for (auto& u : m.units_) u->counts = {};
        }
        void run_epoch(int epoch, std::int64_t skip, train::FitEpoch& e) override {
            auto it = train.iterate(std::uint64_t(epoch));
            // A pass is a pure function of the epoch (data/dataset.hpp): skipping the batches
            // already trained on puts it where the backup was taken. Skipped, not trained on.
            std::int64_t done = 0;
            for (; done < skip && it != std::default_sentinel; ++done) ++it;
            STRATA_CHECK(done == skip, ValueError, "fit: cannot resume epoch ", epoch, " after batch ", skip,
                         ": this epoch's pass has only ", done, " batches (the training data changed since the backup)");
            const auto check = [this](const data::Batch<Y>& b) { m.check_batch(b, "fit"); };
            CheckedSource<distribute::detail::IteratorSource<Y, decltype(it)>, decltype(check)> source{
                distribute::detail::IteratorSource<Y, decltype(it)>(it), check};
            m.path_.run_epoch(source, m.step_, m.make_unit_work<Y>(), [&](const distribute::StepTotals& t) {
                return e.step(t.loss_sum, t.correct, t.examples, t.counted);
            });
        }
        void end_epoch(std::int64_t seen, train::Logs& logs, train::History& history, bool validate) override {
            m.log_epoch_metrics(m.unit_counts(), seen, logs);  // before the validation pass resets the counts
            // A signal during the validation pass ends it: the epoch is then logged without it.
            const auto ev = options.validation_data && validate ? m.evaluate_unless_stopped(*options.validation_data, true)
                                                                : std::nullopt;
            if (ev) {
                m.log_epoch_end(&*ev, logs);
            } else {
                m.log_epoch_end(nullptr, logs);
            }
            m.path_.end_epoch(logs, history);
        }
    };

    // Every batch fit takes is checked (labels in range, shapes) before any unit sees it.
    template <class Inner, class Check>
    struct CheckedSource {
        Inner inner;
        Check check;
        auto next() {
            const auto* b = inner.next();
            if (b) check(*b);
            return b;
        }
    };

    // Initial values of the variables, the same for every copy (the initializers' Philox
    // streams depend on the seed only).
    auto initializer() {
        return [this](T* params) { nn::Network<Net, T, P>().init(params, seed_); };
    }

    void build() {
        for (int r = 0; r < path_.units(); ++r) {
            units_.push_back(std::make_unique<Unit>());
            path_.bind_unit(r, units_.back()->net);
        }
        path_.log_placement();
    }

    // The unit of work every path schedules: forward on mini-batch `b` with `params`, loss (its
    // gradient scaled by 1 / `denominator`), backward into `grads`, telling `on_ready` as each
    // layer's gradient becomes final.
    template <class Y>
    auto make_unit_work() {
        if constexpr (path_type::pipelined) return StagedWork<Y>{this};
        else return [this](int r, const distribute::ReplicaBatch<Y>& b, const T* params, T* grads, double denominator,
                      std::uint64_t step, auto&& on_ready) -> distribute::UnitWork {
            Unit& u = *units_[std::size_t(r)];
            u.loss_sum = 0;
            u.correct = 0;
            u.counted = 0;
            if (b.size == 0) {
                fill(TensorView<T, P>(grads, Shape{num_params}), T(0));
                if constexpr (masked_output) {  // the others count the global batch's tokens with this replica
                    double none[1] = {0.0};
                    if (auto sum = path_.replica_sum(r)) sum(std::span<double>(none));
                }
                if constexpr (Net::synchronizes_replicas) {
                    // The others' synchronized layers wait for this replica's (empty) statistics.
                    const nn::Mode mode{.training = true, .step = step, .seed = seed_, .first_example = b.first,
                                        .global_examples = b.global_size, .replica_sum = path_.replica_sum(r), .compute = compute_};
                    u.net.join_empty(params, grads, mode, on_ready);
                }
                return {};
            }
            STRATA_CHECK(b.example_size == input_size, ShapeError, "compute_gradients: examples of ", b.example_size,
                         " values do not fit the model's input ", nn::detail::shape_text<typename Net::input_shape>());
            STRATA_CHECK(b.w.empty() || std::int64_t(b.w.size()) == b.size, ShapeError, "compute_gradients: ", b.size,
                         " examples need ", b.size, " sample weights (one each) or none, got ", b.w.size());
            const nn::Mode mode{.training = true, .skip_activation = settings_.fused_softmax, .step = step, .seed = seed_,
                                .first_example = b.first, .global_examples = b.global_size, .replica_sum = path_.replica_sum(r),
                                .compute = compute_};
            // Under a loss scale S the loss's gradient is S times the loss's (the optimizer divides
            // the reduced gradient by S): the denominator is divided by S. ParameterServer (not
            // lockstep: its workers compute while its servers apply) divides it itself, by the
            // scale in force when it handed the mini-batch out.
            if (precision::scales_loss(compute_) && lockstep) denominator /= path_.loss_scale_state().scale;
            [[maybe_unused]] double factor = 0;  // masked_output: each counted token's loss weight
            double mine = double(b.size);        // what this unit's accuracy counts
            if constexpr (masked_output) {
                // Sample weights multiply each example's tokens' weights (loss::WeightRow after the
                // rows): Σ over the real tokens of loss × sample weight / their count, Keras 3's
                // masked reduction with sample weights (losses/loss.py, apply_mask: the mask scaled
                // by total / valid, times the sample weight, over the total). Class weights need
                // one class id per example (check_batch refuses them with per-token ids).
                // The global batch's tokens that count: this replica's, summed over every replica
                // of the step (in this process and across processes), before any layer sums.
                mine = double(counted_tokens(b.x.data(), b.size));
                // ParameterServer (not lockstep: an update takes whichever mini-batches arrive)
                // gets each mini-batch's sum over its tokens that count (the weight of each such
                // token 1), and its servers divide the update's sum by the tokens the update
                // counted (UnitWork::counted): one device's mean over the tokens of those batches.
                double counted[1] = {mine};
                if (auto sum = path_.replica_sum(r)) sum(std::span<double>(counted));
                factor = lockstep ? token_factor(b.global_size, counted[0]) : double(sequence_tokens);
            }
            auto x = stage_input(u, b.x.data(), b.size);
            auto target = stage_target(u, b.y.data(), b.size, b.y_per_example);
            if constexpr (step_capturable) {
                // Nothing the host must read in the middle of the step: the place may capture it.
                if (b.w.empty() && class_weight_.empty() && settings_.top_k == 0 && !settings_.precision && !settings_.recall &&
                    !precision::is_mixed(compute_) && !masked_output)
                    return captured_step(u, b.size, x, target, params, grads, denominator, mode, on_ready);
            }
            auto out = u.net.forward(params, x, mode);
            // Unweighted data and no class weights: no weights staged, none applied.
            const T* weights = b.w.empty() && class_weight_.empty() ? nullptr : stage_weights(u, b.w, b.size, b.y_per_example, true);
            if constexpr (masked_output) stage_token_weights(u, x, factor);
            score(u, out, target, u.net.output_grad(), denominator, weights, mine,
                  masked_output ? u.token_weights.data() : nullptr, masked_output ? u.token_ones.data() : nullptr);
            u.net.backward(params, grads, mode, on_ready);
            // ParameterServer with a token mask: the loss above is the sum over the tokens that
            // count; the mini-batch's figure is its mean over them times its examples (as a
            // global batch's is in lockstep).
            if (masked_output && !lockstep) u.loss_sum = mine > 0 ? u.loss_sum * double(b.size) / mine : 0.0;
            return {u.loss_sum, u.correct, b.size, u.counted};
        };
    }

    // A unit's figures for outputs `out` against `target`, added to u's: the loss (its gradient
    // into `out_grad`, scaled by 1 / denominator; each example weighed by `weights`, if any),
    // the correct count, and the metrics beyond accuracy. Every pass scores through here:
    // a training step, a pipelined micro-batch, an evaluated batch.
    // `counted`: what the accuracy of these outputs is out of (their examples, or with
    // `token_weights`, their tokens that count). With a token mask the loss takes the scaled
    // weights (the global batch's mean over the tokens that count) and the metrics the `mask`
    // itself (a count of the tokens right, so that an epoch's accuracy is Σ right / Σ counted
    // over its batches, as Keras' masked metric accumulates it).
    void score(Unit& u, const TensorView<T, P>& out, const TensorView<T, P>& target, const TensorView<T, P>& out_grad,
               double denominator, const T* weights, double counted, const T* token_weights = nullptr,
               const T* mask = nullptr) {
        {
            STRATA_PROFILE_MODEL("loss");
            u.loss_sum += loss::loss_and_grad(loss_, out, target, out_grad, denominator, settings_.input_kind, weights, token_weights);
        }
        STRATA_PROFILE_MODEL("metrics");
        if (settings_.accuracy) u.correct += metrics::count_correct(out, target, settings_.accuracy_kind, mask);
        u.counted += counted;
        count_metrics(u, out, target, mask, counted);
    }

    // The unit's step as the place captures it (train/place_step.hpp): forward, the loss and
    // correct count summed where the unit computes, backward; the same kernels as the eager step.
    template <class OnReady>
    distribute::UnitWork captured_step(Unit& u, std::int64_t n, const TensorView<T, P>& x, const TensorView<T, P>& target,
                                       const T* params, T* grads, double denominator, const nn::Mode& mode, OnReady& on_ready) {
        const bool accuracy = settings_.accuracy;
        const auto figures = u.capture.run(
            {.n = n, .denominator = denominator, .params = params, .grads = grads, .x = x.data(), .target = target.data()},
            [&](auto& sink) {
                auto out = u.net.forward(params, x, mode);
                sink.loss_rows(loss::loss_rows_and_grad(loss_, out, target, u.net.output_grad(), denominator, settings_.input_kind,
                                                        static_cast<const T*>(nullptr)),
                               n);
                if (accuracy) sink.correct(out, target, settings_.accuracy_kind);
            },
            [&] { u.net.backward(params, grads, mode, on_ready); });
        u.loss_sum = figures.loss_sum;
        u.correct = accuracy ? figures.correct : 0;
        u.counted = double(n);
        return {u.loss_sum, u.correct, n, u.counted};
    }

    template <class Y>
    std::int64_t expected_steps(const data::Dataset<Y>& train) const {
        return path_.expected_updates(train.cardinality());
    }

    // What a pass on `share` examples stages and scratches outside the network, sized on the
    // unit's thread (the scratches are per thread): the input, the targets (at most the output's
    // values an example), the weights, and the loss's and metrics' rows.
    void reserve_step_buffers(Unit& u, std::int64_t share) {
        u.staging.reserve(Net::input_shape::batched(share), share * Net::output_shape::size, share);
        reserve_scratches(share);
    }
    // The loss's and the metrics' per-thread scratch, on the calling thread.
    static void reserve_scratches(std::int64_t share) {
        constexpr std::int64_t out = Net::output_shape::size;
        constexpr std::int64_t tokens = Net::output_shape::rank > 1 ? out / Net::output_shape::dims[Net::output_shape::rank - 1] : 1;
        loss::reserve_scratch<T, P>(share, tokens);
        metrics::reserve_accuracy_scratch<T, P>(share, tokens);
        metrics::reserve_counts_scratch<T, P>(share, tokens);
    }

    TensorView<T, P> stage_input(Unit& u, const float* src, std::int64_t count) {
        return u.staging.input(src, Net::input_shape::batched(count));
    }

    template <class Y>
    TensorView<T, P> stage_target(Unit& u, const Y* src, std::int64_t count, std::int64_t per) {
        return u.staging.target(src, per == 1 ? Shape{count} : Shape{count, per});
    }

    // Each example's weight: its sample weight (1 when `sample` is empty) times, when
    // `with_classes` and class_weight_ is set, its class's weight — Keras multiplies the two
    // (trainers/data_adapters/data_adapter_utils.py, class_weight_to_sample_weights: the class
    // is the rounded label, or the argmax of a target row; an unlisted class weighs 1).
    // Reads the targets stage_target staged.
    const T* stage_weights(Unit& u, std::span<const float> sample, std::int64_t count, std::int64_t per, bool with_classes) {
        T* out = u.staging.weights_on_host(count);
        const T* t = u.staging.target_on_host();
        const bool classes = with_classes && !class_weight_.empty();
        for (std::int64_t i = 0; i < count; ++i) {
            T w = sample.empty() ? T(1) : T(sample[std::size_t(i)]);
            if (classes) {
                std::int64_t c = 0;
                if (per == 1) {
                    c = std::int64_t(std::nearbyint(double(t[i])));
                } else {
                    for (std::int64_t j = 1; j < per; ++j)
                        if (t[i * per + j] > t[i * per + c]) c = j;
                }
                const auto it = class_weight_.find(c);
                if (it != class_weight_.end()) w *= T(it->second);
            }
            out[i] = w;
        }
        return u.staging.weights(count);
    }

    // The metrics beyond accuracy, counted per unit and summed by metric_figures on the
    // caller's thread once the units are done (an epoch, an evaluated pass).
    // `mask` (with a token mask at the output): the tokens that count, `counted` of them.
    void count_metrics(Unit& u, const TensorView<T, P>& out, const TensorView<T, P>& target, const T* mask, double counted) {
        if (settings_.top_k > 0) {  // per example, or per token of per-token ids (the mean over every token that counts)
            const std::int64_t n = out.dim(0), tokens = sequence_tokens > 1 && target.size() == n * sequence_tokens ? sequence_tokens : 1;
            u.counts.in_top_k += metrics::count_in_top_k(out, target, settings_.top_k, tokens, mask);
            u.counts.top_k_rows += mask ? std::int64_t(counted) : n * tokens;
        }
        if (settings_.precision || settings_.recall) u.counts += metrics::count_binary(out, target, mask);
    }
    metrics::Counts unit_counts() const {
        metrics::Counts c;
        for (const auto& u : units_) c += u->counts;
        return c;
    }

    template <class Y>
    void check_input(const data::Batch<Y>& batch, const char* what) const {
        STRATA_CHECK(std::int64_t(batch.example_size()) == input_size || batch.size() == 0, ShapeError, what,
                     ": examples of ", batch.example_size(), " values do not fit the model's input ",
                     nn::detail::shape_text<typename Net::input_shape>(), " (", input_size, " values)");
    }

    template <class Y>
    void check_batch(const data::Batch<Y>& batch, const char* what) const {
        check_input(batch, what);
        const std::int64_t n = std::int64_t(batch.size());
        if (loss::sparse_targets(loss_)) {
            // One class id per example, or one per token: the output [..., K, classes] and K ids
            // per example (a per-token softmax, a sequence model's next-token prediction).
            const std::int64_t per = std::int64_t(batch.y_per_example());
            STRATA_CHECK(per == 1 || per == sequence_tokens || n == 0, ShapeError, what, ": ", loss::name(loss_),
                         " takes one class id per example", sequence_tokens > 1 ? " or one per token (" : "",
                         sequence_tokens > 1 ? std::to_string(sequence_tokens) : std::string(), sequence_tokens > 1 ? ")" : "",
                         " (the model's output ", nn::detail::shape_text<typename Net::output_shape>(), "), got ", per);
            const std::int64_t classes = per == 1 ? output_size : output_size / sequence_tokens;
            STRATA_CHECK(per == 1 || class_weight_.empty() || n == 0, ValueError, what,
                         ": class weights need one class id per example; with one per token, give sample weights");
            for (std::int64_t i = 0; i < n * per; ++i) {
                const double v = double(batch.y[std::size_t(i)]);
                if (!(v >= 0 && v < double(classes) && v == std::floor(v))) {
                    if (per == 1)
                        throw_error<ValueError>(what, ": label ", v, " of example ", i, " of the batch is not a class id in [0, ",
                                                output_size, ") (the model has ", output_size, " outputs)");
                    throw_error<ValueError>(what, ": label ", v, " of example ", i / per, ", token ", i % per,
                                            " of the batch is not a class id in [0, ", classes, ") (the model has ", classes,
                                            " classes per token)");
                }
            }
        } else {
            STRATA_CHECK(std::int64_t(batch.y_per_example()) == output_size || n == 0, ShapeError, what, ": ",
                         loss::name(loss_), " needs targets of ", output_size, " values per example (the model's output ",
                         nn::detail::shape_text<typename Net::output_shape>(), "), got ", batch.y_per_example());
        }
    }

    std::unique_ptr<Strategy> owned_;
    Strategy* strategy_;
    path_type path_;
    std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace strata
