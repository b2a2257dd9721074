#pragma once
/// \file strata/train/checkpoint.hpp
/// The strict reader of strata checkpoints: it validates a whole checkpoint against what a model
/// expects before the model changes anything, so that a load either succeeds completely or
/// leaves the model as it was.
///
/// A strata checkpoint is a safetensors file (see strata/io/safetensors.hpp) written by
/// `Model::save`:
///
/// | what                         | where in the file                                               |
/// |------------------------------|-----------------------------------------------------------------|
/// | each parameter               | tensor named as Net::parameters() names it: `conv2d/kernel`     |
/// | each optimizer slot          | tensor `optimizer/<slot>/<parameter>`: `optimizer/m/dense/bias` |
/// | format, format_version       | metadata `format` = `strata-checkpoint`, `format_version` = `1` |
/// | training position            | metadata `epoch`, `step`, `seed` (decimal integers)             |
/// | optimizer                    | metadata `optimizer` (`Adam`), `optimizer_iterations`           |
/// | dynamic loss scale (float16) | metadata `loss_scale`, `loss_scale_good_steps`, `loss_scale_skipped_steps` |
/// | learning rate (optional)     | metadata `learning_rate` (a decimal number)                     |
///
/// Tensors are F32 or F64 whatever the model's element type: values are converted on reading.

///
/// This header declares; the definitions are in strata/train/impl/checkpoint.ipp, included
/// below in the header-only mode (the default) and compiled once in the library under
/// STRATA_SEPARATE_COMPILATION (strata/config.hpp).

#include <concepts>
#include <limits>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/model_state.hpp"

