#pragma once
/// \file strata/distribute/partitioner.hpp
/// Variable partitioners for the parameter-server strategy, with the names and arithmetic of
/// tf.distribute.experimental.partitioners (tensorflow/tensorflow
/// `tensorflow/python/distribute/sharded_variable.py`, which delegates to
/// `tensorflow/python/ops/partitioned_variables.py`: `min_max_variable_partitioner` and
/// `variable_axis_size_partitioner`), the "div" split of a variable into shards and the
/// round-robin placement of shards on servers (`parameter_server_strategy_v2.py`,
/// `_create_variable` and `_create_variable_round_robin`).
///
/// As in TensorFlow, only the first axis is partitioned: a shard is a run of whole rows, hence
/// one contiguous range of the variable's row-major buffer.

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/io/text.hpp"

namespace strata::distribute {

/// A fixed number of shards per variable, at most one per row
/// (tf.distribute.experimental.partitioners.FixedShardsPartitioner).
///
/// Requires: num_shards >= 1. Ensures: a variable of shape [d0, ...] gets min(num_shards, d0) shards.
/// \code
/// num_shards(FixedShards{2}, std::vector<std::int64_t>{10, 3}, 4) == 2
/// \endcode
struct FixedShards {
    int num_shards = 1;
};

/// As many shards as possible while each holds at least `min_shard_bytes`, at most `max_shards`
/// (tf.distribute.experimental.partitioners.MinSizePartitioner). TF's arithmetic:
/// max(1, min(d0, max_shards, ceil(total_bytes / min_shard_bytes))).
///
/// Requires: min_shard_bytes >= 1, max_shards >= 1, bytes_per_string >= 1. `bytes_per_string`
/// stands in for the element size of a string variable (element_bytes == string_element_bytes).
/// TF recommends MinSize{256 << 10, number_of_servers}: at least 256 KiB per shard and at most
/// one shard of each variable per server.
/// \code
/// num_shards(MinSize{4, 2}, std::vector<std::int64_t>{6, 1}, sizeof(float)) == 2
/// num_shards(MinSize{4, 10}, std::vector<std::int64_t>{6, 1}, sizeof(float)) == 6
/// \endcode
struct MinSize {
    std::size_t min_shard_bytes = 256 << 10;
    int max_shards = 1;
    std::size_t bytes_per_string = 16;
};

/// As few shards as possible while each holds at most `max_shard_bytes`; `max_shards` (0 = no
/// cap) wins over the size, and a single row is never split, so a shard may end up larger
/// (tf.distribute.experimental.partitioners.MaxSizePartitioner). TF's arithmetic:
/// rows_per_shard = max(1, floor(max_shard_bytes / row_bytes)), shards = ceil(d0 / rows_per_shard),
/// then min(shards, max_shards) when max_shards is set.
///
/// Requires: max_shard_bytes >= 1, max_shards >= 0, bytes_per_string >= 1.
/// \code
/// num_shards(MaxSize{4}, std::vector<std::int64_t>{6, 1}, sizeof(float)) == 6
/// num_shards(MaxSize{4, 2}, std::vector<std::int64_t>{6, 1}, sizeof(float)) == 2
/// num_shards(MaxSize{1024}, std::vector<std::int64_t>{6, 1}, sizeof(float)) == 1
/// \endcode
struct MaxSize {
    std::size_t max_shard_bytes = 0;
    int max_shards = 0;  // 0 = no cap
    std::size_t bytes_per_string = 16;
};

/// A variable partitioner: `std::monostate` (the default) partitions nothing, every variable is
/// one shard, as with TF's `variable_partitioner=None`.
using Partitioner = std::variant<std::monostate, FixedShards, MinSize, MaxSize>;

/// Pass as `element_bytes` for a variable of strings: MinSize and MaxSize then count
/// `bytes_per_string` per element, as TF does for dtype string. strata has no string tensors;
/// this keeps a TF configuration meaning the same thing.
inline constexpr std::size_t string_element_bytes = 0;

/// One shard of a variable: rows [row_first, row_first + row_count) of variable `variable`,
/// which are the flat elements [first, first + count) of the model's flat parameter buffer
/// (`first` includes the variable's offset), stored on server `server`.
struct ShardRange {
    int variable;
    int shard;
    std::int64_t row_first, row_count, first, count;
    int server;
    friend bool operator==(const ShardRange&, const ShardRange&) = default;
};

/// A short name with the knobs: "None", "FixedShards(2)", "MinSize(262144 B, max 1)",
/// "MaxSize(1024 B)", "MaxSize(4 B, max 2)"; a non-default bytes_per_string is appended
/// (", 32 B/string").
STRATA_DECL std::string describe(const Partitioner& p);

/// Checks the partitioner's knobs (the checks TF's constructors make, plus num_shards >= 1,
/// which TF leaves unchecked and which would give a variable no shard at all).
/// Throws ValueError naming the knob, what it must be and what it is.
STRATA_DECL void validate(const Partitioner& p);

/// The number of shards along axis 0 that `p` gives a variable of `shape` (extents, row-major)
/// whose elements take `element_bytes` bytes each (string_element_bytes for strings).
///
/// Requires: `p` valid (see validate); unless `p` is std::monostate, a shape of rank >= 1 with
/// a first extent >= 1 and no negative extent (TF's partitioners reject rank 0 too; the
/// strategy does not partition scalars, see plan_shards).
/// Ensures: 1 <= result <= shape[0] (1 for std::monostate, whatever the shape).
/// \code
/// std::vector<std::int64_t> shape{10, 3};
/// num_shards(FixedShards{2}, shape, sizeof(float)) == 2;
/// \endcode
STRATA_DECL int num_shards(const Partitioner& p, std::span<const std::int64_t> shape, std::size_t element_bytes);

/// TF's "div" split of `rows` rows into `shards` shards along axis 0: every shard gets
/// rows / shards rows and the first rows % shards shards one more.
///
/// Requires: 1 <= shards <= rows. Ensures: result.size() == shards, the counts sum to rows and
/// never increase.
/// \code
/// shard_rows(13, 5) == std::vector<std::int64_t>{3, 3, 3, 2, 2}
/// \endcode
STRATA_DECL std::vector<std::int64_t> shard_rows(std::int64_t rows, int shards);

/// Shards every variable with `p` and places the shards round-robin on `servers` servers, with
/// one counter over all shards of all variables in order, as TF's ParameterServerStrategy
/// places variables and shards on ps tasks. Variables of rank 0 are not partitioned (TF skips
/// them); with std::monostate every variable is one shard.
///
/// Requires: servers >= 1; offsets.size() == shapes.size(); offsets[i] >= 0 is variable i's
/// flat offset in the model's parameter buffer; each shape as num_shards requires.
/// Ensures: the shards of variable i are consecutive in the result, in row order, and cover its
/// elements [offsets[i], offsets[i] + size) exactly; the k-th shard overall is on server k % servers.
/// \code
/// auto plan = plan_shards(FixedShards{2}, {{5, 2}, {3}}, {0, 10}, sizeof(float), 2);
/// // {var 0, shard 0, rows [0,3), elements [0,6),  server 0}
/// // {var 0, shard 1, rows [3,5), elements [6,10), server 1}
/// // {var 1, shard 0, rows [0,2), elements [10,12), server 0}
/// // {var 1, shard 1, rows [2,3), elements [12,13), server 1}
/// \endcode
STRATA_DECL std::vector<ShardRange> plan_shards(const Partitioner& p, const std::vector<std::vector<std::int64_t>>& shapes,
                                                const std::vector<std::int64_t>& offsets, std::size_t element_bytes, int servers);

}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/partitioner.ipp"
#endif
