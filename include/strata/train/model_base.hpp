#pragma once
/// \file strata/train/model_base.hpp
/// `train::ModelBase<T>`: the part of `Model<Net, Strategy, T>` that depends on neither the
/// network nor the strategy — what compile decided, the loss, the counters (epoch, step), the
/// model's state as checkpoints see it (state/restore_state), save and load, the metrics'
/// figures and the epoch's logs, the learning rate callbacks read and set. Model derives from it
/// and answers a few questions about its strategy's variables and optimizer (the `path_*`
/// members below); everything else is written, and compiled, once per element type: with the
/// compiled part, once in the library (float and double), not once per Net × Strategy.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/metric.hpp"
#include "strata/nn/layer.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/compile_settings.hpp"
#include "strata/train/model_state.hpp"

namespace strata {

/// Loss and metrics of evaluate().
struct Evaluation {
    double loss = 0;
    double accuracy = 0;
    std::int64_t examples = 0;
    /// The compiled metrics beyond accuracy, by Keras name ("precision", "recall",
    /// "sparse_top_k_categorical_accuracy").
    std::map<std::string, double> metrics{};
};

/// Figures of one training step.
struct StepResult {
    double loss = 0;
    double accuracy = 0;
    std::int64_t examples = 0;
};

}  // namespace strata

namespace strata::train {

/// The network- and strategy-independent part of a Model with element type T (float or double).
template <class T>
class ModelBase : public TrainingContext {
public:
    ~ModelBase() override;

    /// All parameters as one flat host vector (layer after layer), and its inverse.
    virtual std::vector<T> get_weights() const = 0;
    virtual void set_weights(const std::vector<T>& w) = 0;

    /// Writes weights, optimizer state and epoch to a safetensors file, atomically. Tensor
    /// names: the parameters as Net::parameters() names them ("conv2d/kernel", "dense_1/bias"),
    /// optimizer slots as "optimizer/<slot>/<parameter>"; metadata: format, format_version,
    /// epoch, step, optimizer, optimizer_iterations, learning_rate (the current one, a
    /// schedule's value included), seed. The layout does not depend on the strategy: a
    /// checkpoint written under one loads under any other.
    /// `extra_metadata` is added to the file's metadata (save()'s own keys win over it):
    /// BackupAndRestore stores its position there.
    /// Under MultiWorkerMirrored call it on every process: the chief writes, and every process
    /// returns once the file is complete (so each may load it at once).
    /// A Pipeline across processes gathers its stages here: call it on every process.
    void save(const std::string& path, const std::map<std::string, std::string>& extra_metadata = {}) const;
    /// Loads a checkpoint written by save() (under any strategy: the layout is the same).
    /// The whole file is validated before anything changes (train::read_checkpoint): a missing
    /// tensor or one of another shape (both shapes named), another format version, metadata
    /// that is not a strict integer, and — when `strict` (the default, like PyTorch's
    /// load_state_dict) — tensors the model does not know or the state of another optimizer
    /// are a CheckpointError, and the model is left as it was. With `strict = false` unknown
    /// tensors are ignored and another optimizer's state is left out. The learning rate stored
    /// by save() is restored when the model is compiled.
    void load(const std::string& path, bool strict = true);

    /// Epochs trained so far (restored by load), and figures of the last epoch.
    int epoch() const { return epoch_; }
    double last_epoch_seconds() const { return last_epoch_seconds_; }
    std::int64_t last_epoch_examples() const { return last_epoch_examples_; }

    // ---- TrainingContext ----------------------------------------------------------------------
    double learning_rate() const override;
    void set_learning_rate(double lr) override;
    std::vector<double> weights_snapshot() const override;
    void restore_weights(const std::vector<double>& snapshot) override;
    /// The model's layout and, `with_values`, its whole state (train::ModelState): what
    /// checkpoints save and load. Only data crosses here; the checkpoint code is not a part
    /// of Model, so it is compiled only where something saves or loads.
    ModelState state(bool with_values) const override;
    /// Takes a state of this model's layout (validated by train::read_model_state): weights,
    /// and when compiled the optimizer slots, iterations and the stored learning rate (a
    /// constant rate; a schedule's follows from the iterations), epoch and step.
    void restore_state(const ModelState& s) override;

protected:
    /// `parameters`: the network's parameter list (Net::parameters), `num_params` its size.
    ModelBase(std::uint64_t seed, std::int64_t num_params, std::vector<nn::ParamInfo> (*parameters)());