namespace strata::train {

/// What a model expects of a checkpoint (see read_checkpoint).
///
/// Requires: the params tile [0, num_params) of the flat buffer (each lies inside it, their
/// element counts sum to num_params) and have distinct names; read_checkpoint throws ValueError
/// otherwise (a bug in the caller, not in the file).
///
/// \code
///   strata::train::CheckpointSpec spec{
///       .params = {{"dense/kernel", {784, 10}, 0}, {"dense/bias", {10}, 7840}},
///       .num_params = 7850,
///       .optimizer = "Adam",
///       .slots = {"m", "v"}};
/// \endcode
struct CheckpointSpec {
    std::vector<CheckpointTensor> params;  ///< the model's parameters (names, shapes, offsets)
    std::int64_t num_params = 0;           ///< size of the flat parameter buffer
    std::string optimizer;                 ///< "" = model not compiled: optimizer tensors and metadata are not read
    std::vector<std::string> slots;        ///< the compiled optimizer's slot names ("m", "v", "momentum", ...)
    /// false = like PyTorch's `strict=False`: tensors the model does not know, and the state of
    /// another optimizer (or of none), are tolerated; the optimizer slots are then left out.
    bool strict = true;
    int format_version = 1;  ///< the only `format_version` accepted
};

/// What read_checkpoint returns: everything the model needs, already validated and converted.
template <class T>
struct CheckpointData {
    std::vector<T> params;                                      ///< num_params values, in the spec's layout
    std::vector<std::pair<std::string, std::vector<T>>> slots;  ///< one per spec slot, in spec order; empty when not read
    std::optional<std::int64_t> optimizer_iterations;           ///< when the optimizer state was read and holds it
    std::optional<double> loss_scale;                           ///< metadata `loss_scale` (with the optimizer state)
    std::int64_t loss_scale_good_steps = 0;                     ///< metadata `loss_scale_good_steps`
    std::int64_t loss_scale_skipped_steps = 0;                  ///< metadata `loss_scale_skipped_steps`
    int epoch = 0;                                              ///< metadata `epoch` (0 when absent)
    std::uint64_t step = 0;                                     ///< metadata `step` (0 when absent)
    std::optional<std::uint64_t> seed;                          ///< metadata `seed`
    std::optional<double> learning_rate;                        ///< metadata `learning_rate` if present
};

/// Parses metadata `key`'s value `text` as a strict decimal integer in [min, max]: digits only,
/// with a leading '-' only where min < 0; no '+', whitespace, exponent, fraction or trailing
/// characters; no overflow.
///
/// Throws CheckpointError naming the key, the text and the accepted range:
/// `metadata 'epoch': expected a decimal integer in [0, 2147483647] (...), found '7x'`.
///
/// \code
///   int epoch = int(parse_metadata_int("epoch", "12", 0, std::numeric_limits<int>::max()));   // 12
///   parse_metadata_int("epoch", "-1", 0, 100);   // throws: no sign where the range is unsigned
/// \endcode
STRATA_DECL std::int64_t parse_metadata_int(std::string_view key, std::string_view text, std::int64_t min, std::int64_t max);

/// parse_metadata_int for unsigned 64-bit values (seeds, step counts), range [0, max].
STRATA_DECL std::uint64_t parse_metadata_uint(std::string_view key, std::string_view text,
                                              std::uint64_t max = std::numeric_limits<std::uint64_t>::max());

/// Reads and validates a whole strata checkpoint against `spec`; nothing is returned (so
/// nothing can be applied) unless every check below passes.
///
/// Requires: `spec` consistent (see CheckpointSpec; ValueError otherwise).
/// Ensures: `params` holds every spec parameter at its offset, converted from the file's F32 or
///   F64; when the model is compiled (`spec.optimizer` non-empty) and the checkpoint holds the
///   state of the same optimizer with every slot, `slots` has one entry per spec slot (in spec
///   order) and `optimizer_iterations` the saved count; otherwise both are empty (only when
///   `spec.strict` is false: strict refuses).
/// Throws: IoError when the file cannot be read; CheckpointError, naming the file and what was
///   expected and found, when
///   - it is not a valid safetensors file, or not a strata checkpoint, or of another format_version;
///   - a parameter or slot tensor is missing (all missing ones named, a few then "and N more"),
///     has another shape (both shapes), or a dtype other than F32/F64;
///   - strict, and the checkpoint holds tensors the model does not know (named likewise), or the
///     state of another optimizer ("the checkpoint holds Adam state; the model is compiled with
///     RMSprop"), or none while the model is compiled;
///   - metadata `format_version`, `epoch`, `step`, `seed`, `optimizer_iterations` or
///     `learning_rate` is not a number in range (see parse_metadata_int).
///
/// \code
///   auto data = strata::train::read_checkpoint<float>("model.safetensors", spec);
///   // only now change the model: set_weights(data.params), the slots, epoch = data.epoch, ...
/// \endcode
template <std::floating_point T>
CheckpointData<T> read_checkpoint(const std::filesystem::path& path, const CheckpointSpec& spec);

/// The format version write_checkpoint writes and read_model_state reads.
inline constexpr int checkpoint_format_version = 1;

/// Writes `state` (which must hold values) as a strata checkpoint to `path`, atomically: the
/// parameters as `state.params` names them, each optimizer slot as `optimizer/<slot>/<parameter>`,
/// F32 or F64 as the model computes; metadata format, format_version, epoch, step, seed,
/// optimizer, optimizer_iterations, learning_rate, and `extra` (the state's own keys win).
/// Compiled once, whatever the model: Model::save and the checkpointing callbacks call it.
STRATA_DECL void write_checkpoint(const std::filesystem::path& path, const ModelState& state,
                                  const std::map<std::string, std::string>& extra = {});

/// Reads and validates the checkpoint at `path` against a model's `layout` (its parameters and
/// compiled optimizer; values ignored) as read_checkpoint does (`strict` as there), and returns
/// the state it holds, ready for the model to take: nothing is returned, so nothing can be
/// applied, unless the whole file is valid.
STRATA_DECL ModelState read_model_state(const std::filesystem::path& path, const ModelState& layout, bool strict = true);

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/checkpoint.ipp"
#endif

// After the definitions, which src/strata.cpp instantiates (strata/config.hpp).
#if STRATA_INSTANCES
namespace strata::train {
// Compiled once in the library: the model's two element types.
STRATA_TEMPLATE CheckpointData<float> read_checkpoint<float>(const std::filesystem::path&, const CheckpointSpec&);
STRATA_TEMPLATE CheckpointData<double> read_checkpoint<double>(const std::filesystem::path&, const CheckpointSpec&);
}  // namespace strata::train
#endif
