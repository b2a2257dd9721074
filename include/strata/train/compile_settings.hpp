#pragma once
/// \file strata/train/compile_settings.hpp
/// What `Model::compile` decides from its arguments — which metrics to count, what the loss
/// reads (probabilities or logits), whether softmax is fused into the loss, how accuracy is
/// counted — computed without the network: the network enters only through its output size and
/// whether its last activation is a softmax. Written once, outside the Model template (and, with
/// the compiled part, compiled once in the library).

#include <cstdint>
#include <string>
#include <vector>

#include "strata/config.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/metrics/metric.hpp"
#include "strata/optim/optimizers.hpp"

namespace strata::train {

/// The settings of a compiled model.
struct CompileSettings {
    bool accuracy = false;                 ///< count accuracy ("accuracy" and its Keras aliases)
    int top_k = 0;                         ///< sparse_top_k_categorical_accuracy's k; 0: off
    bool precision = false, recall = false;
    loss::Input input_kind = loss::Input::Probabilities;  ///< what the loss reads
    bool fused_softmax = false;            ///< the last softmax is skipped: the loss takes logits
    metrics::AccuracyKind accuracy_kind = metrics::AccuracyKind::SparseCategorical;
    bool constant_learning_rate = true;    ///< the optimizer's rate is a constant (no schedule)
};

/// Checks `metrics` against `loss` and the network's output (`output_size` values, `last_axis`
/// of them on its last axis, -1: all of them; the last activation a softmax or not) and returns
/// the settings; a ValueError names an unknown metric or one the loss or the output cannot give
/// (top-k needs class ids; precision and recall one binary output per example or per token).
/// "accuracy" is chosen as Keras chooses it: sparse for class ids, binary when the last axis
/// holds one value, categorical otherwise.
STRATA_DECL CompileSettings compile_settings(const loss::Loss& loss, const optim::Optimizer& optimizer,
                                             const std::vector<metrics::Metric>& metrics, std::int64_t output_size,
                                             bool last_is_softmax, std::int64_t last_axis = -1);

/// The metrics a compiled model counts, as text ("accuracy (sparse_categorical),
/// sparse_top_k_categorical_accuracy(k=5), precision, recall"; "none"): what the processes of a
/// job compare at compile, since each rank's counts enter one sum over the job.
STRATA_DECL std::string describe_metrics(const CompileSettings& s);

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/compile_settings.ipp"
#endif
