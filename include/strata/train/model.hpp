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
/// The training step, for every replica r of the strategy (in parallel, on r's thread):
///   forward on r's slice of the global batch → loss and its gradient (scaled by 1 / the
///   global batch size) → backward → gradient aggregation (none, all-reduce, or reduction to
///   the central copy) → optimizer update.
/// It is one inlined call chain over the layers; once the buffers have grown to the batch
/// size it allocates nothing.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/data/dataset.hpp"
#include "strata/distribute/distributed_dataset.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/distribute/collective/async.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/nn/sequential.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/progress.hpp"
#include "strata/train/safetensors.hpp"

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
};

/// Loss and metrics of evaluate().
struct Evaluation {
    double loss = 0;
    double accuracy = 0;
    std::int64_t examples = 0;
};

/// Figures of one training step.
struct StepResult {
    double loss = 0;
    double accuracy = 0;
    std::int64_t examples = 0;
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
// Device memory (logical GPUs of one GPU, or GPUs with peer access): replica r sums its slice
// of every replica's gradient, in replica order, and writes the sum back into every replica's
// buffer; nobody else touches that slice, so it works in place. (At namespace scope: nvcc
// needs kernel functors it can name.)
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

/// A model: a Sequential network `Net`, trained under `Strategy` with element type `T`.
template <class Net, class Strategy = distribute::Default, class T = float>
class Model : public train::TrainingContext {
    static_assert(distribute::Strategy<Strategy>,
                  "strata::Model<Net, Strategy, T>: Strategy must be a strategy (strata::distribute::Default, OneDevice<P>, "
                  "Mirrored<P>, CentralStorage<P>)");
    static_assert(std::is_floating_point_v<T>, "strata::Model<Net, Strategy, T>: T must be float or double");

public:
    using place_type = typename Strategy::place_type;
    using P = place_type;
    using network_type = nn::Network<Net, T, P>;
    static constexpr distribute::Kind kind = Strategy::kind;
    static constexpr std::int64_t num_params = Net::num_params;
    static constexpr std::int64_t input_size = Net::input_shape::size;
    static constexpr std::int64_t output_size = Net::output_shape::size;
    static constexpr bool last_is_softmax = detail::LastActivation<Net>::softmax;

    /// A model with its own Default strategy (one replica, all host cores).
    explicit Model(std::uint64_t seed = 0) : owned_(std::make_unique<Strategy>()), strategy_(owned_.get()), seed_(seed) { build(); }
    /// A model distributed by `strategy` (which must outlive it).
    explicit Model(Strategy& strategy, std::uint64_t seed = 0) : strategy_(&strategy), seed_(seed) { build(); }

    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    /// Sets the loss, the optimizer and the metrics ("accuracy" is the one supported besides
    /// the loss). Resets the optimizer state.
    void compile(loss::Loss loss, optim::Optimizer optimizer = optim::RMSprop{}, std::vector<std::string> metrics = {"accuracy"}) {
        for (const auto& m : metrics)
            STRATA_CHECK(m == "accuracy" || m == "acc" || m == "sparse_categorical_accuracy" || m == "categorical_accuracy",
                         ValueError, "compile: unknown metric '", m, "' (known: accuracy, sparse_categorical_accuracy, categorical_accuracy)");
        loss_ = std::move(loss);
        accuracy_ = !metrics.empty();
        input_kind_ = loss::input_kind(loss_, last_is_softmax);
        fused_ = input_kind_ == loss::Input::Logits && last_is_softmax;
        if (std::holds_alternative<loss::SparseCategoricalCrossentropy>(loss_)) acc_kind_ = metrics::AccuracyKind::SparseCategorical;
        else if (output_size == 1) acc_kind_ = metrics::AccuracyKind::Binary;
        else acc_kind_ = metrics::AccuracyKind::Categorical;
        const int opt_copies = kind == distribute::Kind::Mirrored ? replicas() : 1;
        strategy_->run_replicas([&](int r) {  // slots on each replica's device, as its variables
            if (r < opt_copies) replicas_[std::size_t(r)]->opt = optim::OptimizerState<T, P>(optimizer, num_params);
        });
        compiled_ = true;
    }

