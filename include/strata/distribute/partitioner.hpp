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
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

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
inline std::string describe(const Partitioner& p) {
    std::ostringstream os;
    auto strings = [&](std::size_t b) {
        if (b != 16) os << ", " << b << " B/string";
    };
    std::visit(
        [&](const auto& q) {
            using Q = std::decay_t<decltype(q)>;
            if constexpr (std::is_same_v<Q, std::monostate>) {
                os << "None";
            } else if constexpr (std::is_same_v<Q, FixedShards>) {
                os << "FixedShards(" << q.num_shards << ")";
            } else if constexpr (std::is_same_v<Q, MinSize>) {
                os << "MinSize(" << q.min_shard_bytes << " B, max " << q.max_shards;
                strings(q.bytes_per_string);
                os << ")";
            } else {
                os << "MaxSize(" << q.max_shard_bytes << " B";
                if (q.max_shards != 0) os << ", max " << q.max_shards;
                strings(q.bytes_per_string);
                os << ")";
            }
        },
        p);
    return os.str();
}

/// Checks the partitioner's knobs (the checks TF's constructors make, plus num_shards >= 1,
/// which TF leaves unchecked and which would give a variable no shard at all).
/// Throws ValueError naming the knob, what it must be and what it is.
inline void validate(const Partitioner& p) {
    std::visit(
        [](const auto& q) {
            using Q = std::decay_t<decltype(q)>;
            if constexpr (std::is_same_v<Q, FixedShards>) {
                STRATA_CHECK(q.num_shards >= 1, ValueError, "FixedShards: num_shards must be >= 1, found ", q.num_shards);
            } else if constexpr (std::is_same_v<Q, MinSize>) {
                STRATA_CHECK(q.min_shard_bytes >= 1, ValueError, "MinSize: min_shard_bytes must be >= 1, found ",
                             q.min_shard_bytes);
                STRATA_CHECK(q.max_shards >= 1, ValueError, "MinSize: max_shards must be >= 1, found ", q.max_shards);
                STRATA_CHECK(q.bytes_per_string >= 1, ValueError, "MinSize: bytes_per_string must be >= 1, found ",
                             q.bytes_per_string);
            } else if constexpr (std::is_same_v<Q, MaxSize>) {
                STRATA_CHECK(q.max_shard_bytes >= 1, ValueError, "MaxSize: max_shard_bytes must be >= 1, found ",
                             q.max_shard_bytes);
                STRATA_CHECK(q.max_shards >= 0, ValueError, "MaxSize: max_shards must be >= 1, or 0 for no cap, found ",
                             q.max_shards);
                STRATA_CHECK(q.bytes_per_string >= 1, ValueError, "MaxSize: bytes_per_string must be >= 1, found ",
                             q.bytes_per_string);
            }
        },
        p);
}

namespace detail {

// Byte counts are products of user-given extents: an overflow must be an error, not a wrong plan.
inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::span<const std::int64_t> shape) {
    if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
        throw_error<ValueError>("partitioner: the byte size of a variable of shape ", io::shape_text(shape),
                                " does not fit in 64 bits");
    return a * b;
}

}  // namespace detail

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
inline int num_shards(const Partitioner& p, std::span<const std::int64_t> shape, std::size_t element_bytes) {
    if (std::holds_alternative<std::monostate>(p)) return 1;
    validate(p);
    STRATA_CHECK(!shape.empty(), ValueError, "num_shards: ", describe(p),
                 " partitions along axis 0 and needs a shape of rank >= 1, found a scalar (rank 0)");
    for (auto d : shape)
        STRATA_CHECK(d >= 0, ValueError, "num_shards: expected extents >= 0, found shape ", io::shape_text(shape));
    const std::int64_t rows = shape[0];
    STRATA_CHECK(rows >= 1, ValueError, "num_shards: ", describe(p), " needs a first extent >= 1, found shape ",
                 io::shape_text(shape));
    std::uint64_t row_elements = 1;
    for (std::size_t i = 1; i < shape.size(); ++i) row_elements = detail::checked_mul(row_elements, std::uint64_t(shape[i]), shape);

    std::int64_t shards = 1;
    std::visit(
        [&](const auto& q) {
            using Q = std::decay_t<decltype(q)>;
            if constexpr (std::is_same_v<Q, FixedShards>) {
                shards = std::min<std::int64_t>(q.num_shards, rows);
            } else if constexpr (std::is_same_v<Q, MinSize>) {
                const std::uint64_t eb = element_bytes == string_element_bytes ? q.bytes_per_string : element_bytes;
                const std::uint64_t total =
                    detail::checked_mul(detail::checked_mul(row_elements, std::uint64_t(rows), shape), eb, shape);
                // ceil(total / min): TF rounds up, so the last shards may hold less than the minimum.
                const std::uint64_t wanted = total / q.min_shard_bytes + (total % q.min_shard_bytes != 0);
                shards = std::max<std::int64_t>(
                    1, std::int64_t(std::min<std::uint64_t>({std::uint64_t(rows), std::uint64_t(q.max_shards), wanted})));
            } else if constexpr (std::is_same_v<Q, MaxSize>) {
                const std::uint64_t eb = element_bytes == string_element_bytes ? q.bytes_per_string : element_bytes;
                const std::uint64_t row_bytes = detail::checked_mul(row_elements, eb, shape);
                // A row of zero bytes fits anywhere: one shard (TF divides by zero here).
                const std::uint64_t rows_per_shard =
                    row_bytes == 0 ? std::uint64_t(rows) : std::max<std::uint64_t>(1, q.max_shard_bytes / row_bytes);
                std::uint64_t n = (std::uint64_t(rows) + rows_per_shard - 1) / rows_per_shard;
                if (q.max_shards > 0) n = std::min<std::uint64_t>(n, std::uint64_t(q.max_shards));
                STRATA_CHECK(n <= std::uint64_t(INT_MAX), ValueError, "num_shards: ", describe(p), " gives ", n,
                             " shards for shape ", io::shape_text(shape), ", more than an int counts; set max_shards");
                shards = std::int64_t(n);
            }
        },
        p);
    return int(shards);
}

