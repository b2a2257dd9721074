#pragma once
/// \file strata/distribute/impl/multi_worker_mirrored.ipp
/// The non-template definitions behind strata/distribute/multi_worker_mirrored.hpp (the process
/// group MultiWorkerMirrored joins, its options, the cores per replica): included by it in the
/// header-only mode, compiled once in src/strata_mpi.cpp under STRATA_SEPARATE_COMPILATION_MPI.

#include "strata/distribute/multi_worker_mirrored.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <string_view>

namespace strata::distribute::detail {

STRATA_MPI_DECL StrategyOptions multi_worker_cores(int local_replicas, StrategyOptions o, int processes_on_host) {
    if (o.cores_per_replica == 0 && local_replicas >= 1)
        o.cores_per_replica = std::max(1, hardware_threads() / (local_replicas * processes_on_host));
    return o;
}
STRATA_MPI_DECL std::string_view to_string(WorkerInput i) { return i == WorkerInput::PerWorker ? "per_worker" : "replicated"; }

STRATA_MPI_DECL std::string gpu_held_twice(collective::ProcessGroup& pg, const std::vector<place::LogicalDevice>& devices) {
    constexpr std::size_t max_gpus = 64;
    const std::size_t lanes = devices.size(), host = std::size_t(pg.host_index());
    std::vector<std::int64_t> use(std::size_t(pg.num_hosts()) * lanes * max_gpus, 0);
    for (std::size_t r = 0; r < lanes; ++r) {
        const int g = devices[r].physical_index;
        if (g >= 0 && std::size_t(g) < max_gpus) use[(host * lanes + r) * max_gpus + std::size_t(g)] = 1;
    }
    pg.all_reduce_counts(0, std::span<std::int64_t>(use), SyncPoint{"all_reduce", "the GPUs of every lane"});
    for (std::size_t i = 0; i < use.size(); ++i)
        if (use[i] > 1)
            return "GPU " + std::to_string(i % max_gpus) + " of host " + std::to_string(i / max_gpus / lanes) + " holds replica " +
                   std::to_string(i / max_gpus % lanes) + " of " + std::to_string(use[i]) + " processes";
    return {};
}

STRATA_MPI_DECL JoinedProcessGroup::JoinedProcessGroup(int local_replicas, const StrategyOptions& o, const MultiWorkerOptions& mw)
    : pg_(mw.comm, local_replicas, group_options(o, mw)) {}

STRATA_MPI_DECL collective::ProcessGroupOptions JoinedProcessGroup::group_options(const StrategyOptions& o, const MultiWorkerOptions& mw) {
    collective::ProcessGroupOptions p{o.timeout, mw.stall_warning, mw.transport, mw.chunk_bytes, {}};
    p.settings = {{"strategy", "MultiWorkerMirrored"},
                  {"input", std::string(to_string(mw.input))},
                  {"all_reduce", std::string(collective::to_string(o.all_reduce))},
                  {"bucket_bytes", std::to_string(o.bucket_bytes)}};
    for (const auto& s : mw.settings) p.settings.push_back(s);
    return p;
}

}  // namespace strata::distribute::detail