    /// Number of replicas that take part in every step.
    int replicas() const { return strategy_->num_replicas_in_sync(); }
    /// Gradient buckets a step all-reduces (StrategyOptions::bucket_bytes; 1 = after backward).
    std::size_t gradient_buckets() const { return buckets_.size(); }
    Strategy& strategy() { return *strategy_; }
    /// The Keras-like summary table.
    static std::string summary() { return Net::summary(); }

    // ---- training -------------------------------------------------------------------------

    /// One synchronous training step on a global batch: every replica takes its slice.
    template <class Y>
    StepResult train_step(const data::Batch<Y>& batch) {
        require_compiled("train_step");
        check_batch(batch, "train_step");
        const int N = replicas();
        begin_step();
        strategy_->run([&](distribute::ReplicaContext& ctx) {
            compute_gradients(ctx, distribute::split_batch(batch, N, ctx.replica_id_in_sync_group()));
            apply_gradients(ctx);
        });
        return end_step(std::int64_t(batch.size()));
    }

    // ---- the pieces of a step, for custom training loops ------------------------------------

    /// Starts a step: call once on the caller's thread before the replicas' compute_gradients.
    void begin_step() {
        require_compiled("begin_step");
        ++step_;
    }

    /// In a replica (inside strategy.run): forward on the replica's share of the global batch,
    /// the loss scaled by 1 / the global batch size, backward into the replica's gradients.
    /// Returns the sum of the per-example losses of this replica's examples.
    template <class Y>
    double compute_gradients(distribute::ReplicaContext& ctx, const distribute::ReplicaBatch<Y>& b) {
        const int r = ctx.replica_id_in_sync_group();
        Replica& rep = *replicas_[std::size_t(r)];
        rep.loss_sum = 0;
        rep.correct = 0;
        rep.next_bucket = 0;
        if (b.size == 0) {
            fill(rep.grads.view(), T(0));
            if (overlapped()) submit_ready(r, 0);
            return 0;
        }
        STRATA_CHECK(b.example_size == input_size, ShapeError, "compute_gradients: examples of ", b.example_size,
                     " values do not fit the model's input ", nn::detail::shape_text<typename Net::input_shape>());
        const nn::Mode mode{true, fused_, step_, seed_, b.first};
        T* params = params_of(r);
        auto x = stage_input(rep, b.x.data(), b.size);
        auto target = stage_target(rep, b.y.data(), b.size, b.y_per_example);
        auto out = rep.net.forward(params, x, mode);
        rep.loss_sum = loss::loss_and_grad(loss_, out, target, rep.net.output_grad(), double(b.global_size), input_kind_);
        if (accuracy_) rep.correct = correct_count(out, target);
        if (overlapped())
            rep.net.backward(params, rep.grads.data(), mode, [&](std::int64_t first, std::int64_t) { submit_ready(r, first); });
        else
            rep.net.backward(params, rep.grads.data(), mode);
        return rep.loss_sum;
    }

    /// In a replica (inside strategy.run), after compute_gradients: combines the replicas'
    /// gradients as the strategy does (nothing, all-reduce, or reduction onto the central
    /// copy) and applies the optimizer.
    void apply_gradients(distribute::ReplicaContext& ctx) { aggregate_and_update(ctx.replica_id_in_sync_group()); }

    /// Ends a step on the caller's thread; returns the global batch's mean loss and accuracy.
    StepResult end_step(std::int64_t global_size) {
        if constexpr (kind == distribute::Kind::CentralStorage) replicas_[0]->opt.advance();
        StepResult res;
        for (const auto& rep : replicas_) {
            res.loss += rep->loss_sum;
            res.accuracy += double(rep->correct);
        }
        const double denom = global_size > 0 ? double(global_size) : 1.0;
        res.loss /= denom;
        res.accuracy /= denom;
        res.examples = global_size;
        return res;
    }

