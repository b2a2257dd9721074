#pragma once
/// \file strata/train/impl/model_base.ipp
/// The definitions behind strata/train/model_base.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp (ModelBase<float>, ModelBase<double>) under
/// STRATA_SEPARATE_COMPILATION.

#include <cmath>
#include <type_traits>

#include "strata/train/checkpoint.hpp"
#include "strata/train/model_base.hpp"

namespace strata::train {

template <class T>
ModelBase<T>::ModelBase(std::uint64_t seed, std::int64_t num_params, std::vector<nn::ParamInfo> (*parameters)())
    : seed_(seed), num_params_(num_params), parameters_(parameters) {}

template <class T>
ModelBase<T>::~ModelBase() = default;

template <class T>
void ModelBase<T>::save(const std::string& path, const std::map<std::string, std::string>& extra_metadata) const {
    if (gathers_state()) {  // every process sends its part; the chief writes
        const auto s = state(true);
        if (is_chief()) write_checkpoint(path, s, extra_metadata);
    } else if (is_chief()) {
        write_checkpoint(path, state(true), extra_metadata);  // across processes the chief writes
    }
    path_after_save();  // across processes: every process returns once the file is complete
}

template <class T>
void ModelBase<T>::load(const std::string& path, bool strict) {
    restore_state(read_model_state(path, state(false), strict));
}

template <class T>
double ModelBase<T>::learning_rate() const {
    return compiled_ ? path_learning_rate() : 0.0;
}

template <class T>
void ModelBase<T>::set_learning_rate(double lr) {
    path_set_learning_rate(lr);
    settings_.constant_learning_rate = true;
}

template <class T>
std::vector<double> ModelBase<T>::weights_snapshot() const {
    const auto w = get_weights();
    return std::vector<double>(w.begin(), w.end());
}

template <class T>
void ModelBase<T>::restore_weights(const std::vector<double>& s) {
    set_weights(std::vector<T>(s.begin(), s.end()));
}

template <class T>
ModelState ModelBase<T>::state(bool with_values) const {
    ModelState s;
    s.num_params = num_params_;
    s.f64 = std::is_same_v<T, double>;
    for (const auto& p : parameters_()) s.params.push_back({p.name, std::vector<std::size_t>(p.shape.begin(), p.shape.end()), p.offset});
    if (compiled_) {
        s.optimizer = path_optimizer_name();
        for (auto& [slot, v] : path_slots()) {
            s.slot_names.push_back(slot);
            if (with_values) s.slots.emplace_back(v.begin(), v.end());
        }
        if (with_values) {
            s.optimizer_iterations = path_iterations();
            s.learning_rate = path_learning_rate();
            if (const auto ls = path_loss_scale_state()) {
                s.loss_scale = ls->scale;
                s.loss_scale_good_steps = ls->good_steps;
                s.loss_scale_skipped_steps = ls->skipped_steps;
            }
        }
    }
    if (with_values) {
        const auto w = get_weights();
        s.weights.assign(w.begin(), w.end());
        s.has_values = true;
    }
    s.epoch = epoch_;
    s.step = step_;
    s.seed = seed_;
    return s;
}

template <class T>
void ModelBase<T>::restore_state(const ModelState& s) {
    STRATA_CHECK(s.has_values && s.num_params == num_params_ && std::int64_t(s.weights.size()) == num_params_, ValueError,
                 "restore_state: a state of ", s.weights.size(), " weights does not fit a model of ", num_params_);
    set_weights(std::vector<T>(s.weights.begin(), s.weights.end()));
    if (compiled_) {
        for (std::size_t i = 0; i < s.slots.size() && i < s.slot_names.size(); ++i)
            if (!s.slots[i].empty()) path_set_slot(s.slot_names[i], std::vector<T>(s.slots[i].begin(), s.slots[i].end()));
        if (s.optimizer_iterations) path_set_iterations(*s.optimizer_iterations);
        if (s.loss_scale) path_set_loss_scale_state(*s.loss_scale, s.loss_scale_good_steps, s.loss_scale_skipped_steps);
        if (s.learning_rate && settings_.constant_learning_rate) path_set_learning_rate(*s.learning_rate);
    }
    epoch_ = s.epoch;
    step_ = s.step;
}

template <class T>
void ModelBase<T>::compile_settings_for(loss::Loss loss, const optim::Optimizer& optimizer,
                                        const std::vector<metrics::Metric>& metrics, std::int64_t output_size,
                                        bool last_is_softmax, std::int64_t last_axis) {
    settings_ = compile_settings(loss, optimizer, metrics, output_size, last_is_softmax, last_axis);
    loss_ = std::move(loss);
}

template <class T>
void ModelBase<T>::check_fit_options(int epochs, double validation_split, std::size_t sample_weights,
                                     const std::map<std::int64_t, double>& class_weight, std::int64_t output_size,
                                     std::size_t batch_size, std::int64_t steps_per_epoch, bool infinite) const {
    require_compiled("fit");
    STRATA_CHECK(epochs >= 0, ValueError, "fit: epochs must be >= 0, got ", epochs);
    STRATA_CHECK(validation_split == 0.0, ValueError, "fit: validation_split (", validation_split,
                 ") needs arrays, which can be split before shuffling; a Dataset cannot: pass validation_data "
                 "(a held-out dataset) instead");
    STRATA_CHECK(sample_weights == 0, ValueError, "fit: options.sample_weight (", sample_weights,
                 " weights) is for the array overload; a Dataset carries its own weights (Keras refuses "
                 "sample_weight with a dataset too): build it with data::from_arrays(x, shape, y, sample_weight)");
    const std::int64_t classes = output_size == 1 ? 2 : output_size;
    for (const auto& [c, w] : class_weight)
        STRATA_CHECK(c >= 0 && c < classes && std::isfinite(w) && w >= 0, ValueError, "fit: class_weight {", c, ": ", w,
                     "}: classes are 0 to ", classes - 1, " and weights finite and >= 0");
    STRATA_CHECK(batch_size > 0, ValueError,
                 "fit: the dataset is not batched; call .batch(n) on it first (Keras's fit batches arrays for you: "
                 "use the array overload with options.batch_size)");
    STRATA_CHECK(steps_per_epoch > 0 || !infinite, ValueError, "fit: the dataset repeats forever; give options.steps_per_epoch");
}

template <class T>
void ModelBase<T>::require_compiled(const char* what) const {
    STRATA_CHECK(compiled_, ValueError, what, ": the model is not compiled; call compile(loss, optimizer) first");
}

template <class T>
StepResult ModelBase<T>::result_of(const distribute::StepTotals& t) const {
    StepResult res;
    const double denom = t.examples > 0 ? double(t.examples) : 1.0;
    res.loss = t.loss_sum / denom;
    res.accuracy = t.counted > 0 ? t.correct / t.counted : 0.0;
    res.examples = t.examples;
    return res;
}

template <class T>
std::map<std::string, double> ModelBase<T>::metric_figures(metrics::Counts c, std::int64_t /*seen: the counts carry their own rows*/) {
    if (settings_.top_k > 0 || settings_.precision || settings_.recall) {  // across processes: every process's counts
        double v[5] = {double(c.in_top_k), double(c.top_k_rows), double(c.true_positives), double(c.false_positives),
                       double(c.false_negatives)};
        path_sum_over_workers(std::span<double>(v, 5));
        c.in_top_k = std::int64_t(v[0]);
        c.top_k_rows = std::int64_t(v[1]);
        c.true_positives = std::int64_t(v[2]);
        c.false_positives = std::int64_t(v[3]);
        c.false_negatives = std::int64_t(v[4]);
    }
    std::map<std::string, double> m;
    // The share of the rows counted: examples, or every token of per-token ids (which is the mean
    // over the examples of the share of their tokens, every example having as many).
    if (settings_.top_k > 0) m["sparse_top_k_categorical_accuracy"] = c.top_k_rows ? double(c.in_top_k) / double(c.top_k_rows) : 0.0;
    if (settings_.precision) m["precision"] = metrics::precision(c);
    if (settings_.recall) m["recall"] = metrics::recall(c);
    return m;
}

template <class T>
Evaluation ModelBase<T>::evaluation_of(double loss_sum, double correct, double counted, std::int64_t seen, bool per_worker_input,
                                       const metrics::Counts& counts) {
    // Across processes: every process's units computed their shares; the totals are global.
    double totals[4] = {loss_sum, correct, per_worker_input ? double(seen) : 0.0, counted};  // else every process saw every example
    path_sum_over_workers(std::span<double>(totals, 4));
    loss_sum = totals[0];
    correct = totals[1];
    counted = totals[3];
    if (per_worker_input) seen = std::int64_t(totals[2]);
    return {seen ? loss_sum / double(seen) : 0.0, counted > 0 ? correct / counted : 0.0, seen, metric_figures(counts, seen)};
}

namespace detail {
// Logs keep names by pointer (no allocation in a step): the literals of the known metrics.
inline const char* metric_log_name(const std::string& name, bool validation) {
    static constexpr const char* names[][2] = {{"sparse_top_k_categorical_accuracy", "val_sparse_top_k_categorical_accuracy"},
                                               {"precision", "val_precision"},
                                               {"recall", "val_recall"}};
    for (const auto& n : names)
        if (name == n[0]) return n[validation ? 1 : 0];
    throw_error<ValueError>("fit: no log name for metric '", name, "'");
}
}  // namespace detail

template <class T>
void ModelBase<T>::log_epoch_metrics(const metrics::Counts& counts, std::int64_t seen, Logs& logs) {
    for (const auto& [name, value] : metric_figures(counts, seen)) logs.set(detail::metric_log_name(name, false), value);
}

template <class T>
void ModelBase<T>::log_epoch_end(const Evaluation* validation, Logs& logs) {
    if (validation) {
        logs.set("val_loss", validation->loss);
        if (settings_.accuracy) logs.set("val_accuracy", validation->accuracy);
        for (const auto& [name, value] : validation->metrics) logs.set(detail::metric_log_name(name, true), value);
    }
    logs.set("lr", learning_rate());
    // A dynamic loss scale (precision::MixedFloat16): where it ends the epoch, and the steps it
    // skipped so far (History, the progress line, --json and TensorBoard take them from here).
    if (const auto ls = path_loss_scale_state()) {
        logs.set("loss_scale", ls->scale);
        logs.set("skipped_steps", double(ls->skipped_steps));
    }
}

}  // namespace strata::train
