#pragma once
/// \file strata/distribute/impl/partitioner.ipp
/// The definitions behind strata/distribute/partitioner.hpp: included by it in the header-only
/// mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <sstream>

#include "strata/distribute/partitioner.hpp"

namespace strata::distribute {

STRATA_DECL std::string describe(const Partitioner& p) {
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

STRATA_DECL void validate(const Partitioner& p) {
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
STRATA_DECL std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::span<const std::int64_t> shape) {
    if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
        throw_error<ValueError>("partitioner: the byte size of a variable of shape ", io::shape_text(shape),
                                " does not fit in 64 bits");
    return a * b;
}

}  // namespace detail

STRATA_DECL int num_shards(const Partitioner& p, std::span<const std::int64_t> shape, std::size_t element_bytes) {
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

STRATA_DECL std::vector<std::int64_t> shard_rows(std::int64_t rows, int shards) {
    STRATA_CHECK(shards >= 1, ValueError, "shard_rows: expected shards >= 1, found ", shards);
    STRATA_CHECK(rows >= shards, ValueError, "shard_rows: expected at least one row per shard (rows >= ", shards,
                 "), found ", rows, " rows");
    const std::int64_t base = rows / shards, extra = rows % shards;
    std::vector<std::int64_t> counts(std::size_t(shards), base);
    for (std::int64_t i = 0; i < extra; ++i) ++counts[std::size_t(i)];
    return counts;
}

STRATA_DECL std::vector<ShardRange> plan_shards(const Partitioner& p, const std::vector<std::vector<std::int64_t>>& shapes,
                                                const std::vector<std::int64_t>& offsets, std::size_t element_bytes, int servers) {
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