    /// Trains on `train` for `options.epochs` epochs (Keras's fit) and returns the History.
    template <class Y>
    train::History fit(const data::Dataset<Y>& train, const FitOptions<Y>& options = {}) {
        require_compiled("fit");
        STRATA_CHECK(options.epochs >= 0, ValueError, "fit: epochs must be >= 0, got ", options.epochs);
        STRATA_CHECK(train.batch_size() > 0, ValueError,
                     "fit: the dataset is not batched; call .batch(n) on it first (Keras's fit batches arrays for you: "
                     "use the array overload with options.batch_size)");
        STRATA_CHECK(options.steps_per_epoch > 0 || train.cardinality() != data::infinite_cardinality, ValueError,
                     "fit: the dataset repeats forever; give options.steps_per_epoch");
        train::History history;
        train::ProgressBar bar(options.verbose);
        stop_training = false;
        for (auto& cb : options.callbacks) cb->on_train_begin(*this);
        train::Logs logs;
        for (int epoch = options.initial_epoch; epoch < options.epochs && !stop_training; ++epoch) {
            for (auto& cb : options.callbacks) cb->on_epoch_begin(*this, epoch);
            std::int64_t steps = options.steps_per_epoch > 0 ? options.steps_per_epoch : train.cardinality();
            if (steps < 0) steps = 0;  // unknown: the bar shows steps as they come
            bar.epoch_begin(epoch, options.epochs, steps);
            double loss_sum = 0, correct = 0;
            std::int64_t seen = 0, done = 0;
            for (auto it = train.iterate(std::uint64_t(epoch)); it != std::default_sentinel; ++it) {
                if (options.steps_per_epoch > 0 && done >= options.steps_per_epoch) break;
                const auto r = train_step(*it);
                loss_sum += r.loss * double(r.examples);
                correct += r.accuracy * double(r.examples);
                seen += r.examples;
                ++done;
                logs.clear();
                logs.set("loss", loss_sum / double(seen));
                if (accuracy_) logs.set("accuracy", correct / double(seen));
                bar.step(done, logs);
                for (auto& cb : options.callbacks) cb->on_train_batch_end(*this, done, logs);
            }
            last_epoch_seconds_ = bar.epoch_seconds();
            last_epoch_examples_ = seen;
            logs.clear();
            logs.set("loss", seen ? loss_sum / double(seen) : 0.0);
            if (accuracy_) logs.set("accuracy", seen ? correct / double(seen) : 0.0);
            if (options.validation_data) {
                const auto ev = evaluate(*options.validation_data);
                logs.set("val_loss", ev.loss);
                if (accuracy_) logs.set("val_accuracy", ev.accuracy);
            }
            logs.set("lr", learning_rate());
            bar.epoch_end(done, logs);
            epoch_ = epoch + 1;
            history.record(epoch, logs);
            for (auto& cb : options.callbacks) cb->on_epoch_end(*this, epoch, logs);
        }
        for (auto& cb : options.callbacks) cb->on_train_end(*this, logs);
        return history;
    }

    /// fit on in-memory arrays: `x` holds n examples (n × input size floats), `y` their labels;
    /// shuffled each epoch (from the model's seed) and batched by options.batch_size.
    template <class Y>
    train::History fit(std::vector<float> x, std::vector<Y> y, const FitOptions<Y>& options) {
        auto shape = std::vector<std::size_t>(Net::input_shape::dims.begin(), Net::input_shape::dims.end());
        const std::size_t per = y.size() && x.size() ? y.size() / (x.size() / std::size_t(input_size)) : 1;
        auto ds = data::Dataset<Y>::from_arrays(std::move(x), shape, std::move(y), per ? per : 1);
        const auto n = std::size_t(ds.cardinality());
        if (options.shuffle) ds = ds.shuffle(n > 0 ? n : 1, seed_);
        ds = ds.batch(std::size_t(options.batch_size));
        return fit(ds, options);
    }

