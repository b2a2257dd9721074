#pragma once
/// \file strata/distribute/tensor_parallel_mpi.hpp
/// Tensor parallelism across the processes of an MPI job: with a `TensorParallelProcesses`
/// alive, every tensor-parallel layer (TensorParallelDense, TensorParallelTokenDense,
/// TensorParallelMultiHeadAttention) runs its shard j on rank j of the group instead of on
/// thread j of one process, as Megatron-LM runs a transformer's shards on separate GPUs
/// (Shoeybi et al. 2019, §3). Start one process per shard; every process runs the same program
/// on the same data with a one-process strategy (OneDevice), and makes the same calls.
///
/// \code
/// // mpirun -np 2 ./vit
/// namespace sd = strata::distribute;
/// auto shards = sd::tensor_parallel_processes();            // MPI_COMM_WORLD: rank j is shard j
/// sd::OneDevice<> one;                                      // one replica in each process
/// strata::Model<Net, sd::OneDevice<>> model(one, 42);      // Net's split layers: 2 shards
/// model.compile(...); model.fit(...);                       // rank 0 prints and writes files
/// \endcode
///
/// What each process computes and what crosses between them, per split layer and step:
///
/// | layer                          | forward                                   | backward                                             |
/// |--------------------------------|-------------------------------------------|------------------------------------------------------|
/// | attention (heads split)        | one sum of the partial outputs [B·S, F]   | one sum of the input-gradient parts [B·S, F]; the gradients of its heads' variables gathered |
/// | column-parallel (Dense/Token)  | the output's columns gathered [B·S, U]    | one sum of the input-gradient parts; its kernel's gradient gathered |
/// | row-parallel                   | one sum of the partial outputs [B·S, U]   | the input gradient's features gathered; its kernel's gradient gathered |
///
/// Every process keeps the whole model's variables, as on threads (the checkpoints, get_weights
/// and the optimizer's slots are OneDevice's, and every process holds the same values): so a
/// split layer's variable gradients are gathered after its backward (an all-gather of each
/// process's part, packed: ShardGroup::gather), which Megatron, whose ranks keep only their
/// shard, does not need. A column-parallel layer followed by its row-parallel pair hands it the
/// hidden columns as they are, as Megatron's MLP does; unpaired, its output is gathered.
/// docs/model_parallel.md counts the bytes.
///
/// The group is a collective::ProcessGroup on one lane: its sums have its deadline and name a
/// process that does not arrive; the ranks exchange their settings when it is made (a rank
/// started with other flags is refused on every rank), and it is the job's stop channel (a
/// signal to one rank stops every rank at the same step, strata/distribute/stop_agreement.hpp).
/// The group's shard 0 is the chief: it prints and writes the files. Needs <mpi.h>.
#include <strata/config.hpp>
#include <strata/distribute/collective/process_group.hpp>
#include <strata/distribute/shard_group.hpp>

#include <memory>
#include <span>
#include <string>

namespace strata::distribute {

/// The processes of an MPI communicator as the shards of the job's tensor-parallel layers (see
/// the file comment). Registered as the job's ShardGroup while it lives (one per job: a second
/// is a ValueError).
class TensorParallelProcesses final : public ShardGroup {
public:
    /// Joins the ranks of `comm` (collective; see collective::ProcessGroup's constructor).
    explicit TensorParallelProcesses(MPI_Comm comm = MPI_COMM_WORLD, collective::ProcessGroupOptions options = {})
        : group_((collective::mpi::ensure_initialized(), comm), 1, std::move(options)) {
        STRATA_CHECK(register_shard_group(this), ValueError,
                     "tensor_parallel_processes: the job already has a tensor-parallel group (one per job)");
    }
    ~TensorParallelProcesses() { unregister_shard_group(this); }
    TensorParallelProcesses(const TensorParallelProcesses&) = delete;
    TensorParallelProcesses& operator=(const TensorParallelProcesses&) = delete;

