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
/// split layer's variable gradients are gathered after its backward (a sum of zero-padded
/// parts), which Megatron, whose ranks keep only their shard, does not need; and a column-
/// parallel layer's output is gathered, where Megatron's MLP hands the hidden columns to the
/// row-parallel layer as they are. docs/transformer.md counts the bytes.
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
    std::string describe() const override { return std::to_string(group_.size()) + " MPI process" + (group_.size() == 1 ? "" : "es"); }

    /// The group's communicator, for a program's own sums.
    collective::ProcessGroup& group() { return group_; }

    /// What the split layers' sums moved through this process since the group was made: the
    /// sums, and the bytes of the buffers summed (each the whole buffer, as the layers give it).
    struct Traffic {
        std::int64_t sums = 0, bytes = 0;
    };
    Traffic traffic() const { return traffic_; }

private:
    template <class T>
    void sum_counted(std::span<T> data, const char* what) {
        ++traffic_.sums;
        traffic_.bytes += std::int64_t(data.size_bytes());
        group_.all_reduce(0, data, collective::ReduceOp::Sum, SyncPoint{what});
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

}  // namespace strata::distribute
