#pragma once
/// \file strata/distribute/multi_worker_mirrored.hpp
/// `MultiWorkerMirrored<Place, Sync>`: synchronous data parallelism over the processes of an
/// MPI job, each with R local replicas (tf.distribute.MultiWorkerMirroredStrategy). Not part of
/// the umbrella header: it needs MPI (<mpi.h>, link with MPI; Meson: dependency('mpi',
/// language: 'cpp')).
///
/// \code
///   // mpirun -np 2 ./train        (every process runs the same program)
///   #include <strata/strata.hpp>
///   #include <strata/distribute/multi_worker_mirrored.hpp>
///   strata::distribute::MultiWorkerMirrored<> strategy(/*local replicas=*/1);
///   strata::Model<Net, strata::distribute::MultiWorkerMirrored<>> model(strategy, /*seed=*/42);
///   model.compile(...);
///   model.fit(train.batch(128), {.epochs = 3});   // 128 = the global batch over all processes
/// \endcode
///
/// - The cluster is the MPI job (MPI_COMM_WORLD, or MultiWorkerOptions::comm): no host lists.
///   MPI is initialized on first use if the program has not done it (and finalized at exit).
/// - num_replicas_in_sync = processes × local replicas. Every process runs the same input
///   pipeline and keeps its replicas' slices of each global batch, so N processes × R replicas
///   train exactly as one device on the same global batches. With WorkerInput::PerWorker each
///   process reads its own input instead (e.g. `train.shard(workers, index)`); workers whose
///   input runs out join the remaining steps with zero gradients (no hang), and the loss is
///   divided by the examples that exist.
/// - Gradients: a hierarchical all-reduce per bucket, overlapping backward as in Mirrored —
///   each local replica sums its slice of the process's replicas' gradients, the slices cross
///   processes in parallel (collective::ProcessGroup: shared memory on one host, MPI across
///   hosts), and the replicas gather them back.
/// - Only the chief (rank 0) prints progress and writes files (Model::save, ModelCheckpoint,
///   BackupAndRestore, TensorBoard); every rank restores. evaluate() is distributed (the
///   figures are global on every rank); predict() gathers every example's output on every rank.
/// - Every wait across processes has a deadline (StrategyOptions::timeout): a rank that stalls
///   makes the others throw DistributedError naming it; a rank that throws makes the others
///   fail at once, naming it; a stall warning names late ranks at half the timeout.
/// - Place: host memory, or place::Cuda in files nvcc compiles: then each process takes local
///   replicas' worth of GPUs (or logical GPUs) after those of the processes before it on its
///   host, and the slices cross processes through NCCL (collective/nccl_process.hpp; rank 0's
///   ncclGetUniqueId is broadcast over the process group, then ncclCommInitRank per lane) where
///   every process's replicas have GPUs of their own, or through pinned host memory and the
///   process group (collective/host_staged.hpp) where processes share a GPU or NCCL is not
///   found (MultiWorkerOptions::device_transport).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "strata/fwd.hpp"
#include "strata/config.hpp"
#include "strata/distribute/collective/host_staged.hpp"
#include "strata/distribute/collective/nccl_process.hpp"
#include "strata/distribute/collective/process_group.hpp"
#include "strata/distribute/path/mirrored.hpp"
#include "strata/distribute/settings.hpp"
#include "strata/distribute/strategy.hpp"

