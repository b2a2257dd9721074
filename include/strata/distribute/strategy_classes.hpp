#pragma once
/// \file strata/distribute/strategy_classes.hpp
/// (Included by strata/distribute/strategy.hpp, which brings the strategies' gradient paths with
/// them: include that one. The paths include this header, never strategy.hpp.)
///
/// Distribution strategies (names as in tf.distribute), as compile-time policies that are also
/// the run-time objects holding the replicas' threads and collectives:
///
/// | strategy                          | replicas                     | variables               | sync modes     |
/// |-----------------------------------|------------------------------|-------------------------|----------------|
/// | `Default`                         | 1, the calling thread        | one copy                | Synchronous    |
/// | `OneDevice<Place>`                | 1, on one device             | one copy on it          | Synchronous    |
/// | `Mirrored<Place, Sync>`           | N logical devices, 1 process | a copy per replica      | Synchronous    |
/// | `CentralStorage<Place, Sync>`     | N logical devices, 1 process | one copy, central       | Synchronous    |
///
/// `Mirrored`: each replica computes the gradient of its slice of the global batch, the
/// gradients are all-reduced (summed) and every replica applies the same update to its own copy.
/// `CentralStorage`: the gradients are reduced onto the central copy (the host, or the only
/// GPU), updated there, and every replica reads the updated variables (in one memory, "sent
/// back" is the replicas reading the central copy; nothing is duplicated).
///
/// A sync mode a strategy cannot honour does not compile; the message lists the valid
/// combinations (docs/distribution.md).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "strata/fwd.hpp"
#include "strata/distribute/collective/all_reduce.hpp"
#include "strata/distribute/replica_pool.hpp"
#include "strata/distribute/shard_group.hpp"
#include "strata/distribute/combinations.hpp"
#include "strata/distribute/slice.hpp"
#include "strata/distribute/sync.hpp"
#include "strata/place/devices.hpp"
#include "strata/place/place.hpp"
#include "strata/place/threads.hpp"

namespace strata::distribute {

using collective::Algorithm;
using collective::ReduceOp;

/// Options of the multi-replica strategies.
struct StrategyOptions {
    /// Host cores each replica's ops (and BLAS) may use; 0 = the machine's cores divided evenly.
    int cores_per_replica = 0;
    /// The all-reduce algorithm among replicas (Auto: Direct in shared memory).
    Algorithm all_reduce = Algorithm::Auto;
    /// A collective that waits longer than this throws DistributedError naming who is missing.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    /// Gradient fusion bucket size: gradients are all-reduced in buckets of about this many
    /// bytes, each as soon as the backward pass has produced it. 0 = one all-reduce after the
    /// whole backward pass.
    std::size_t bucket_bytes = std::size_t(4) << 20;
};

/// What a replica's code gets from Strategy::run: who it is, and the collectives among the
/// replicas of the step.
class ReplicaContext {
public:
    ReplicaContext(int replica, int replicas, collective::ReplicaGroup* group, const place::LogicalDevice* device)
        : replica_(replica), replicas_(replicas), group_(group), device_(device) {}
    int replica_id_in_sync_group() const { return replica_; }
    int num_replicas_in_sync() const { return replicas_; }
    const place::LogicalDevice& device() const { return *device_; }
    /// Sums (or averages) `data` over the replicas, in place on each (call from every replica).
    template <class T>
    void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::Sum, Algorithm a = Algorithm::Auto) {
        group_->all_reduce(replica_, data, op, a);
    }
    void barrier() { group_->barrier(replica_); }
    collective::ReplicaGroup& group() { return *group_; }

private:
    int replica_, replicas_;
    collective::ReplicaGroup* group_;
    const place::LogicalDevice* device_;
};

/// One value per replica (what Strategy::run returns).
template <class R>
class PerReplica {
public:
    explicit PerReplica(std::vector<R> values) : values_(std::move(values)) {}
    const R& operator[](int r) const { return values_[std::size_t(r)]; }
    int size() const { return int(values_.size()); }
    const std::vector<R>& values() const { return values_; }

private:
    std::vector<R> values_;
};

