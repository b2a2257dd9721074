#pragma once
/// \file strata/distribute/parameter_server_stats.hpp
/// The figures a parameter server reports (ParameterServerStats, UpdateRecord): plain data, in a
/// header of their own so that code that only reads them (a report, a plot) does not compile
/// the parameter server.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace strata::distribute {

/// What a parameter server did: counts over an epoch (or since construction).
struct ParameterServerStats {
    std::int64_t updates = 0;     ///< versions applied
    std::int64_t gradients = 0;   ///< pushes applied
    std::int64_t cancelled = 0;   ///< mini-batches stopped before they finished
    std::int64_t dropped = 0;     ///< finished, but too late for their update (real clock)
    std::int64_t staleness_max = 0;
    std::int64_t staleness_sum = 0;
    /// histogram[s] = applied pushes of staleness s.
    std::vector<std::int64_t> histogram;
    /// The largest (finished mini-batches of a starting worker − the slowest's) seen at any
    /// start: the SSP gap, ≤ B under Asynchronous<B>.
    std::int64_t ssp_gap_max = 0;
    /// Clock seconds (virtual under Clock::Virtual).
    double seconds = 0;
    /// Across processes: the workers lost (killed or stalled past the deadline) under a mode
    /// that trains on without them, by index, in the order they were lost; their ranks in
    /// lost_ranks. A report that said `workers: 2` of a job that trained on one hid it.
    std::vector<int> lost_workers;
    std::vector<int> lost_ranks;
    double staleness_mean() const { return gradients ? double(staleness_sum) / double(gradients) : 0.0; }
    void add(const ParameterServerStats& o) {
        updates += o.updates;
        gradients += o.gradients;
        cancelled += o.cancelled;
        dropped += o.dropped;
        staleness_max = std::max(staleness_max, o.staleness_max);
        staleness_sum += o.staleness_sum;
        if (histogram.size() < o.histogram.size()) histogram.resize(o.histogram.size());
        for (std::size_t i = 0; i < o.histogram.size(); ++i) histogram[i] += o.histogram[i];
        ssp_gap_max = std::max(ssp_gap_max, o.ssp_gap_max);
        seconds += o.seconds;
        lost_workers.insert(lost_workers.end(), o.lost_workers.begin(), o.lost_workers.end());
        lost_ranks.insert(lost_ranks.end(), o.lost_ranks.begin(), o.lost_ranks.end());
    }
};

/// One applied update, for observers (ParameterServer's path calls them on the coordinator).
struct UpdateRecord {
    std::int64_t version = 0;  ///< the version this update produced (1 for the first)
    double time = 0;           ///< clock seconds since the path was built
    int gradients = 0;
    std::int64_t max_staleness = 0;
};

}  // namespace strata::distribute