    int shard() const override { return group_.rank(); }
    int shards() const override { return group_.size(); }
    void sum(std::span<float> data, const char* what) override { sum_counted(data, what); }
    void sum(std::span<double> data, const char* what) override { sum_counted(data, what); }
    void gather(std::span<float> data, std::span<const std::int64_t> counts, const char* what) override {
        gather_counted(data, counts, what);
    }
    void gather(std::span<double> data, std::span<const std::int64_t> counts, const char* what) override {
        gather_counted(data, counts, what);
    }
    using ShardGroup::gather;
    std::string describe() const override { return std::to_string(group_.size()) + " MPI process" + (group_.size() == 1 ? "" : "es"); }
    std::chrono::milliseconds deadline() const override { return group_.timeout(); }
    void agree(const collective::Settings& settings, std::string_view what) override { group_.agree(settings, what); }

    /// The group's communicator, for a program's own sums.
    collective::ProcessGroup& group() { return group_; }

    /// What the split layers and the pipeline's messages handed to this process's group since it
    /// was made: the sums (all-reduces) and the bytes of the buffers summed, and the gathers
    /// (all-gathers) and the bytes of the buffers gathered, each the whole buffer as handed
    /// over. The split layers sum their partial outputs and input gradients and gather their
    /// split variables' gradients (and, unpaired, a column layer's output or a row layer's input
    /// gradient); a pipeline stage split over the group gathers each message its neighbour sent
    /// in parts (PipelineOptions::scatter_gather). Into each process a sum moves about
    /// 2 (N − 1)/N of its buffer and a gather (N − 1)/N (ProcessGroup::all_gather).
    struct Traffic {
        std::int64_t sums = 0, bytes = 0;
        std::int64_t gathers = 0, gathered_bytes = 0;
    };
    Traffic traffic() const { return traffic_; }

private:
    template <class T>
    void sum_counted(std::span<T> data, const char* what) {
        ++traffic_.sums;
        traffic_.bytes += std::int64_t(data.size_bytes());
        group_.all_reduce(0, data, collective::ReduceOp::Sum, SyncPoint{what});
    }

    template <class T>
    void gather_counted(std::span<T> data, std::span<const std::int64_t> counts, const char* what) {
        ++traffic_.gathers;
        traffic_.gathered_bytes += std::int64_t(data.size_bytes());
        group_.all_gather(0, data, counts, SyncPoint{what});
    }