namespace strata::distribute {

/// Where each worker's input comes from.
enum class WorkerInput {
    Replicated,  ///< every process reads the same global batches and keeps its replicas' slices
    PerWorker,   ///< every process reads its own batches (its shard); uneven counts join with zeros
};

/// How MultiWorkerMirrored<place::Cuda> sums GPU gradients across processes.
enum class DeviceTransport {
    Auto,         ///< NCCL where it is compiled and no two processes' replicas share a GPU; else HostStaging
    Nccl,         ///< NCCL (collective/nccl_process.hpp): one GPU per process and lane
    HostStaging,  ///< pinned host memory and the process group (collective/host_staged.hpp): any layout
};
[[nodiscard]] constexpr std::string_view to_string(DeviceTransport t) noexcept {
    return t == DeviceTransport::Nccl ? "nccl" : t == DeviceTransport::HostStaging ? "host_staging" : "auto";
}

/// Options of MultiWorkerMirrored beyond StrategyOptions.
struct MultiWorkerOptions {
    /// How the processes exchange gradients (Auto: shared memory on one host, MPI across hosts).
    collective::Transport transport = collective::Transport::Auto;
    /// When a waiting rank names the late ones on stderr; 0 = half of StrategyOptions::timeout.
    std::chrono::milliseconds stall_warning{0};
    WorkerInput input = WorkerInput::Replicated;
    /// Staging bytes per replica of the shared-memory transport.
    /// 512 KiB measured best here (benchmarks/bench_mpi_allreduce --chunk-kb, docs/benchmarks.md):
    /// a chunk and its partner stay in the cores' L2 between staging and reading.
    std::size_t chunk_bytes = std::size_t(512) << 10;
    /// The processes that train together.
    MPI_Comm comm = MPI_COMM_WORLD;
    /// GPUs (place::Cuda) only: how the gradients cross processes. Auto takes NCCL where it can
    /// (compiled, and each GPU in one process's lane only: NCCL refuses a communicator that holds
    /// a GPU twice), and stages through pinned host memory otherwise, e.g. for 2 processes on
    /// the 2 logical GPUs of one GPU. Every process must choose the same (compared at the join).
    DeviceTransport device_transport = DeviceTransport::Auto;
    /// The program's own settings that every process must share (the flags that change the
    /// result: batch size, seed, output files, ...), as (name, value) text. They are checked
    /// with the strategy's own when the processes join, before anything else crosses processes:
    /// a difference is a ValueError on every process naming the setting and who has what.
    collective::Settings settings{};
};

namespace detail {
// Host cores per replica: this host's cores shared by every replica of every process on it.
STRATA_MPI_DECL StrategyOptions multi_worker_cores(int local_replicas, StrategyOptions o, int processes_on_host);
STRATA_MPI_DECL std::string_view to_string(WorkerInput i);
// Which GPU, if any, holds the same lane (local replica) of two processes of `pg`, whose replicas
// here run on `devices` (each its physical_index): "GPU 0 of host 0 holds replica 0 of 2
// processes", or "" when none does. Counted over the whole job (every rank calls it, and gets the
// same answer): a GPU twice in a lane's NCCL communicator is what NCCL refuses.
STRATA_MPI_DECL std::string gpu_held_twice(collective::ProcessGroup& pg, const std::vector<place::LogicalDevice>& devices);
// The process group, joined before the replica threads start (a base class listed first):
// the ranks agree on their settings before anything else happens across processes.
struct JoinedProcessGroup {
    STRATA_MPI_DECL JoinedProcessGroup(int local_replicas, const StrategyOptions& o, const MultiWorkerOptions& mw);
    STRATA_MPI_DECL static collective::ProcessGroupOptions group_options(const StrategyOptions& o, const MultiWorkerOptions& mw);
    collective::ProcessGroup pg_;
};
}  // namespace detail

template <class P, class Sync>
class MultiWorkerMirrored : private detail::JoinedProcessGroup, public ReplicaRuntime<P> {
    static_assert(place::Place<P>, "strata::distribute::MultiWorkerMirrored<Place, Sync>: Place must be strata::place::Host or strata::place::Cuda");
    static_assert(sync::SyncMode<Sync>, "strata::distribute::MultiWorkerMirrored<Place, Sync>: Sync must be a sync mode (strata::sync::Synchronous, ...)");
    static_assert(lockstep_sync_v<Sync>,
                  "strata::distribute::MultiWorkerMirrored cannot honour this sync mode: an all-reduce needs every replica "
                  "of every worker at every step. " STRATA_VALID_COMBINATIONS);
    using Runtime = ReplicaRuntime<P>;

public:
    using place_type = P;
    using sync_mode = Sync;
    using strategy_tag = MultiWorkerMirrored;
    static constexpr const char* name = "MultiWorkerMirrored";

