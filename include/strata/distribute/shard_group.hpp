#pragma once
/// \file strata/distribute/shard_group.hpp
/// The job's tensor-parallel group: when the shards of the tensor-parallel layers
/// (distribute/tensor_parallel.hpp, tensor_parallel_attention.hpp) are the processes of an MPI
/// job rather than threads of one process, every process holds the whole model and computes
/// its own shard of each split layer, and the layers' sums over shards become sums over the
/// processes. A `ShardGroup` is what those sums run on; `distribute::tensor_parallel_processes()`
/// (tensor_parallel_mpi.hpp, which needs MPI) makes one over an MPI communicator and registers
/// it here, as the job's. No MPI here.
///
/// Registered, it is every split layer's: a layer of `Shards` shards in a job whose group has
/// another size is a ValueError naming both numbers, and the split layers run on one thread of
/// each process (one replica per process: OneDevice), because the processes' sums pair up in
/// program order. A one-process strategy's chief (the process that prints and writes files) is
/// then the group's shard 0 (ReplicaRuntime::is_chief).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace strata::distribute {

namespace detail {
/// Shard j's range [first, first + count) of a dimension of `dim` split `shards` ways: as even as
/// possible, the first ones one larger. Every tensor-parallel layer splits this way, so a
/// column-parallel layer's shard j and the row-parallel layer after it hold the same features;
/// ShardGroup::gather's parts are these too.
struct ShardPart {
    std::int64_t first, count;
};
constexpr ShardPart shard_part(std::int64_t dim, int shards, int j) {
    const std::int64_t base = dim / shards, extra = dim % shards;
    return {j * base + (j < extra ? j : extra), base + (j < extra ? 1 : 0)};
}
}  // namespace detail

/// The processes a job's tensor-parallel layers are split over (see the file comment).
class ShardGroup {
public:
    /// This process's shard (its rank in the group) and the number of shards.
    [[nodiscard]] virtual int shard() const = 0;
    [[nodiscard]] virtual int shards() const = 0;
    /// Sums `data` over the group's processes in place, the same result on every process (each
    /// element summed in one fixed order). `what` names the sum in a timeout's message; it must
    /// outlive the call (a string literal). Throws DistributedError naming a process that does
    /// not arrive within the group's deadline.
    virtual void sum(std::span<float> data, const char* what) = 0;
    virtual void sum(std::span<double> data, const char* what) = 0;
    /// All-gathers `data` over the group's processes in place: on entry process j holds part j,
    /// the counts[j] elements after parts 0 .. j − 1; on return every process holds every part,
    /// bit for bit as its owner had it (the rest of `data` on entry is ignored). Each process
    /// receives the others' parts, (N − 1)/N of the buffer for even parts, where a sum of the
    /// zero-padded parts would move twice that. `counts`: one per process, the same on every
    /// process, summing to data.size(). `what` as for sum.
    virtual void gather(std::span<float> data, std::span<const std::int64_t> counts, const char* what) = 0;
    virtual void gather(std::span<double> data, std::span<const std::int64_t> counts, const char* what) = 0;
    /// gather() with part j the elements detail::shard_part(data.size(), shards(), j): what a
    /// pipeline stage split over the group does with a message its neighbour sent in parts
    /// (PipelineOptions::scatter_gather).
    template <class T>
    void gather(std::span<T> data, const char* what) {
        auto counts = std::vector<std::int64_t>(std::size_t(shards()));
        for (int j = 0; j < shards(); ++j) counts[std::size_t(j)] = detail::shard_part(std::int64_t(data.size()), shards(), j).count;
        gather(data, std::span<const std::int64_t>(counts), what);
    }
    /// The group in words ("2 MPI processes").
    [[nodiscard]] virtual std::string describe() const = 0;
    /// How long a sum waits for a process before naming it: what a pipeline stage adds to its
    /// wait for a neighbour whose stage is split over the group (that neighbour may be waiting in
    /// a sum for a shard that left, and must name it first).
    [[nodiscard]] virtual std::chrono::milliseconds deadline() const = 0;
    /// Compares `settings` (name, value pairs) across the group's processes: a ValueError on
    /// every process naming who has what where they differ. Every ProcessGroup::agree of the
    /// job also agrees here (collective/process_group.hpp), so that the processes of one shard
    /// group, which sit in different strategy groups (the replicas of shard j, the pipeline of
    /// shard j), still start with the same model, optimizer and schedule.
    virtual void agree(const std::vector<std::pair<std::string, std::string>>& settings, std::string_view what) = 0;

protected:
    ~ShardGroup() = default;
};

namespace detail {
struct JobShardGroup {
    std::atomic<ShardGroup*> group{nullptr};
    std::mutex mutex;
    std::thread::id thread{};  // the thread that ran the first split layer on the group
};
inline JobShardGroup& job_shard_group_slot() {
    static JobShardGroup slot;  // an inline function's static: one per program
    return slot;
}
}  // namespace detail

/// Registers `g` as the job's tensor-parallel group unless one is registered; returns whether it was.
inline bool register_shard_group(ShardGroup* g) {
    ShardGroup* none = nullptr;
    auto& slot = detail::job_shard_group_slot();
    std::lock_guard lock(slot.mutex);
    if (!slot.group.compare_exchange_strong(none, g)) return false;
    slot.thread = {};
    return true;
}
/// Unregisters `g` if it is the job's group (it is going away).
inline void unregister_shard_group(ShardGroup* g) {
    auto& slot = detail::job_shard_group_slot();
    std::lock_guard lock(slot.mutex);
    ShardGroup* expected = g;
    if (slot.group.compare_exchange_strong(expected, nullptr)) slot.thread = {};
}
/// The job's tensor-parallel group, or null (the split layers' shards are threads).
inline ShardGroup* job_shard_group() { return detail::job_shard_group_slot().group.load(); }

/// Whether this process is the chief of a one-process strategy's job (it prints and writes the
/// files): always, unless the job's tensor-parallel layers are split over processes, where the
/// chief is their shard 0. (PathBase::is_chief and ReplicaRuntime::is_chief, the defaults.)
inline bool shard_group_chief() {
    const ShardGroup* g = job_shard_group();
    return !g || g->shard() == 0;
}

/// Whether the calling thread may run split layers on the job's group: the first thread that
/// asks claims it; any other is refused (false) for as long as the group is registered.
inline bool claim_shard_group_thread() {
    auto& slot = detail::job_shard_group_slot();
    std::lock_guard lock(slot.mutex);
    const auto me = std::this_thread::get_id();
    if (slot.thread == std::thread::id{}) slot.thread = me;
    return slot.thread == me;
}

}  // namespace strata::distribute
