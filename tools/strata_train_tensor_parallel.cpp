// tools/strata_train --tensor-parallel N: a transformer (a model with `tensor_parallel_shards`,
// strata_train_models.hpp) with every attention layer split by heads and every MLP
// column-then-row over N logical CPU devices, as Megatron-LM splits it
// (distribute/tensor_parallel_attention.hpp), under --strategy one_device or mirrored (data ×
// tensor parallelism: --replicas copies of the split model). In one process the shards are threads
// of this process, each inside its logical device; under a launcher of N processes (mpirun -np N,
// --strategy one_device) they are the processes, rank j shard j (distribute/tensor_parallel_mpi.hpp),
// each holding the whole model and reading the same batches; under --strategy multi_worker_mirrored
// and R·N processes, R replicas of N shards (distribute::tensor_parallel_replicas); under
// --strategy pipeline (hybrid) and P·N (R·P·N) processes, P stages of N shards each, the
// messages between stages sent in parts and gathered (--scatter-gather). A unit of its own, compiled only for the
// models in tools/meson.build's strata_train_tensor_parallel_models, so that the split forms
// cost the other models and mnist_cnn no compile time.
#include "strata_train_model.hpp"

#include <strata/distribute/tensor_parallel_attention.hpp>
#include <strata/distribute/launcher.hpp>
#ifdef STRATA_TRAIN_HAVE_MPI
#include "strata_train_pipeline.hpp"

#include <strata/distribute/multi_worker_mirrored.hpp>
#include <strata/distribute/pipeline_mpi.hpp>
#include <strata/distribute/tensor_parallel_mpi.hpp>
#endif

#include <vector>

namespace strata_train {

namespace {
// Model M's network with its attention and MLP layers split over N shards: the same variables,
// names and initial values as M::Net (so the two train alike, to the order of the sums, and
// share checkpoints); one sum over the shards in each block's forward and one in its backward.
template <class M, int N>
using SplitNet =
    typename M::template With<strata::distribute::TensorParallelMultiHeadAttention<M::heads, M::width / M::heads, 0, N>,
                              strata::distribute::TensorParallelTokenDense<M::mlp, strata::nn::GELU, N, strata::distribute::Columns>,
                              strata::distribute::TensorParallelTokenDense<M::width, strata::nn::Linear, N, strata::distribute::Rows>>::Net;

#ifdef STRATA_TRAIN_HAVE_MPI
// The report with what the split layers' sums and gathers moved through this process (the
// JSON's; with a pipeline's scatter-gather, its messages' gathers too).
Report with_traffic(Report rep, const strata::distribute::TensorParallelProcesses& shards) {
    const auto t = shards.traffic();
    rep.tensor_parallel_sums = t.sums;
    rep.tensor_parallel_bytes = t.bytes;
    rep.tensor_parallel_gathers = t.gathers;
    rep.tensor_parallel_gathered_bytes = t.gathered_bytes;
    return rep;
}
#endif

template <class M, int N>
Report train_split(const Job& job, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    namespace pd = strata::place;
    using Net = SplitNet<M, N>;
    static_assert(Net::num_params == M::Net::num_params, "the split network must hold the plain network's variables");
    const Flags& f = job.flags;
#ifdef STRATA_TRAIN_HAVE_MPI
    if (sd::launch_info().size > 1 && f.strategy == "multi_worker_mirrored") {  // check_launcher: R·N processes, --replicas 1
        auto layout = sd::tensor_parallel_replicas(N, {.timeout = std::chrono::milliseconds(f.timeout_ms)});
        sd::MultiWorkerMirrored<> s(1, {.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)},
                                    {.comm = layout->replica_comm()});
        replicas_in_sync = s.num_replicas_in_sync();
        return with_traffic(train<Net>(s, job), layout->shards());
    }
    if (sd::launch_info().size > 1 && (f.strategy == "pipeline" || f.strategy == "hybrid")) {
        // Pipeline × tensor (check_launcher: R·P·N processes): ranks s·N .. s·N + N − 1 are a
        // stage's shards, and shard j's pipeline runs over replica_comm(), shard j of every stage.
        auto layout = sd::tensor_parallel_replicas(N, {.timeout = std::chrono::milliseconds(f.timeout_ms)});
        sd::PipelineOptions o = pipeline_options(f);
        o.processes = sd::pipeline_processes(layout->replica_comm());
        PipelineStrategy s(o);
        if (s.is_chief()) std::printf("%s", s.split_summary<Net>().c_str());
        replicas_in_sync = s.num_replicas_in_sync();
        return with_traffic(train<Net>(s, job), layout->shards());
    }
    if (sd::launch_info().size > 1) {  // check_launcher: N processes, --strategy one_device
        auto shards = sd::tensor_parallel_processes(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(f.timeout_ms)});
        sd::OneDevice<> s(f.threads);
        replicas_in_sync = 1;
        return with_traffic(train<Net>(s, job), *shards);
    }
#endif
    // N logical devices of the CPU: shard j of every split layer runs inside device j.
    const auto cpu = pd::list_physical_devices(pd::DeviceKind::Cpu).front();
    pd::set_logical_device_configuration(cpu, std::vector<pd::LogicalDeviceConfiguration>(std::size_t(N)), pd::Oversubscribe::Yes);
    if (f.strategy == "one_device") {
        sd::OneDevice<> s(f.threads);
        replicas_in_sync = 1;
        return train<Net>(s, job);
    }
    const sd::StrategyOptions opts{.cores_per_replica = f.threads, .timeout = std::chrono::milliseconds(f.timeout_ms)};
    sd::Mirrored<> s(f.replicas, opts);
    replicas_in_sync = s.num_replicas_in_sync();
    return train<Net>(s, job);
}
}  // namespace

template <class M>
Report train_tensor_parallel(const Job& job, int& replicas_in_sync) {
    static_assert(M::tensor_parallel_shards == std::array<int, 2>{2, 4},
                  "strata_train_tensor_parallel.cpp compiles 2 and 4 shards: the model's tensor_parallel_shards must say so");
    // check_flags refused every other count, strategy and device.
    if (job.flags.tensor_parallel == 2) return train_split<M, 2>(job, replicas_in_sync);
    return train_split<M, 4>(job, replicas_in_sync);
}
template Report train_tensor_parallel<Model>(const Job&, int&);

}  // namespace strata_train