/// The most replica (or worker) threads one process may start: 16 per hardware thread, and at
/// least 64. More only wait for each other and hold a model's buffers each (1000 workers on
/// 2 cores once grew to 24 GB until the kernel killed them), so a larger count is refused.
inline int max_replica_threads() { return std::max(64, 16 * hardware_threads()); }

/// Bytes of physical memory of this machine (0 if the system does not say).
inline std::uint64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : 0;
}

namespace detail {
/// Refuses `units` replicas or workers that each hold at least `bytes_each` (`what`) when
/// together they need more than the machine's physical memory: such a run would only grow until
/// the kernel killed it.
inline void check_units_fit_memory(const char* name, const char* units_name, int units, std::uint64_t bytes_each,
                                   const char* what) {
    const std::uint64_t physical = physical_memory_bytes();
    const double need = double(units) * double(bytes_each);
    if (physical == 0 || need <= double(physical)) return;
    throw_error<ValueError>(name, ": ", units, " ", units_name, " need at least ", need / double(1 << 20), " MiB (",
                            double(bytes_each) / double(1 << 20), " MiB each: ", what, "), more than the ",
                            double(physical) / double(1 << 20), " MiB of physical memory here; use fewer ", units_name);
}
}  // namespace detail

/// The run-time part every strategy shares, and with it the strategies' user API
/// (tf.distribute.Strategy's): `run` (strategy.run), `reduce`, `num_replicas_in_sync`, the
/// replicas' devices. Each strategy (Default, OneDevice, Mirrored, CentralStorage,
/// MultiWorkerMirrored, ParameterServer) derives from it: one logical device and one thread per
/// replica, and the collective group among them.
template <class P>
class ReplicaRuntime {
public:
    /// `threads_always`: every replica gets its own thread, even a single one (a parameter
    /// server's workers run beside the coordinator on the caller's thread).
    /// `device_prefix`: put before every replica's device name (MultiWorkerMirrored's
    /// "/job:worker/task:K").
    /// `first_device`: on GPUs, the replicas take the configured devices from this index on
    /// (MultiWorkerMirrored's processes on one host each take their own).
    /// `pinned`: the one replica runs on this logical device (OneDevice given a device name).
    ReplicaRuntime(int replicas, const StrategyOptions& options, const char* name, bool threads_always = false,
                   std::string device_prefix = {}, int first_device = 0, std::optional<place::LogicalDevice> pinned = {})
        : options_(options), group_(replicas, collective::GroupOptions{options.timeout}), prefix_(std::move(device_prefix)),
          first_device_(first_device) {
        STRATA_CHECK(replicas >= 1, ValueError, name, ": the number of replicas must be >= 1, got ", replicas);
        STRATA_CHECK(replicas <= max_replica_threads(), ValueError, name, ": ", replicas, " replicas (one thread each) on ",
                     hardware_threads(), " hardware threads; at most ", max_replica_threads(),
                     " (16 per hardware thread, at least 64): more only wait for each other and each holds its own buffers");
        STRATA_CHECK(options.cores_per_replica >= 0, ValueError, name, ": cores_per_replica must be >= 0, got ",
                     options.cores_per_replica);
        if (pinned) {
            // OneDevice("/device:CPU:1"): its one replica runs inside that logical device.
            devices_ = {*pinned};
            pinned_ = true;
            place::initialize_devices(name);
            if (place::get_log_device_placement())
                place::log_placement(std::string(name) + " replica 0 (its thread and work)", devices_[0]);
            pool_ = std::make_unique<ReplicaPool>(1);
            return;
        }
        pick_devices(replicas, name);
        // A single replica with no explicit budget runs on the caller's thread and leaves the
        // caller's thread setting alone.
        if (replicas == 1 && options.cores_per_replica == 0 && !threads_always) {
            pool_ = std::make_unique<ReplicaPool>(1);
            return;
        }
        if (replicas == 1 && !threads_always) {
            // One replica runs on the caller's thread: its thread budget is restored afterwards.
            restore_threads_ = num_threads();
        }
        pool_ = std::make_unique<ReplicaPool>(replicas, [this](int r) { enter_device(r); }, threads_always);
    }
    ~ReplicaRuntime() {
        pool_.reset();  // joins the replica threads (their device scopes end with them)
        if (restore_threads_ > 0) set_num_threads(restore_threads_);
    }

