// tools/strata_train --strategy pipeline | hybrid, for one model (-DSTRATA_TRAIN_MODEL=NAME; see
// strata_train_model.hpp): the model cut into 2 or more stages (at most one per layer)
// balanced by FLOPs (distribute/pipeline.hpp), GPipe or 1F1B over --micro-batches; hybrid runs
// --replicas copies of that pipeline. The stage count and the schedule are chosen at run time
// (split::AnyBalanced, AnySchedule), so this translation unit compiles one model for all of
// them, beside the others (see strata_train.hpp). Under mpirun (or srun) with
// --replicas × --stages processes, one job: rank q runs stage q % P of replica q / P, and rank 0
// reports (distribute/pipeline_mpi.hpp).
//
//   build/tools/strata_train --strategy pipeline --stages 2 --micro-batches 4 --schedule 1f1b
//   build/tools/strata_train --strategy hybrid --replicas 2 --stages 2 --micro-batches 4
//   mpirun -np 2 build/tools/strata_train --strategy pipeline --stages 2 --micro-batches 4
//   mpirun -np 4 build/tools/strata_train --strategy hybrid --replicas 2 --stages 2
#include "strata_train_model.hpp"
#include "strata_train_pipeline.hpp"

#include <strata/distribute/launcher.hpp>
#ifdef STRATA_TRAIN_HAVE_MPI
#include <strata/distribute/pipeline_mpi.hpp>  // one stage per process under mpirun / srun
#endif

namespace strata_train {

template <class M>
Report train_pipeline(const Job& job, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    using Strategy = PipelineStrategy;
    const Flags& f = job.flags;
    sd::PipelineOptions o = pipeline_options(f);
#ifdef STRATA_TRAIN_HAVE_MPI
    if (sd::launch_info().size > 1) o.processes = sd::pipeline_processes();  // the Pipeline checks the count
#endif
    Strategy s(o);
    // The driver printed the layer table; the split follows it.
    if (s.is_chief()) std::printf("%s", s.split_summary<typename M::Net>().c_str());
    replicas_in_sync = s.num_replicas_in_sync();
    if constexpr (has_sync_net<M>())
        if (f.sync_bn) return train<typename M::SyncNet>(s, job);  // --sync-batch-norm on (hybrid)
    return train<typename M::Net>(s, job);
}
template Report train_pipeline<Model>(const Job&, int&);

}  // namespace strata_train
