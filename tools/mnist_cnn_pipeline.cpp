// tools/mnist_cnn --strategy pipeline | hybrid: the seed CNN cut into 2 to 7 stages balanced by
// FLOPs (distribute/pipeline.hpp), GPipe or 1F1B over --micro-batches; hybrid runs --replicas
// copies of that pipeline. The stage count and the schedule are chosen at run time
// (split::AnyBalanced, AnySchedule), so this translation unit compiles one model for all of
// them, beside the others (see mnist_cnn.hpp). Under mpirun (or srun) with
// --replicas × --stages processes, one job: rank q runs stage q % P of replica q / P, and rank 0
// reports (distribute/pipeline_mpi.hpp).
//
//   build/tools/mnist_cnn --strategy pipeline --stages 2 --micro-batches 4 --schedule 1f1b
//   build/tools/mnist_cnn --strategy hybrid --replicas 2 --stages 2 --micro-batches 4
//   mpirun -np 2 build/tools/mnist_cnn --strategy pipeline --stages 2 --micro-batches 4
//   mpirun -np 4 build/tools/mnist_cnn --strategy hybrid --replicas 2 --stages 2
#include "mnist_cnn.hpp"

#include <strata/distribute/launcher.hpp>
#include <strata/distribute/pipeline.hpp>
#ifdef MNIST_CNN_HAVE_MPI
#include <strata/distribute/pipeline_mpi.hpp>  // one stage per process under mpirun / srun
#endif

namespace mnist_example {

Report train_pipeline(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    using Strategy = sd::Pipeline<strata::place::Host, sd::AnySchedule, sd::split::AnyBalanced<sd::split::ByFlops>>;
    sd::PipelineOptions o{.micro_batches = f.micro_batches,
                          .replicas = f.strategy == "hybrid" ? f.replicas : 1,
                          .cores_per_stage = f.threads,
                          .timeout = std::chrono::milliseconds(f.timeout_ms),
                          .schedule = f.schedule == "1f1b" ? sd::ScheduleKind::OneFOneB : sd::ScheduleKind::GPipe,
                          .stages = f.stages};
#ifdef MNIST_CNN_HAVE_MPI
    if (sd::launch_info().size > 1) o.processes = sd::pipeline_processes();  // the Pipeline checks the count
#endif
    Strategy s(o);
    // mnist_cnn.cpp printed the layer table; the split follows it.
    if (s.is_chief()) std::printf("%s", s.split_summary<Net>().c_str());
    replicas_in_sync = s.num_replicas_in_sync();
    return train(s, f, mnist);
}

}  // namespace mnist_example