    /// Number of replicas that take part in every step (tf.distribute's num_replicas_in_sync).
    int num_replicas_in_sync() const { return group_.size(); }
    /// Replicas of this process (all of them, except under MultiWorkerMirrored).
    int local_replicas() const { return group_.size(); }
    /// Index of this process's first replica among all replicas in sync.
    int first_replica() const { return 0; }
    /// Whether this process prints progress and writes files: the only one, or, where the job's
    /// tensor-parallel layers are split over processes (shard_group.hpp), their shard 0.
    bool is_chief() const { return shard_group_chief(); }
    /// The logical device of each replica.
    const std::vector<place::LogicalDevice>& devices() const { return devices_; }
    const StrategyOptions& options() const { return options_; }
    ReplicaPool& pool() { return *pool_; }
    collective::ReplicaGroup& group() { return group_; }

    /// Runs `fn(replica)` on every replica; a replica that throws aborts the collectives and the
    /// call throws DistributedError naming it (the group is reset for the next call).
    void run_replicas(FunctionRef<void(int)> fn) {
        if (pinned_) {
            // One replica on a named device: the caller's thread, inside that device for the
            // call (its memory limit applies; its errors pass through unchanged).
            place::DeviceScope scope(devices_[0]);
            fn(0);
            return;
        }
        try {
            pool_->run(fn, [this](int r) { group_.abort(r, "replica " + std::to_string(r) + " threw"); });
        } catch (...) {
            group_.reset();
            throw;
        }
    }

    /// tf.distribute's strategy.run: calls `fn(ReplicaContext&)` on every replica, in parallel,
    /// and returns what each returned. A replica that throws stops the step (DistributedError
    /// naming it); nothing waits forever.
    template <class F>
    auto run(F&& fn) {
        using R = std::invoke_result_t<F&, ReplicaContext&>;
        const int n = num_replicas_in_sync();
        if constexpr (std::is_void_v<R>) {
            run_replicas([&](int r) {
                ReplicaContext ctx(r, n, &group_, &devices_[std::size_t(r)]);
                fn(ctx);
            });
        } else {
            std::vector<std::optional<R>> out(static_cast<std::size_t>(n));
            run_replicas([&](int r) {
                ReplicaContext ctx(r, n, &group_, &devices_[std::size_t(r)]);
                out[std::size_t(r)].emplace(fn(ctx));
            });
            std::vector<R> values;
            values.reserve(std::size_t(n));
            for (auto& v : out) values.push_back(std::move(*v));
            return PerReplica<R>(std::move(values));
        }
    }

    /// Combines per-replica values on the caller (in replica order, so reproducibly).
    template <class R>
    R reduce(ReduceOp op, const PerReplica<R>& values) const {
        R total{};
        for (const auto& v : values.values()) total += v;
        if (op == ReduceOp::Mean) total = total / R(values.size());
        return total;
    }

private:
    void pick_devices(int replicas, const char* name) {
        using place::DeviceKind;
        const auto kind = std::is_same_v<P, place::Host> ? DeviceKind::Cpu : DeviceKind::Gpu;
        auto configured = place::list_logical_devices(kind);
        if (replicas > 1 && int(configured.size()) >= replicas) {
            // The user split the machine into logical devices: one replica on each.
            configured.resize(std::size_t(replicas));
            devices_ = configured;
            use_scopes_ = true;
            if (options_.cores_per_replica == 0) options_.cores_per_replica = devices_[0].cores;
        } else if (kind == DeviceKind::Cpu) {
            // No split configured: the replicas share the host's cores evenly (or as asked).
            const int cores = options_.cores_per_replica > 0
                                  ? options_.cores_per_replica
                                  : (replicas == 1 ? hardware_threads() : std::max(1, hardware_threads() / replicas));
            for (int r = 0; r < replicas; ++r) {
                place::LogicalDevice d = configured.empty() ? place::LogicalDevice{} : configured[0];
                d.name = prefix_ + (replicas == 1 ? std::string("/device:CPU:0") : "/device:CPU:0/replica:" + std::to_string(r));
                d.kind = DeviceKind::Cpu;
                d.cores = cores;
                devices_.push_back(d);
            }
            cores_ = cores;
        } else {
            if (first_device_ > 0)
                configured.erase(configured.begin(), configured.begin() + std::min<std::ptrdiff_t>(first_device_, std::ptrdiff_t(configured.size())));
            STRATA_CHECK(int(configured.size()) >= replicas, DeviceError, name, ": ", replicas,
                         " replicas need as many GPUs or logical GPUs (from number ", first_device_, " on); found ", configured.size(),
                         " (split a GPU with set_logical_device_configuration, see docs/devices.md)");
            configured.resize(std::size_t(replicas));
            devices_ = configured;
            use_scopes_ = true;
            enable_peer_access(name);
        }
        if (use_scopes_) place::initialize_devices(name);
        if (place::get_log_device_placement())
            for (int r = 0; r < replicas; ++r)
                place::log_placement(std::string(name) + " replica " + std::to_string(r) + " (its thread and work)",
                                     devices_[std::size_t(r)]);
    }

