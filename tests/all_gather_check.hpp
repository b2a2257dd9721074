#pragma once
// ProcessGroup::all_gather checked on any group (tests/test_multi_worker.cpp over the shared-
// memory and MPI transports, tests/test_hierarchical.cpp over 2 fake hosts): parts even and
// uneven, empty parts, one rank holding everything, lengths over many chunks; each rank writes
// its part of values whose bits a sum could change (−0, ±inf, NaN), the rest of its buffer
// garbage, and must end with every part bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include <strata/distribute/collective/process_group.hpp>

namespace strata_test {

inline double all_gather_value(std::int64_t i) {
    switch (i % 5) {
        case 0: return -0.0;
        case 1: return std::numeric_limits<double>::infinity();
        case 2: return -std::numeric_limits<double>::infinity();
        case 3: return std::nan("");
        default: return 1.0 / double(i + 3);
    }
}

// Whether d and f hold all_gather_value(i) (in double and in float) bit for bit at every i.
inline bool holds_all_gather_values(const std::vector<double>& d, const std::vector<float>& f) {
    bool same = d.size() == f.size();
    for (std::size_t i = 0; same && i < d.size(); ++i) {
        const double want = all_gather_value(std::int64_t(i));
        const float wantf = float(want);
        same = std::memcmp(&d[i], &want, sizeof want) == 0 && std::memcmp(&f[i], &wantf, sizeof wantf) == 0;
    }
    return same;
}

// The part layouts tried on a group of n ranks.
inline std::vector<std::vector<std::int64_t>> all_gather_layouts(int n) {
    std::vector<std::vector<std::int64_t>> out;
    for (const std::int64_t len : {0, 1, 5, 1000, 100003}) {  // as even as possible, the first ones one larger
        auto c = std::vector<std::int64_t>(static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q) c[std::size_t(q)] = len / n + (q < len % n ? 1 : 0);
        out.push_back(c);
    }
    auto last = std::vector<std::int64_t>(static_cast<std::size_t>(n), 0), uneven = last;
    last[std::size_t(n - 1)] = 777;  // one rank holds everything
    for (int q = 0; q < n; ++q) uneven[std::size_t(q)] = q == 0 ? 0 : 300 * q + 1;  // rank 0's part empty
    out.push_back(last);
    out.push_back(uneven);
    return out;
}

inline void check_all_gather(strata::distribute::collective::ProcessGroup& pg, int lane) {
    const int n = pg.size(), me = pg.rank();
    for (const auto& counts : all_gather_layouts(n)) {
        std::int64_t len = 0, first = 0;
        for (int q = 0; q < n; ++q) {
            if (q == me) first = len;
            len += counts[std::size_t(q)];
        }
        CAPTURE(len);
        CAPTURE(counts[0]);
        auto d = std::vector<double>(static_cast<std::size_t>(len), 12345.0);
        auto f = std::vector<float>(static_cast<std::size_t>(len), 12345.0f);
        for (std::int64_t i = first; i < first + counts[std::size_t(me)]; ++i) {
            d[std::size_t(i)] = all_gather_value(i);
            f[std::size_t(i)] = float(all_gather_value(i));
        }
        pg.all_gather(lane, std::span<double>(d), std::span<const std::int64_t>(counts));
        pg.all_gather(lane, std::span<float>(f), std::span<const std::int64_t>(counts));
        CHECK(holds_all_gather_values(d, f));
    }
}

}  // namespace strata_test
