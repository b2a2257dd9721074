#pragma once
/// \file strata/train/model_state.hpp
/// `ModelState`: everything a checkpoint holds of a model, in a form that does not depend on the
/// model's type (its network, strategy or element type). A Model hands its state out as one
/// and takes one back; the checkpoint code (strata/train/checkpoint.hpp) turns it into a file
/// and back. So the checkpoint reader and writer are compiled once, and only in the programs
/// that save or load, not once per Model<Net, Strategy, T> (see docs/design.md, "A thin Model").
///
/// Values travel as double: every float converts to double and back exactly, so a float
/// model's checkpoint holds the very bits it trained with.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::train {

/// One parameter tensor a model expects in a checkpoint: its name, its shape and where its
/// values go in the model's flat parameter buffer.
struct CheckpointTensor {
    std::string name;               ///< "conv2d/kernel"
    std::vector<std::size_t> dims;  ///< row-major extents, e.g. {3, 3, 1, 8}
    std::int64_t offset = 0;        ///< first element in the flat buffer
};

/// A model's layout and (when `has_values`) its values: what save writes and load reads.
struct ModelState {
    // ---- the layout: what the model is -------------------------------------------------------
    std::vector<CheckpointTensor> params;  ///< the parameters (names, shapes, offsets)
    std::int64_t num_params = 0;           ///< size of the flat parameter buffer
    bool f64 = false;                      ///< element type: F64 tensors when true, F32 else
    std::string optimizer;                 ///< "" = not compiled (no optimizer state)
    std::vector<std::string> slot_names;   ///< the compiled optimizer's slots ("m", "v", ...)

    // ---- the values: where it is -------------------------------------------------------------
    bool has_values = false;  ///< false: a layout alone (what load checks a file against)
    std::vector<double> weights;  ///< num_params values, layer after layer
    /// One flat buffer per slot of slot_names, in that order; empty when the file held none.
    std::vector<std::vector<double>> slots;
    std::optional<std::int64_t> optimizer_iterations;
    /// A dynamic loss scale's state (precision::MixedFloat16): scale, applied steps since it
    /// last changed, steps skipped in all.
    std::optional<double> loss_scale;
    std::int64_t loss_scale_good_steps = 0, loss_scale_skipped_steps = 0;
    std::optional<double> learning_rate;
    int epoch = 0;               ///< epochs trained
    std::uint64_t step = 0;      ///< training steps taken (the dropout/step counter)
    std::optional<std::uint64_t> seed;
};

}  // namespace strata::train