/// TF's "div" split of `rows` rows into `shards` shards along axis 0: every shard gets
/// rows / shards rows and the first rows % shards shards one more.
///
/// Requires: 1 <= shards <= rows. Ensures: result.size() == shards, the counts sum to rows and
/// never increase.
/// \code
/// shard_rows(13, 5) == std::vector<std::int64_t>{3, 3, 3, 2, 2}
/// \endcode
inline std::vector<std::int64_t> shard_rows(std::int64_t rows, int shards) {
    STRATA_CHECK(shards >= 1, ValueError, "shard_rows: expected shards >= 1, found ", shards);
    STRATA_CHECK(rows >= shards, ValueError, "shard_rows: expected at least one row per shard (rows >= ", shards,
                 "), found ", rows, " rows");
    const std::int64_t base = rows / shards, extra = rows % shards;
    std::vector<std::int64_t> counts(std::size_t(shards), base);
    for (std::int64_t i = 0; i < extra; ++i) ++counts[std::size_t(i)];
    return counts;
}

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
inline std::vector<ShardRange> plan_shards(const Partitioner& p, const std::vector<std::vector<std::int64_t>>& shapes,
                                           const std::vector<std::int64_t>& offsets, std::size_t element_bytes,
                                           int servers) {
    STRATA_CHECK(servers >= 1, ValueError, "plan_shards: expected servers >= 1, found ", servers);
    STRATA_CHECK(offsets.size() == shapes.size(), ValueError, "plan_shards: expected one offset per variable (",
                 shapes.size(), "), found ", offsets.size());
    STRATA_CHECK(shapes.size() <= std::size_t(INT_MAX), ValueError, "plan_shards: ", shapes.size(),
                 " variables, more than an int counts");
    validate(p);
    std::vector<ShardRange> plan;
    std::int64_t placed = 0;  // TF's _variable_count
    for (std::size_t i = 0; i < shapes.size(); ++i) {
        const auto& shape = shapes[i];
        const int v = int(i);
        STRATA_CHECK(offsets[i] >= 0, ValueError, "plan_shards: variable ", i, ": expected an offset >= 0, found ",
                     offsets[i]);
        std::uint64_t elements = 1;
        for (auto d : shape) {
            STRATA_CHECK(d >= 0, ValueError, "plan_shards: variable ", i, ": expected extents >= 0, found shape ",
                         io::shape_text(shape));
            elements = detail::checked_mul(elements, std::uint64_t(d), shape);
        }
        STRATA_CHECK(elements <= std::uint64_t(INT64_MAX), ValueError, "plan_shards: variable ", i, ": shape ",
                     io::shape_text(shape), " has more elements than an int64 counts");
        const auto size = std::int64_t(elements);
        auto place = [&] { return int(placed++ % servers); };
        if (shape.empty() || std::holds_alternative<std::monostate>(p)) {
            plan.push_back({v, 0, 0, shape.empty() ? 1 : shape[0], offsets[i], size, place()});
            continue;
        }
        int k;
        try {
            k = num_shards(p, shape, element_bytes);
        } catch (const ValueError& e) {
            throw_error<ValueError>("plan_shards: variable ", i, ": ", e.what());
        }
        const std::int64_t row_elements = size / shape[0];
        std::int64_t row = 0;
        const auto counts = shard_rows(shape[0], k);
        for (int s = 0; s < k; ++s) {
            const std::int64_t n = counts[std::size_t(s)];
            plan.push_back({v, s, row, n, offsets[i] + row * row_elements, n * row_elements, place()});
            row += n;
        }
    }
    return plan;
}

}  // namespace strata::distribute
