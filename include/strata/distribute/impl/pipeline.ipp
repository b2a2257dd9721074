#pragma once
/// \file strata/distribute/impl/pipeline.ipp
/// The definitions behind strata/distribute/pipeline.hpp's detail::PipelineRuntime: included by
/// it in the header-only mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/distribute/pipeline_strategy.hpp"

namespace strata::distribute::detail {

STRATA_DECL PipelineRuntime::PipelineRuntime(PipelineOptions options, int stages, bool host,
                                             std::optional<ScheduleKind> type_schedule, const char* type_name)
    : options_(std::move(options)), stages_(stages), host_(host) {
    const char* who = "Pipeline";
    const PipelineOptions& o = options_;
    STRATA_CHECK(o.micro_batches >= 1, ValueError, who, ": micro_batches must be >= 1, got ", o.micro_batches);
    STRATA_CHECK(o.replicas >= 1, ValueError, who, ": replicas must be >= 1, got ", o.replicas);
    STRATA_CHECK(o.cores_per_stage >= 0, ValueError, who, ": cores_per_stage must be >= 0, got ", o.cores_per_stage);
    STRATA_CHECK(o.timeout.count() > 0, ValueError, who, ": the timeout must be > 0 ms, got ", o.timeout.count());
    if (stages_ == 0) {  // a split chosen at run time
        STRATA_CHECK(o.stages >= 1, ValueError, who, "<AnyBalanced>: PipelineOptions::stages must name the number of stages (>= 1), got ",
                     o.stages);
        stages_ = o.stages;
    } else {
        STRATA_CHECK(o.stages == 0 || o.stages == stages_, ValueError, who, ": PipelineOptions::stages is ", o.stages,
                     " but the type's split has ", stages_, " stages; leave it 0 or use split::AnyBalanced");
    }
    if (!type_schedule) {
        STRATA_CHECK(o.schedule.has_value(), ValueError, who,
                     "<AnySchedule>: PipelineOptions::schedule must name the schedule (ScheduleKind::GPipe or ScheduleKind::OneFOneB)");
        one_f_one_b_ = *o.schedule == ScheduleKind::OneFOneB;
    } else {
        one_f_one_b_ = *type_schedule == ScheduleKind::OneFOneB;
        STRATA_CHECK(!o.schedule || *o.schedule == *type_schedule, ValueError, who, "<", type_name,
                     ">: PipelineOptions::schedule names the other schedule (", one_f_one_b_ ? "GPipe" : "1F1B",
                     "); leave it empty or use AnySchedule");
    }
    const int procs = launched_processes();
    const int threads = o.replicas * stages_;
    if (o.processes) {
        // One stage per process: rank q runs stage q % P of replica q / P.
        STRATA_CHECK(host_, ValueError, who, ": stages across processes run on the host only");
        collective::Settings mine{{"strategy", "Pipeline"},
                                  {"schedule", schedule_name()},
                                  {"stages", std::to_string(stages_)},
                                  {"replicas", std::to_string(o.replicas)},
                                  {"micro_batches", std::to_string(o.micro_batches)},
                                  {"scatter_gather", o.scatter_gather ? "on" : "off"}};
        for (const auto& kv : o.settings) mine.push_back(kv);
        o.processes->join(stages_, o.replicas, o.timeout, mine);
        // Compared when joining, among this pipeline's ranks; agreed once more through the
        // groups' agree, which also compares them across the shards of a tensor-parallel group
        // (pipeline × tensor: every shard runs a pipeline of its own, and their schedules must
        // match for the split layers' sums to pair up).
        if (job_shard_group()) o.processes->agree(mine, "the pipeline's settings");
        rank_ = o.processes->rank();
        if (ShardGroup* g = job_shard_group(); g && g->shards() > 1 && o.scatter_gather) {
            // A shard sends its part of a message to the same shard of the neighbouring stage,
            // and gathers the other parts from its own group: so the processes of a group must
            // run one stage (of one replica), and every rank of this pipeline must be the same
            // shard. Megatron's layout (tensor_parallel_replicas) is that; another is refused on
            // every rank rather than gathering the wrong parts.
            g->agree({{"pipeline stage", "stage " + std::to_string(rank_ % stages_) + " of replica " + std::to_string(rank_ / stages_)}},
                     "the stage of each process of a tensor-parallel group (pipeline × tensor with scatter_gather: a stage's "
                     "processes must be one tensor-parallel group, as tensor_parallel_replicas lays them out)");
            std::vector<double> shard{double(g->shard()), double(g->shard()) * g->shard()};
            o.processes->sum_all(std::span<double>(shard));
            STRATA_CHECK(shard[1] * double(o.processes->size()) == shard[0] * shard[0], ValueError, who,
                         " × tensor with PipelineOptions::scatter_gather: the ranks of a pipeline must hold the same shard of "
                         "their stages' tensor-parallel groups (each shard's pipeline over tensor_parallel_replicas(",
                         g->shards(), ").replica_comm()), but this pipeline's ranks hold different shards");
            scatter_gather_ = true;
        }
        cores_ = o.cores_per_stage > 0 ? o.cores_per_stage : std::max(1, hardware_threads() / threads);
        for (int t = 0; t < threads; ++t) devices_.push_back(process_device(t));
        pool_ = std::make_unique<ReplicaPool>(1, [this](int) { set_num_threads(cores_); }, /*always_threads=*/true);
        return;
    }
    STRATA_CHECK(procs == 1, ValueError, who, ": this process is one of ", procs,
                 " launched together (mpirun/srun), but this Pipeline runs all its stages in one process: they would "
                 "train ", procs, " separate copies. For one stage per process give it PipelineOptions::processes = "
                 "pipeline_processes() (strata/distribute/pipeline_mpi.hpp) and launch replicas × stages = ", threads,
                 " processes (docs/model_parallel.md)");
    STRATA_CHECK(threads <= 16 * std::max(4, hardware_threads()), ValueError, who, ": ", o.replicas, " replicas × ", stages_,
                 " stages = ", threads, " threads, too many for ", hardware_threads(), " hardware threads");
    pick_devices(threads);
    for (int s = 0; s < stages_; ++s)
        groups_.push_back(std::make_unique<collective::ReplicaGroup>(o.replicas, collective::GroupOptions{o.timeout}));
    // A stage reaches the step's end while its neighbours may still be busy with their last
    // micro-batches: it waits the timeout times the stages, as a neighbour's message does.
    for (int r = 0; r < o.replicas; ++r)
        pipelines_.push_back(std::make_unique<collective::ReplicaGroup>(stages_, collective::GroupOptions{o.timeout * stages_}));
    pool_ = std::make_unique<ReplicaPool>(threads, [this](int t) { enter_device(t); }, /*always_threads=*/true);
}

STRATA_DECL void PipelineRuntime::run_stages(FunctionRef<void(int, int)> fn, FunctionRef<void(int, int)> on_failure) {
    const int S = stages_;
    const int first = across_processes() ? rank_ : 0;  // across processes: this process's stage only
    pool_->run([&](int t) { fn((first + t) / S, (first + t) % S); }, [&](int t) { on_failure((first + t) / S, (first + t) % S); });
}

STRATA_DECL void PipelineRuntime::pick_devices(int threads) {
    using place::DeviceKind;
    const auto kind = host_ ? DeviceKind::Cpu : DeviceKind::Gpu;
    auto configured = place::list_logical_devices(kind);
    if (int(configured.size()) >= threads && (threads > 1 || kind == DeviceKind::Gpu || configured[0].memory_limit > 0)) {
        configured.resize(std::size_t(threads));
        devices_ = configured;
        scoped_ = true;
        place::initialize_devices("Pipeline");
    } else {
        STRATA_CHECK(kind == DeviceKind::Cpu, DeviceError, "Pipeline: ", options_.replicas, " replicas × ", stages_, " stages need ",
                     threads, " GPUs or logical GPUs; found ", configured.size(),
                     " (split a GPU with set_logical_device_configuration, see docs/devices.md)");
        cores_ = options_.cores_per_stage > 0 ? options_.cores_per_stage : std::max(1, hardware_threads() / threads);
        for (int t = 0; t < threads; ++t) {
            place::LogicalDevice d = configured.empty() ? place::LogicalDevice{} : configured[0];
            d.name = "/device:CPU:0/" + (options_.replicas > 1 ? "replica:" + std::to_string(t / stages_) + "/" : std::string()) +
                     "stage:" + std::to_string(t % stages_);
            d.kind = DeviceKind::Cpu;
            d.cores = cores_;
            d.memory_limit = 0;
            devices_.push_back(d);
        }
    }
}

// Stage t's device across processes: its rank's host.
STRATA_DECL place::LogicalDevice PipelineRuntime::process_device(int t) const {
    place::LogicalDevice d;
    d.name = "/task:" + std::to_string(t) + "/device:CPU:0";
    d.kind = place::DeviceKind::Cpu;
    d.cores = cores_;
    return d;
}

STRATA_DECL void PipelineRuntime::enter_device(int t) {
    if (scoped_) {
        thread_local std::optional<place::DeviceScope> scope;  // lives as long as the stage's thread
        scope.emplace(devices_[std::size_t(t)]);
        if (options_.cores_per_stage > 0) set_num_threads(options_.cores_per_stage);
    } else {
        set_num_threads(cores_);
    }
}

STRATA_DECL void log_pipeline_placement(PipelineRuntime& strategy, int units, std::span<const std::size_t> bounds,
                                        const std::vector<std::string>& layer_names, const std::vector<nn::ParamInfo>& params,
                                        std::span<const std::int64_t> offsets) {
    const int stages = int(bounds.size()) - 1;
    auto stage_of_layer = [&](std::size_t l) {
        int s = 0;
        while (s + 1 < stages && bounds[std::size_t(s + 1)] <= l) ++s;
        return s;
    };
    for (int r = 0; r < units; ++r)
        for (int s = 0; s < stages; ++s) {
            if (!strategy.runs(r, s)) continue;
            std::string what = std::string(strategy.schedule_name()) + " pipeline stage " + std::to_string(s) +
                               (units > 1 ? " of replica " + std::to_string(r) : std::string()) + " (layers";
            for (std::size_t l = bounds[std::size_t(s)]; l < bounds[std::size_t(s) + 1]; ++l) what += " " + layer_names[l];
            place::log_placement(what + "; its thread and work)", strategy.device(r, s));
        }
    const std::size_t layers = layer_names.size();
    for (const auto& p : params) {
        std::size_t layer = 0;
        while (layer + 1 < layers && offsets[layer + 1] <= p.offset) ++layer;
        const int s = stage_of_layer(layer);
        for (int r = 0; r < units; ++r)
            if (strategy.runs(r, s))
                place::log_placement("variable " + p.name + " " + p.shape.str() + " (stage " + std::to_string(s) +
                                         (units > 1 ? ", copy " + std::to_string(r) : std::string()) + ")",
                                     strategy.device(r, s));
    }
}

STRATA_DECL std::string pipeline_stage_failure(PipelineRuntime& strategy, int units, int r, int s,
                                               std::span<const std::size_t> bounds, const std::vector<std::string>& layer_names,
                                               const std::exception& e) {
    if (strategy.across_processes() && std::string_view(e.what()).starts_with("Pipeline: ")) return e.what();
    std::string layers;
    for (std::size_t l = bounds[std::size_t(s)]; l < bounds[std::size_t(s) + 1]; ++l)
        layers += (layers.empty() ? "" : ", ") + layer_names[l];
    return "Pipeline: stage " + std::to_string(s) + " (" + layers + ")" +
           (units > 1 ? " of replica " + std::to_string(r) : std::string()) + " on " +
           (strategy.across_processes() ? "rank " + std::to_string(strategy.job_rank()) : strategy.device(r, s).name) +
           " failed: " + e.what();
}

STRATA_DECL std::string pipeline_split_table(std::span<const std::size_t> bounds, const std::vector<std::string>& layer_names,
                                             std::span<const double> params, std::span<const double> flops, const char* split_name,
                                             const char* schedule_name) {
    const std::size_t S = bounds.size() - 1;
    std::string out = "Pipeline: " + std::to_string(S) + " stages (" + split_name + " split), " + schedule_name +
                      " schedule; stage s runs on logical device r*P + s of replica r\n";
    char line[200];
    std::snprintf(line, sizeof line, "%-6s %-40s %14s %16s\n", "Stage", "Layers", "Params", "MFLOPs/example");
    out += line;
    for (std::size_t s = 0; s < S; ++s) {
        std::string layers;
        double p = 0, f = 0;
        for (std::size_t l = bounds[s]; l < bounds[s + 1]; ++l) {
            layers += (layers.empty() ? "" : ", ") + layer_names[l];
            p += params[l];
            f += flops[l];
        }
        if (layers.size() > 40) layers = layers.substr(0, 37) + "...";
        std::snprintf(line, sizeof line, "%-6zu %-40s %14.0f %16.3f\n", s, layers.c_str(), p, f / 1e6);
        out += line;
    }
    return out;
}

}  // namespace strata::distribute::detail
