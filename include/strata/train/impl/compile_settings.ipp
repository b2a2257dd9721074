#pragma once
/// \file strata/train/impl/compile_settings.ipp
/// The definitions behind strata/train/compile_settings.hpp: included by it in the header-only
/// mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/train/compile_settings.hpp"

namespace strata::train {

STRATA_DECL CompileSettings compile_settings(const loss::Loss& loss, const optim::Optimizer& optimizer,
                                             const std::vector<metrics::Metric>& metrics, std::int64_t output_size,
                                             bool last_is_softmax, std::int64_t last_axis) {
    CompileSettings s;
    if (last_axis < 0) last_axis = output_size;
    for (const auto& m : metrics) {
        const auto& n = m.name;
        if (n == "accuracy" || n == "acc" || n == "sparse_categorical_accuracy" || n == "categorical_accuracy") {
            s.accuracy = true;
        } else if (n == "sparse_top_k_categorical_accuracy") {
            STRATA_CHECK(std::holds_alternative<loss::SparseCategoricalCrossentropy>(loss), ValueError,
                         "compile: sparse_top_k_categorical_accuracy needs class ids, i.e. SparseCategoricalCrossentropy; "
                         "the loss is ", loss::name(loss));
            STRATA_CHECK(m.k >= 1, ValueError, "compile: sparse_top_k_categorical_accuracy: k must be >= 1, got ", m.k);
            s.top_k = m.k;
        } else if (n == "precision" || n == "recall") {
            STRATA_CHECK(last_axis == 1, ValueError, "compile: ", n, " is for one binary output per example or per token "
                         "(probability > 0.5 is positive; an output [1] or [..., 1]); the model has ", output_size,
                         " outputs, ", last_axis, " on the last axis");
            (n == "precision" ? s.precision : s.recall) = true;
        } else {
            throw_error<ValueError>("compile: unknown metric '", n, "' (known: accuracy, sparse_categorical_accuracy, "
                                    "categorical_accuracy, sparse_top_k_categorical_accuracy, precision, recall)");
        }
    }
    s.input_kind = loss::input_kind(loss, last_is_softmax);
    s.fused_softmax = s.input_kind == loss::Input::Logits && last_is_softmax;
    if (std::holds_alternative<loss::SparseCategoricalCrossentropy>(loss)) s.accuracy_kind = metrics::AccuracyKind::SparseCategorical;
    else if (last_axis == 1) s.accuracy_kind = metrics::AccuracyKind::Binary;
    else s.accuracy_kind = metrics::AccuracyKind::Categorical;
    s.constant_learning_rate = std::visit([](const auto& o) { return o.learning_rate.is_constant(); }, optimizer);
    return s;
}

STRATA_DECL std::string describe_metrics(const CompileSettings& s) {
    std::string out;
    auto add = [&](const std::string& m) { out += (out.empty() ? "" : ", ") + m; };
    if (s.accuracy) {
        add(s.accuracy_kind == metrics::AccuracyKind::SparseCategorical ? "accuracy (sparse_categorical)"
            : s.accuracy_kind == metrics::AccuracyKind::Categorical     ? "accuracy (categorical)"
                                                                        : "accuracy (binary)");
    }
    if (s.top_k > 0) add("sparse_top_k_categorical_accuracy(k=" + std::to_string(s.top_k) + ")");
    if (s.precision) add("precision");
    if (s.recall) add("recall");
    return out.empty() ? "none" : out;
}

}  // namespace strata::train