    // Replicas on distinct GPUs read each other's gradients directly (one all-reduce kernel per
    // replica), which needs peer access between every pair of their GPUs.
    void enable_peer_access([[maybe_unused]] const char* name) {
#if STRATA_HAS_CUDA
        for (const auto& a : devices_)
            for (const auto& b : devices_) {
                if (a.physical_index == b.physical_index) continue;
                int can = 0;
                cudaDeviceCanAccessPeer(&can, a.physical_index, b.physical_index);
                STRATA_CHECK(can, DeviceError, name, ": GPU ", a.physical_index, " cannot access the memory of GPU ",
                             b.physical_index, " (no peer access); replicas on such GPUs need the NCCL all-reduce, "
                             "which strata does not wire into this strategy yet (docs/distribution.md)");
                int previous = 0;
                cudaGetDevice(&previous);
                cudaSetDevice(a.physical_index);
                const auto e = cudaDeviceEnablePeerAccess(b.physical_index, 0);
                if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
                    throw_error<DeviceError>(name, ": enabling peer access from GPU ", a.physical_index, " to GPU ",
                                             b.physical_index, " failed: ", cudaGetErrorString(e));
                cudaGetLastError();  // clear "already enabled"
                cudaSetDevice(previous);
            }
#endif
    }

    void enter_device(int r) {
        if (use_scopes_) {
            // Lives as long as the replica's thread.
            thread_local std::optional<place::DeviceScope> scope;
            scope.emplace(devices_[std::size_t(r)]);
        } else {
            set_num_threads(cores_);
        }
    }

    StrategyOptions options_;
    collective::ReplicaGroup group_;
    std::unique_ptr<ReplicaPool> pool_;
    std::vector<place::LogicalDevice> devices_;
    std::string prefix_;
    int first_device_ = 0;
    int cores_ = 1;
    int restore_threads_ = 0;
    bool use_scopes_ = false;
    bool pinned_ = false;
};

#if STRATA_INSTANCES
// The host's runtime (its replicas' devices and threads) is compiled once in the compiled part.
STRATA_TEMPLATE class ReplicaRuntime<place::Host>;
#endif

/// No distribution: one replica, the calling thread, all host cores (tf's default strategy).
class Default : public ReplicaRuntime<place::Host> {
public:
    using place_type = place::Host;
    using sync_mode = sync::Synchronous;
    using strategy_tag = Default;
    static constexpr const char* name = "Default";
    Default() : ReplicaRuntime(1, StrategyOptions{}, "Default") {}
};

/// One replica on one device of place `P` (tf.distribute.OneDeviceStrategy).
template <class P>
class OneDevice : public ReplicaRuntime<P> {
    static_assert(place::Place<P>, "strata::distribute::OneDevice<Place>: Place must be strata::place::Host or strata::place::Cuda");

public:
    using place_type = P;
    using sync_mode = sync::Synchronous;
    using strategy_tag = OneDevice;
    static constexpr const char* name = "OneDevice";
    /// `cores`: host threads for the device's ops and BLAS (0 = leave the caller's setting,
    /// see strata::set_num_threads).
    explicit OneDevice(int cores = 0) : ReplicaRuntime<P>(1, StrategyOptions{.cores_per_replica = cores}, "OneDevice") {}
    /// The replica on logical device `device` ("/device:CPU:1", "/device:GPU:0"; resolved by
    /// place::find_device, soft placement included), as tf.distribute.OneDeviceStrategy(device):
    /// its variables, slots and activations come from that device's memory and count against
    /// its memory limit (a model that does not fit fails with a DeviceError naming the device,
    /// the request and the limit).
    explicit OneDevice(std::string_view device)
        : ReplicaRuntime<P>(1, StrategyOptions{}, "OneDevice", false, {}, 0, place::find_device(device)) {}
};