    /// Loss and accuracy over a batched dataset (one pass), distributed like training.
    template <class Y>
    Evaluation evaluate(const data::Dataset<Y>& ds) {
        require_compiled("evaluate");
        STRATA_CHECK(ds.batch_size() > 0, ValueError, "evaluate: the dataset is not batched; call .batch(n) first");
        STRATA_CHECK(ds.cardinality() != data::infinite_cardinality, ValueError, "evaluate: the dataset repeats forever");
        double loss_sum = 0, correct = 0;
        std::int64_t seen = 0;
        const int N = replicas();
        for (auto it = ds.iterate(0); it != std::default_sentinel; ++it) {
            const auto& batch = *it;
            check_batch(batch, "evaluate");
            const std::int64_t n = std::int64_t(batch.size());
            strategy_->run_replicas([&](int r) {
                Replica& rep = *replicas_[std::size_t(r)];
                const auto b = distribute::split_batch(batch, N, r);
                rep.loss_sum = 0;
                rep.correct = 0;
                if (b.size == 0) return;
                const nn::Mode mode{false, fused_, step_, seed_};
                auto x = stage_input(rep, b.x.data(), b.size);
                auto target = stage_target(rep, b.y.data(), b.size, b.y_per_example);
                auto out = rep.net.forward(params_of(r), x, mode);
                rep.loss_sum = loss::loss_and_grad(loss_, out, target, rep.net.output_grad(), 1.0, input_kind_);
                if (accuracy_) rep.correct = correct_count(out, target);
            });
            for (int r = 0; r < N; ++r) {
                loss_sum += replicas_[std::size_t(r)]->loss_sum;
                correct += double(replicas_[std::size_t(r)]->correct);
            }
            seen += n;
        }
        return {seen ? loss_sum / double(seen) : 0.0, seen ? correct / double(seen) : 0.0, seen};
    }