    /// `local_replicas` replicas in this process (the same number in every process).
    /// The processes first join (collective::ProcessGroup: every process must come within
    /// options.timeout, with the same local replicas, transport, timeout, input mode, all-reduce
    /// options and mw.settings), then each starts its replicas.
    explicit MultiWorkerMirrored(int local_replicas = 1, StrategyOptions options = {}, MultiWorkerOptions mw = {})
        : detail::JoinedProcessGroup(local_replicas, options, with_place(mw)),
          Runtime(local_replicas, detail::multi_worker_cores(local_replicas, options, pg_.local_size()), "MultiWorkerMirrored",
                  false, "/job:worker/task:" + std::to_string(pg_.rank()), local_replicas * pg_.local_rank()),
          mw_(mw) {
        // Every process must have the same number of local replicas: the process group checks it.
        collective::OuterStage stage;
        stage.self = &pg_;
        stage.sum_float = &sum_across<float>;
        stage.sum_double = &sum_across<double>;
        stage.processes = pg_.size();
        this->group().set_outer_stage(stage);
        if constexpr (!place::host_accessible_v<P>) {
#if defined(STRATA_HAS_HOST_STAGED_STAGE)
            choose_device_transport(mw.device_transport);
            if (use_nccl_) {
#if defined(STRATA_HAS_NCCL_PROCESS)
                nccl_ = std::make_unique<collective::NcclProcessStage>(pg_, options.timeout);
                Runtime::run_replicas([&](int r) { nccl_->init_lane(r); });  // on each replica's GPU
#endif
            } else {
                staged_ = std::make_unique<collective::HostStagedStage>(pg_);
            }
#else
            static_assert(place::host_accessible_v<P>, "strata::distribute::MultiWorkerMirrored<place::Cuda>: GPUs across "
                                                       "processes need a unit nvcc compiles (the CUDA runtime)");
#endif
        }
        if (place::get_log_device_placement())
            place::log_placement("MultiWorkerMirrored worker " + std::to_string(pg_.rank()) + " of " + std::to_string(pg_.size()) +
                                     " (" + std::string(collective::to_string(pg_.transport())) + " transport" +
                                     (place::host_accessible_v<P> ? std::string()
                                                                  : std::string(", GPUs through ") + (use_nccl_ ? "nccl" : "host_staging")) +
                                     ", " +
                                     std::to_string(local_replicas) + " local replicas)",
                                 this->devices()[0]);
    }

    /// Replicas of all processes (processes × local replicas).
    int num_replicas_in_sync() const { return pg_.size() * this->local_replicas(); }
    /// Index of this process's first replica among all of them.
    int first_replica() const { return pg_.rank() * this->local_replicas(); }
    /// Number of worker processes, and this one's index (its MPI rank).
    int num_workers() const { return pg_.size(); }
    int worker_index() const { return pg_.rank(); }
    /// Rank 0 prints and writes files.
    bool is_chief() const { return pg_.rank() == 0 && shard_group_chief(); }  // (and shard 0 under tensor_parallel_replicas)
    bool per_worker_input() const { return mw_.input == WorkerInput::PerWorker; }
    const MultiWorkerOptions& multi_worker_options() const { return mw_; }
    collective::ProcessGroup& process_group() { return pg_; }
    /// Checks that every process passes the same settings (collective::ProcessGroup::agree):
    /// call it on every process at the same point, e.g. before training.
    void agree(const collective::Settings& settings, std::string_view what = "settings") { pg_.agree(settings, what); }

    // What the mirrored path agrees on across processes (each a ValueError on every process
    // naming who has what): the model when it is built (its summary's hash and its number of
    // parameters, and the element type), the loss, the metrics, the optimizer and its
    // hyper-parameters and the precision at compile,
    // and at every epoch's start the size of its first global batch.
    template <class Net, class T>
    void agree_model() {
        pg_.agree(detail::model_settings<Net, T>(), "the model");
    }
    void agree_global_batch(std::int64_t size) {
        pg_.agree("global batch size", size < 0 ? std::string("none (no data)") : std::to_string(size));
    }
#if defined(STRATA_HAS_NCCL_PROCESS)
    /// GPU places with NCCL chosen: the NCCL communicators across processes, one per local replica.
    collective::NcclProcessStage& device_stage() { return *nccl_; }
#endif
    /// GPU places: how the gradients cross processes (Nccl or HostStaging, never Auto; Auto on hosts).
    DeviceTransport device_transport() const {
        if constexpr (place::host_accessible_v<P>) return DeviceTransport::Auto;
        else return use_nccl_ ? DeviceTransport::Nccl : DeviceTransport::HostStaging;
    }
#if defined(STRATA_HAS_HOST_STAGED_STAGE)
    /// GPU places: sums `count` elements of device memory on lane `lane` (the replica's thread)
    /// over the processes, in place, through NCCL or the host staging (device_transport()).
    template <class T>
    void sum_device_across(int lane, T* data, std::size_t count) {
#if defined(STRATA_HAS_NCCL_PROCESS)
        if (use_nccl_) return nccl_->all_reduce(lane, data, count);
#endif
        staged_->all_reduce(lane, data, count);
    }
    /// The host staging's bytes copied between GPU and host on `lane` (0 under NCCL).
    std::int64_t staged_bytes(int lane) const { return staged_ ? staged_->staged_bytes(lane) : 0; }
#endif

