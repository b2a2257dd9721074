#pragma once
// The Pipeline strategy strata_train builds from its flags (--stages, --micro-batches,
// --schedule, --replicas under hybrid, --threads, --timeout-ms, --scatter-gather): one place
// for the pipeline's unit (strata_train_pipeline.cpp) and pipeline × tensor's
// (strata_train_tensor_parallel.cpp).
#include "strata_train.hpp"

#include <strata/distribute/pipeline.hpp>

namespace strata_train {

/// The stage count and the schedule are chosen at run time (split::AnyBalanced, AnySchedule), so
/// one instantiation serves them all.
using PipelineStrategy = strata::distribute::Pipeline<strata::place::Host, strata::distribute::AnySchedule,
                                                      strata::distribute::split::AnyBalanced<strata::distribute::split::ByFlops>>;

inline strata::distribute::PipelineOptions pipeline_options(const Flags& f) {
    namespace sd = strata::distribute;
    return {.micro_batches = f.micro_batches,
            .replicas = f.strategy == "hybrid" ? f.replicas : 1,
            .cores_per_stage = f.threads,
            .timeout = std::chrono::milliseconds(f.timeout_ms),
            .schedule = f.schedule == "1f1b" ? sd::ScheduleKind::OneFOneB : sd::ScheduleKind::GPipe,
            .stages = f.stages,
            .scatter_gather = f.scatter_gather != "off"};
}

}  // namespace strata_train