    /// The model's outputs for every example of a batched dataset, in order, on the host:
    /// [examples, output_shape...]. Distributed like training.
    template <class Y>
    Tensor<T, place::Host> predict(const data::Dataset<Y>& ds) {
        STRATA_CHECK(ds.batch_size() > 0, ValueError, "predict: the dataset is not batched; call .batch(n) first");
        STRATA_CHECK(ds.cardinality() != data::infinite_cardinality, ValueError, "predict: the dataset repeats forever");
        std::vector<T> all;
        const int N = replicas();
        for (auto it = ds.iterate(0); it != std::default_sentinel; ++it) {
            const auto& batch = *it;
            check_input(batch, "predict");
            const std::int64_t n = std::int64_t(batch.size());
            const std::size_t base = all.size();
            all.resize(base + std::size_t(n * output_size));
            strategy_->run_replicas([&](int r) {
                Replica& rep = *replicas_[std::size_t(r)];
                const auto b = distribute::split_batch(batch, N, r);
                if (b.size == 0) return;
                auto x = stage_input(rep, b.x.data(), b.size);
                auto out = rep.net.forward(params_of(r), x, nn::Mode{false, false, step_, seed_});
                copy(out, TensorView<T, place::Host>(all.data() + base + std::size_t(b.first * output_size), out.shape()));
            });
        }
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
    std::vector<T> get_weights() const { return to_vector(TensorView<T, P>(const_cast<T*>(central_params()), Shape{num_params})); }
    void set_weights(const std::vector<T>& w) {
        STRATA_CHECK(std::int64_t(w.size()) == num_params, ShapeError, "set_weights: the model has ", num_params,
                     " parameters, got ", w.size());
        for_each_param_copy([&](T* dst) { copy(TensorView<T, place::Host>(const_cast<T*>(w.data()), Shape{num_params}),
                                               TensorView<T, P>(dst, Shape{num_params})); });
    }

    /// Writes weights, optimizer state and epoch to a safetensors file, atomically. Tensor
    /// names: the parameters as Net::parameters() names them ("conv2d/kernel", "dense_1/bias"),
    /// optimizer slots as "optimizer/<slot>/<parameter>"; metadata: format, format_version,
    /// epoch, step, optimizer, optimizer_iterations, seed. The learning rate is not stored: it is
    /// the optimizer's configuration, given again to compile().
    void save(const std::string& path) const {
        train::SafetensorsWriter w;
        const auto params = get_weights();
        const auto infos = Net::parameters();
        for (const auto& p : infos)
            w.add<T>(p.name, dims_of(p.shape), std::span<const T>(params.data() + p.offset, std::size_t(p.shape.size())));
        const auto& rep0 = *replicas_[0];
        if (compiled_) {
            for (auto& [slot, t] : const_cast<Replica&>(rep0).opt.slots()) {
                const auto v = to_vector(t.view());
                for (const auto& p : infos)
                    w.add<T>("optimizer/" + slot + "/" + p.name, dims_of(p.shape),
                             std::span<const T>(v.data() + p.offset, std::size_t(p.shape.size())));
            }
            w.set_metadata("optimizer", rep0.opt.name());
            w.set_metadata("optimizer_iterations", std::to_string(rep0.opt.iterations()));
        }
        w.set_metadata("format", "strata-checkpoint");
        w.set_metadata("format_version", std::to_string(checkpoint_version));
        w.set_metadata("epoch", std::to_string(epoch_));
        w.set_metadata("step", std::to_string(step_));
        w.set_metadata("seed", std::to_string(seed_));
        w.save(path);
    }

    /// Loads a checkpoint written by save(). CheckpointError names any tensor that is missing or
    /// has another shape (with both shapes), and refuses another format version.
    void load(const std::string& path) {
        const auto f = train::SafetensorsFile::load(path);
        STRATA_CHECK(f.has_metadata("format") && f.metadata("format") == "strata-checkpoint", CheckpointError, "load: '",
                     path, "' is not a strata checkpoint (no format=strata-checkpoint metadata)");
        const auto version = f.metadata("format_version");
        STRATA_CHECK(version == std::to_string(checkpoint_version), CheckpointError, "load: '", path,
                     "' has checkpoint format version ", version, ", this strata reads version ", checkpoint_version);
        const auto infos = Net::parameters();
        std::vector<T> params(static_cast<std::size_t>(num_params));
        for (const auto& p : infos) read_tensor(f, p.name, params.data() + p.offset, p.shape);
        if (compiled_) {
            const int copies = kind == distribute::Kind::Mirrored ? replicas() : 1;
            for (auto& [slot, t] : replicas_[0]->opt.slots()) {
                std::vector<T> v(static_cast<std::size_t>(num_params));
                for (const auto& p : infos) read_tensor(f, "optimizer/" + slot + "/" + p.name, v.data() + p.offset, p.shape);
                for (int r = 0; r < copies; ++r)
                    for (auto& [s2, t2] : replicas_[std::size_t(r)]->opt.slots())
                        if (s2 == slot) copy(TensorView<T, place::Host>(v.data(), Shape{num_params}), t2.view());
            }
            if (f.has_metadata("optimizer_iterations")) {
                const auto it = std::stoll(f.metadata("optimizer_iterations"));
                for (int r = 0; r < copies; ++r) replicas_[std::size_t(r)]->opt.set_iterations(it);
            }
        }
        set_weights(params);
        epoch_ = f.has_metadata("epoch") ? std::stoi(f.metadata("epoch")) : 0;
        step_ = f.has_metadata("step") ? std::uint64_t(std::stoull(f.metadata("step"))) : 0;
    }
    static constexpr int checkpoint_version = 1;

    /// Epochs trained so far (restored by load), and figures of the last epoch.
    int epoch() const { return epoch_; }
    double last_epoch_seconds() const { return last_epoch_seconds_; }
    std::int64_t last_epoch_examples() const { return last_epoch_examples_; }

    // ---- TrainingContext ------------------------------------------------------------------
    double learning_rate() const override { return compiled_ ? replicas_[0]->opt.current_learning_rate() : 0.0; }
    void set_learning_rate(double lr) override {
        const int copies = kind == distribute::Kind::Mirrored ? replicas() : 1;
        for (int r = 0; r < copies; ++r) replicas_[std::size_t(r)]->opt.set_learning_rate(lr);
    }
    void save_checkpoint(const std::string& path, int epoch) override {
        const int keep = epoch_;
        epoch_ = epoch + 1;
        save(path);
        epoch_ = keep;
    }
    std::vector<double> weights_snapshot() const override {
        const auto w = get_weights();
        return std::vector<double>(w.begin(), w.end());
    }
    void restore_weights(const std::vector<double>& s) override { set_weights(std::vector<T>(s.begin(), s.end())); }

private:
    struct Replica {
        network_type net;
        Tensor<T, P> params, grads, x, target;
        Tensor<T, place::Host> target_host, x_host;
        optim::OptimizerState<T, P> opt;
        double loss_sum = 0;
        std::int64_t correct = 0;
        // Mirrored with several gradient buckets: this replica's communication thread, and the
        // next bucket of the current step to hand to it.
        std::unique_ptr<distribute::collective::AsyncAllReduce> comm;
        std::size_t next_bucket = 0;
    };

    // Gradient buckets over the flat gradient buffer, in the order backward produces them
    // (last layer first): each is a contiguous range [first, first + count) of whole layers.
    struct GradBucket {
        std::int64_t first = 0, count = 0;
    };
    std::vector<GradBucket> buckets_;

    // Buckets come from collective::BucketPlan over the layers' parameter blocks in backward
    // order; each bucket of consecutive whole layers is one contiguous range of the flat buffer.
    void plan_buckets() {
        const auto& off = Net::offsets;
        std::vector<std::size_t> sizes, layer_of;
        for (std::size_t l = Net::num_layers; l-- > 0;)
            if (off[l + 1] > off[l]) {
                sizes.push_back(std::size_t(off[l + 1] - off[l]));
                layer_of.push_back(l);
            }
        if (sizes.empty()) return;
        const std::size_t bytes = strategy_->options().bucket_bytes;
        if (bytes == 0) {  // one all-reduce after the whole backward pass
            buckets_.push_back({0, num_params});
            return;
        }
        const distribute::collective::BucketPlan plan(sizes, sizeof(T), bytes);
        for (const auto& b : plan.buckets()) {
            const std::size_t highest = layer_of[b.first_tensor];
            const std::size_t lowest = layer_of[b.first_tensor + b.tensor_count - 1];
            buckets_.push_back({off[lowest], off[highest + 1] - off[lowest]});
        }
    }

    bool overlapped() const {
        return kind == distribute::Kind::Mirrored && place::host_accessible_v<P> && replicas() > 1 && buckets_.size() > 1;
    }

    distribute::collective::AsyncAllReduce& comm_of(int r) {
        auto& rep = *replicas_[std::size_t(r)];
        if (!rep.comm)
            rep.comm = std::make_unique<distribute::collective::AsyncAllReduce>(
                strategy_->group(), r, distribute::ReduceOp::Sum, strategy_->options().all_reduce);
        return *rep.comm;
    }

    // Called by backward as each layer's gradient becomes final: hands every completed bucket
    // to the communication thread, which all-reduces it while backward goes on.
    void submit_ready(int r, std::int64_t first) {
        auto& rep = *replicas_[std::size_t(r)];
        while (rep.next_bucket < buckets_.size() && buckets_[rep.next_bucket].first >= first) {
            const auto& b = buckets_[rep.next_bucket];
            comm_of(r).submit(rep.next_bucket, std::span<T>(rep.grads.data() + b.first, std::size_t(b.count)));
            ++rep.next_bucket;
        }
    }

    void build() {
        const int N = replicas();
        for (int r = 0; r < N; ++r) replicas_.push_back(std::make_unique<Replica>());
        // Each replica allocates its buffers on its own thread, inside its device scope, so they
        // come from its logical device's memory (and count against its limit).
        strategy_->run_replicas([&](int r) {
            Replica& rep = *replicas_[std::size_t(r)];
            rep.grads.resize(Shape{num_params});
            fill(rep.grads.view(), T(0));
            if (r == 0 || kind == distribute::Kind::Mirrored) rep.params.resize(Shape{num_params});
            if (r == 0 && kind == distribute::Kind::CentralStorage) central_grads_.resize(Shape{num_params});
        });
        plan_buckets();
        if (place::get_log_device_placement()) {
            const auto& devices = strategy_->devices();
            const int copies = kind == distribute::Kind::Mirrored ? N : 1;
            for (const auto& p : Net::parameters())
                for (int r = 0; r < copies; ++r)
                    place::log_placement("variable " + p.name + " " + p.shape.str() +
                                             (copies > 1 ? " (copy " + std::to_string(r) + ")" : std::string()),
                                         devices[std::size_t(r)]);
        }
        // Every copy starts from the same initial values (the Philox streams depend on the
        // seed only), so Mirrored replicas are in sync from step 0.
        for_each_param_copy([&](T* p) { replicas_[0]->net.init(p, seed_); });
    }

    template <class F>
    void for_each_param_copy(F&& f) {
        const int copies = kind == distribute::Kind::Mirrored ? replicas() : 1;
        for (int r = 0; r < copies; ++r) f(replicas_[std::size_t(r)]->params.data());
    }
    T* params_of(int r) const {
        return kind == distribute::Kind::Mirrored ? replicas_[std::size_t(r)]->params.data() : replicas_[0]->params.data();
    }
    const T* central_params() const { return replicas_[0]->params.data(); }

    void device_all_reduce(int r) {
        const int N = replicas();
        STRATA_CHECK(N <= 16, ValueError, "Mirrored on a device place: at most 16 replicas, got ", N);
        P::synchronize();  // this replica's gradients are complete
        strategy_->group().barrier(r);
        const auto sl = distribute::replica_slice(num_params, N, r);
        detail::DeviceSliceSum<T> f{{}, N, sl.first};
        for (int q = 0; q < N; ++q) f.grads[q] = replicas_[std::size_t(q)]->grads.data();
        if (sl.count > 0) thrust::for_each_n(P::policy(), thrust::counting_iterator<std::int64_t>(0), sl.count, f);
        P::synchronize();
        strategy_->group().barrier(r);  // every slice summed: all buffers hold the total
    }

    void aggregate_and_update(int r) {
        Replica& rep = *replicas_[std::size_t(r)];
        if constexpr (kind == distribute::Kind::Mirrored && !place::host_accessible_v<P>) {
            if (replicas() > 1) device_all_reduce(r);
            rep.opt.apply(rep.params.data(), rep.grads.data());
        } else if constexpr (kind == distribute::Kind::Mirrored) {
            if (overlapped()) {
                submit_ready(r, 0);  // whatever the backward hook has not handed over yet
                comm_of(r).wait();
            } else {
                strategy_->group().all_reduce(r, std::span<T>(rep.grads.data(), std::size_t(num_params)),
                                              distribute::ReduceOp::Sum, strategy_->options().all_reduce);
            }
            rep.opt.apply(rep.params.data(), rep.grads.data());
        } else if constexpr (kind == distribute::Kind::CentralStorage) {
            // Reduce onto the central copy: replica r sums its slice of every replica's gradient
            // (in replica order, so the result does not depend on timing), then updates that
            // slice of the central variables. The step ends when all are done (run_replicas
            // returns), so the next step reads updated variables.
            auto& group = strategy_->group();
            const int N = replicas();
            P::synchronize();  // device places: this replica's gradient is complete before others read it
            group.barrier(r);
            const auto sl = distribute::replica_slice(num_params, N, r);
            if (sl.count > 0) {
                T* central = central_grads_.data() + sl.first;
                copy(TensorView<T, P>(replicas_[0]->grads.data() + sl.first, Shape{sl.count}), TensorView<T, P>(central, Shape{sl.count}));
                for (int q = 1; q < N; ++q)
                    axpy(T(1), TensorView<T, P>(replicas_[std::size_t(q)]->grads.data() + sl.first, Shape{sl.count}),
                         TensorView<T, P>(central, Shape{sl.count}));
                replicas_[0]->opt.apply_range(replicas_[0]->params.data(), central_grads_.data(), sl.first, sl.count);
            }
            P::synchronize();  // the update is done before the step ends
        } else {
            rep.opt.apply(rep.params.data(), rep.grads.data());
        }
    }

    TensorView<T, P> stage_input(Replica& rep, const float* src, std::int64_t count) {
        const Shape shape = Net::input_shape::batched(count);
        if constexpr (std::is_same_v<T, float> && place::host_accessible_v<P>) {
            // The batch is already where the replica computes: no copy.
            return TensorView<T, P>(const_cast<float*>(src), shape);
        } else if constexpr (place::host_accessible_v<P>) {
            rep.x.resize(shape);
            for (std::int64_t i = 0; i < shape.size(); ++i) rep.x.data()[i] = T(src[i]);
            return rep.x.view();
        } else {
            rep.x_host.resize(shape);
            for (std::int64_t i = 0; i < shape.size(); ++i) rep.x_host.data()[i] = T(src[i]);
            rep.x.resize(shape);
            copy(rep.x_host.view(), rep.x.view());
            return rep.x.view();
        }
    }

    template <class Y>
    TensorView<T, P> stage_target(Replica& rep, const Y* src, std::int64_t count, std::int64_t per) {
        const Shape shape = per == 1 ? Shape{count} : Shape{count, per};
        rep.target_host.resize(shape);
        for (std::int64_t i = 0; i < shape.size(); ++i) rep.target_host.data()[i] = T(src[i]);
        if constexpr (place::host_accessible_v<P>) {
            return rep.target_host.view();
        } else {
            rep.target.resize(shape);
            copy(rep.target_host.view(), rep.target.view());
            return rep.target.view();
        }
    }

    std::int64_t correct(const TensorView<T, P>& out, const TensorView<T, P>& target) { return correct_count(out, target); }
    std::int64_t correct_count(const TensorView<T, P>& out, const TensorView<T, P>& target) {
        return metrics::count_correct(out, target, acc_kind_);
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
            STRATA_CHECK(batch.y_per_example() == 1 || n == 0, ShapeError, what, ": ", loss::name(loss_),
                         " takes one class id per example, got ", batch.y_per_example());
            for (std::int64_t i = 0; i < n; ++i) {
                const double v = double(batch.y[std::size_t(i)]);
                if (!(v >= 0 && v < double(output_size) && v == std::floor(v)))
                    throw_error<ValueError>(what, ": label ", v, " of example ", i, " of the batch is not a class id in [0, ",
                                            output_size, ") (the model has ", output_size, " outputs)");
            }
        } else {
            STRATA_CHECK(std::int64_t(batch.y_per_example()) == output_size || n == 0, ShapeError, what, ": ",
                         loss::name(loss_), " needs targets of ", output_size, " values per example (the model's output ",
                         nn::detail::shape_text<typename Net::output_shape>(), "), got ", batch.y_per_example());
        }
    }