    /// Runs fn(replica) on this process's replicas; a replica that throws also fails the
    /// process group, so that the other processes stop at once, naming this one.
    template <class F>
    void run_replicas(F&& fn) {
        try {
            Runtime::run_replicas(fn);
        } catch (const std::exception& e) {
            pg_.abort("worker " + std::to_string(pg_.rank()) + ": " + e.what());
            throw;
        }
    }

private:
    template <class T>
    static void sum_across(void* self, int lane, std::span<T> data, std::int64_t bucket) {
        static_cast<collective::ProcessGroup*>(self)->all_reduce(lane, data, collective::ReduceOp::Sum,
                                                                 SyncPoint{"all_reduce", "gradients", 0, 0, bucket});
    }

    // The place joins the settings the processes compare: a host rank and a GPU rank would not
    // pair up (and every GPU rank must ask for the same device transport).
    static MultiWorkerOptions with_place(MultiWorkerOptions mw) {
        mw.settings.emplace_back("place", P::name);
        if constexpr (!place::host_accessible_v<P>) mw.settings.emplace_back("device_transport", std::string(to_string(mw.device_transport)));
        return mw;
    }

#if defined(STRATA_HAS_HOST_STAGED_STAGE)
    // NCCL or the host staging, the same choice on every rank: the ranks' replicas' physical GPUs
    // per host and lane are counted over the whole job first (a GPU twice in a lane's
    // communicator is what NCCL refuses: "Duplicate GPU detected").
    void choose_device_transport(DeviceTransport want) {
        const std::string shared = detail::gpu_held_twice(pg_, this->devices());
#if defined(STRATA_HAS_NCCL_PROCESS)
        constexpr bool nccl_compiled = true;
#else
        constexpr bool nccl_compiled = false;
#endif
        if (want == DeviceTransport::Nccl) {
            STRATA_CHECK(nccl_compiled, ValueError, "MultiWorkerMirrored: device_transport Nccl, but NCCL was not found when "
                         "this unit was compiled (<nccl.h>); use DeviceTransport::HostStaging or Auto");
            STRATA_CHECK(shared.empty(), ValueError, "MultiWorkerMirrored: device_transport Nccl needs a GPU of its own for each "
                         "process's replica (NCCL refuses a communicator holding a GPU twice), but ", shared,
                         "; use DeviceTransport::HostStaging or Auto");
        }
        use_nccl_ = want == DeviceTransport::Nccl || (want == DeviceTransport::Auto && nccl_compiled && shared.empty());
    }
#endif

    using detail::JoinedProcessGroup::pg_;
    MultiWorkerOptions mw_;
    bool use_nccl_ = false;
#if defined(STRATA_HAS_NCCL_PROCESS)
    std::unique_ptr<collective::NcclProcessStage> nccl_;
#endif
#if defined(STRATA_HAS_HOST_STAGED_STAGE)
    std::unique_ptr<collective::HostStagedStage> staged_;
#endif
};

}  // namespace strata::distribute

#if STRATA_MPI_DEFINITIONS
#include "strata/distribute/impl/multi_worker_mirrored.ipp"
#endif

// Its gradient path: Mirrored's, with the policy for what crosses processes.
#include "strata/distribute/path/multi_worker_mirrored.hpp"