namespace detail {

/// The body Mirrored and CentralStorage share, written once: N replicas of one process that
/// step together, on place P under `Sync`. The two differ only in where the variables live and
/// how a step's gradients reach them, which is their gradient paths' business
/// (distribute/path/mirrored.hpp, distribute/path/central_storage.hpp); each keeps its own name
/// and its own compile-time checks, which name it.
template <class Self, class P, class Sync>
class LockstepReplicas : public ReplicaRuntime<P> {
public:
    using place_type = P;
    using sync_mode = Sync;
    using strategy_tag = Self;
    /// The strategy over every configured logical device of the place's kind (at least 1).
    static Self on_all_devices(StrategyOptions options = {}) {
        const auto kind = std::is_same_v<P, place::Host> ? place::DeviceKind::Cpu : place::DeviceKind::Gpu;
        return Self(std::max<int>(1, int(place::list_logical_devices(kind).size())), options);
    }

protected:
    LockstepReplicas(int replicas, StrategyOptions options) : ReplicaRuntime<P>(replicas, options, Self::name) {}
};

}  // namespace detail

/// Synchronous data parallelism over N replicas of one process, each with its own copy of the
/// variables; gradients are all-reduced every step (tf.distribute.MirroredStrategy).
///
/// \code
/// strata::distribute::Mirrored<> strategy(2);               // 2 logical host devices
/// strata::Model<Net, strata::distribute::Mirrored<>> model(strategy);
/// auto all = strata::distribute::Mirrored<>::on_all_devices(); // every configured logical CPU
/// \endcode
template <class P, class Sync>
class Mirrored : public detail::LockstepReplicas<Mirrored<P, Sync>, P, Sync> {
    static_assert(place::Place<P>, "strata::distribute::Mirrored<Place, Sync>: Place must be strata::place::Host or strata::place::Cuda");
    static_assert(sync::SyncMode<Sync>, "strata::distribute::Mirrored<Place, Sync>: Sync must be a sync mode (strata::sync::Synchronous, ...)");
    static_assert(lockstep_sync_v<Sync>,
                  "strata::distribute::Mirrored cannot honour this sync mode: an all-reduce needs every replica at every "
                  "step. " STRATA_VALID_COMBINATIONS);

public:
    static constexpr const char* name = "Mirrored";
    explicit Mirrored(int replicas = 2, StrategyOptions options = {})
        : detail::LockstepReplicas<Mirrored, P, Sync>(replicas, options) {}
};

/// Variables on one central device, compute replicated on N replicas; gradients are reduced
/// to the central device, applied there, and read back by every replica
/// (tf.distribute.experimental.CentralStorageStrategy).
template <class P, class Sync>
class CentralStorage : public detail::LockstepReplicas<CentralStorage<P, Sync>, P, Sync> {
    static_assert(place::Place<P>, "strata::distribute::CentralStorage<Place, Sync>: Place must be strata::place::Host or strata::place::Cuda");
    static_assert(sync::SyncMode<Sync>, "strata::distribute::CentralStorage<Place, Sync>: Sync must be a sync mode (strata::sync::Synchronous, ...)");
    static_assert(lockstep_sync_v<Sync>,
                  "strata::distribute::CentralStorage cannot honour this sync mode: its update waits for every replica's "
                  "gradient. " STRATA_VALID_COMBINATIONS);

public:
    static constexpr const char* name = "CentralStorage";
    explicit CentralStorage(int replicas = 2, StrategyOptions options = {})
        : detail::LockstepReplicas<CentralStorage, P, Sync>(replicas, options) {}
};

/// Satisfied by the strategy types.
template <class S>
concept Strategy = requires {
    typename S::strategy_tag;
    typename S::place_type;
    typename S::sync_mode;
};

}  // namespace strata::distribute