    void require_compiled(const char* what) const {
        STRATA_CHECK(compiled_, ValueError, what, ": the model is not compiled; call compile(loss, optimizer) first");
    }

    static std::vector<std::size_t> dims_of(const Shape& s) { return std::vector<std::size_t>(s.begin(), s.end()); }

    // Reads tensor `name` (shape checked by the reader) into `dst`; a float checkpoint loads into
    // a double model and the other way round, converting each value.
    static void read_tensor(const train::SafetensorsFile& f, const std::string& name, T* dst, const Shape& shape) {
        const auto n = std::size_t(shape.size());
        const auto dims = dims_of(shape);
        if (f.contains(name) && f.dtype(name) != train::dtype_of<T>) {
            if (f.dtype(name) == train::Dtype::F32) return convert_from<float>(f, name, dst, n, dims);
            if (f.dtype(name) == train::Dtype::F64) return convert_from<double>(f, name, dst, n, dims);
        }
        f.copy_to<T>(name, std::span<T>(dst, n), dims);
    }
    template <class U>
    static void convert_from(const train::SafetensorsFile& f, const std::string& name, T* dst, std::size_t n,
                             const std::vector<std::size_t>& dims) {
        std::vector<U> tmp(n);
        f.copy_to<U>(name, std::span<U>(tmp), dims);
        for (std::size_t i = 0; i < n; ++i) dst[i] = T(tmp[i]);
    }

    std::unique_ptr<Strategy> owned_;
    Strategy* strategy_;
    std::uint64_t seed_;
    std::vector<std::unique_ptr<Replica>> replicas_;
    Tensor<T, P> central_grads_;  // CentralStorage: the reduced gradient, on the central device
    loss::Loss loss_{};
    loss::Input input_kind_ = loss::Input::Probabilities;
    metrics::AccuracyKind acc_kind_ = metrics::AccuracyKind::SparseCategorical;
    bool fused_ = false, accuracy_ = true, compiled_ = false;
    std::uint64_t step_ = 0;
    int epoch_ = 0;
    double last_epoch_seconds_ = 0;
    std::int64_t last_epoch_examples_ = 0;
};

}  // namespace strata