    Traffic traffic_;
    collective::ProcessGroup group_;
};

/// The job's tensor-parallel group over `comm` (every rank calls it, collectively): rank j runs
/// shard j of every split layer while the returned object lives.
inline std::shared_ptr<TensorParallelProcesses> tensor_parallel_processes(MPI_Comm comm = MPI_COMM_WORLD,
                                                                          collective::ProcessGroupOptions options = {}) {
    return std::make_shared<TensorParallelProcesses>(comm, std::move(options));
}

/// Data × tensor parallelism across processes, Megatron's layout (Narayanan et al. 2021,
/// "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §2.3: the
/// tensor-parallel group on consecutive ranks, data-parallel replicas across them): the job's
/// R·N ranks as R replicas of N shards. Ranks r·N .. r·N + N − 1 hold replica r's shards (a
/// TensorParallelProcesses over them); the ranks holding the same shard j of every replica
/// ({j, N + j, 2N + j, ...}) are the replicas' communicator, which a MultiWorkerMirrored takes
/// (MultiWorkerOptions::comm) to split each global batch into R shares and to all-reduce the
/// gradients:
///
/// \code
/// // mpirun -np 4: 2 replicas × 2 shards
/// auto layout = sd::tensor_parallel_replicas(2);
/// sd::MultiWorkerMirrored<> s(1, {}, {.comm = layout->replica_comm()});   // one replica per process
/// strata::Model<Net, sd::MultiWorkerMirrored<>> model(s, 42);
/// \endcode
///
/// Every process of a replica computes the whole gradient (its split variables' gradients
/// gathered in the split layers' backward), so each shard's all-reduce over the replicas gives
/// every process the same update. A group over every rank of the job is made first: it compares
/// the ranks' settings and is the job's stop channel (neither the shards' group nor the
/// replicas' spans the job). The chief is rank 0 (replica 0's shard 0).
///
/// Pipeline × tensor: the groups of N consecutive ranks can as well be a pipeline's stages,
/// each stage's layers split over its N processes, and `replica_comm()` the pipeline's ranks
/// (shard j of every stage: a pipeline of its own, which the others mirror):
///
/// \code
/// // mpirun -np 4: 2 stages × 2 shards
/// auto layout = sd::tensor_parallel_replicas(2);
/// sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::At<2>> s({.micro_batches = 4,
///     .processes = sd::pipeline_processes(layout->replica_comm())});
/// \endcode
///
/// Every process of a stage holds the stage's whole variables and activations, and every
/// pipeline computes the same update; the stage's split layers sum over its N processes in the
/// schedule's order, the same on each. Between stages shard j's pipeline sends shard j of the
/// next stage only part j of each message, activations forward and their gradient backward,
/// and the receiving stage's N processes gather the parts among themselves
/// (PipelineOptions::scatter_gather, on by default; Megatron's scatter/gather, Narayanan et al.
/// 2021, §4.1): the link between two stages carries one copy of a message, not N. Ranks s·N .. s·N + N − 1 are stage s
/// (with the hybrid's R replicas of P stages, replica r's stage s is the group r·P + s).
class TensorParallelReplicas {
public:
    /// Collective over MPI_COMM_WORLD: every rank calls it with the same `shards`.
    TensorParallelReplicas(int shards, collective::ProcessGroupOptions options = {})
        : job_((collective::mpi::ensure_initialized(), MPI_COMM_WORLD), 1, options) {
        STRATA_CHECK(shards >= 1 && job_.size() % shards == 0, ValueError, "tensor_parallel_replicas: ", job_.size(),
                     " processes are not replicas of ", shards, " shards each (mpirun -np R·", shards, ")");
        // Every rank is known to be here (the job's group joined): the splits cannot wait forever.
        MPI_Comm_split(MPI_COMM_WORLD, job_.rank() / shards, job_.rank() % shards, &shards_comm_);
        MPI_Comm_split(MPI_COMM_WORLD, job_.rank() % shards, job_.rank() / shards, &replicas_comm_);
        options.settings = {};  // compared once, by the job's group
        shards_ = std::make_unique<TensorParallelProcesses>(shards_comm_, options);
    }
    ~TensorParallelReplicas() {
        shards_.reset();
        if (!mpi_failed()) {
            MPI_Comm_free(&shards_comm_);
            MPI_Comm_free(&replicas_comm_);
        }
    }
    TensorParallelReplicas(const TensorParallelReplicas&) = delete;
    TensorParallelReplicas& operator=(const TensorParallelReplicas&) = delete;

    /// The ranks holding this process's shard in every replica, for MultiWorkerOptions::comm (or
    /// in every stage, for pipeline_processes: see the class comment).
    MPI_Comm replica_comm() const { return replicas_comm_; }
    /// This process's replica, and the replicas' count.
    int replica() const { return job_.rank() / shards_->shards(); }
    int replicas() const { return job_.size() / shards_->shards(); }
    /// The shards' group (this process's shard: shards().shard()).
    TensorParallelProcesses& shards() { return *shards_; }

private:
    static bool mpi_failed() { return collective::mpi::job_failed().load(); }

    collective::ProcessGroup job_;
    MPI_Comm shards_comm_ = MPI_COMM_NULL, replicas_comm_ = MPI_COMM_NULL;
    std::unique_ptr<TensorParallelProcesses> shards_;
};

/// The job as replicas of `shards` shards (see TensorParallelReplicas; collective).
inline std::shared_ptr<TensorParallelReplicas> tensor_parallel_replicas(int shards, collective::ProcessGroupOptions options = {}) {
    return std::make_shared<TensorParallelReplicas>(shards, std::move(options));
}

}  // namespace strata::distribute