    // ---- what the strategy's gradient path answers (Model forwards to it) -----------------------
    virtual std::string path_optimizer_name() const = 0;
    virtual std::vector<std::pair<std::string, std::vector<T>>> path_slots() const = 0;
    virtual void path_set_slot(const std::string& name, const std::vector<T>& values) = 0;
    virtual std::int64_t path_iterations() const = 0;
    virtual void path_set_iterations(std::int64_t iterations) = 0;
    /// The dynamic loss scale's (scale, good steps, skipped steps) where the model has one.
    struct LossScaleFigures {
        double scale;
        std::int64_t good_steps, skipped_steps;
    };
    virtual std::optional<LossScaleFigures> path_loss_scale_state() const = 0;
    virtual void path_set_loss_scale_state(double scale, std::int64_t good_steps, std::int64_t skipped_steps) = 0;
    virtual double path_learning_rate() const = 0;
    virtual void path_set_learning_rate(double lr) = 0;
    /// Across processes: `values` summed over every worker (one process: unchanged).
    virtual void path_sum_over_workers(std::span<double> values) = 0;
    /// Across processes: returns once every process's part of a save is complete.
    virtual void path_after_save() const = 0;

    // ---- for Model ------------------------------------------------------------------------------
    /// compile's first half: checks the metrics against the loss and the network's output
    /// (train::compile_settings) and takes the loss; the path compiles the optimizer after it.
    void compile_settings_for(loss::Loss loss, const optim::Optimizer& optimizer, const std::vector<metrics::Metric>& metrics,
                              std::int64_t output_size, bool last_is_softmax, std::int64_t last_axis = -1);
    /// fit's checks of its options that do not depend on the label type.
    void check_fit_options(int epochs, double validation_split, std::size_t sample_weights,
                           const std::map<std::int64_t, double>& class_weight, std::int64_t output_size, std::size_t batch_size,
                           std::int64_t steps_per_epoch, bool infinite) const;
    void require_compiled(const char* what) const;
    StepResult result_of(const distribute::StepTotals& t) const;
    /// The metrics beyond accuracy over `seen` examples, from the units' counts (summed over
    /// the workers across processes).
    std::map<std::string, double> metric_figures(metrics::Counts counts, std::int64_t seen);
    /// evaluate's figures from this process's sums over its units: across processes the
    /// totals over every process (the examples counted once each unless `per_worker_input`,
    /// where every process saw only its own).
    Evaluation evaluation_of(double loss_sum, double correct, double counted, std::int64_t seen, bool per_worker_input,
                             const metrics::Counts& counts);
    /// An epoch's logs: the metrics beyond accuracy over its `seen` examples (before the
    /// validation pass resets the counts), then the validation figures (when `validation`) and
    /// the learning rate.
    void log_epoch_metrics(const metrics::Counts& counts, std::int64_t seen, Logs& logs);
    void log_epoch_end(const Evaluation* validation, Logs& logs);

    std::uint64_t seed_;
    std::int64_t num_params_;
    std::vector<nn::ParamInfo> (*parameters_)();
    loss::Loss loss_{};
    CompileSettings settings_{.accuracy = true};    // what compile() decided
    std::map<std::int64_t, double> class_weight_;   // FitOptions::class_weight while fit runs
    bool compiled_ = false;
    std::uint64_t step_ = 0;
    int epoch_ = 0;
    double last_epoch_seconds_ = 0;
    std::int64_t last_epoch_examples_ = 0;
};

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/model_base.ipp"
#endif

// After the definitions, which src/strata.cpp instantiates (strata/config.hpp).
#if STRATA_INSTANCES
namespace strata::train {
STRATA_TEMPLATE class ModelBase<float>;
STRATA_TEMPLATE class ModelBase<double>;
}  // namespace strata::train
#endif
