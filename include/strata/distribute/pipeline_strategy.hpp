#pragma once
/// \file strata/distribute/pipeline_strategy.hpp
/// (Included by strata/distribute/pipeline.hpp, which brings the strategy's gradient path with it:
/// include that one.)
///
/// Model parallelism by pipeline: `Pipeline<Place, Schedule, Split>` cuts a Sequential into
/// consecutive stages, each on its own logical device and thread; every global batch is cut
/// into micro-batches that flow through the stages, so that the stages work at once on
/// different micro-batches (GPipe: Huang et al. 2019, "GPipe: Efficient Training of Giant
/// Neural Networks using Pipeline Parallelism"; 1F1B: Narayanan et al. 2019, "PipeDream:
/// Generalized Pipeline Parallelism for DNN Training", in its synchronous form of
/// Narayanan et al. 2021, PipeDream-Flush). With `PipelineOptions::replicas = R > 1` it is the
/// hybrid: R copies of the pipeline share each global batch as Mirrored's replicas do, and each
/// stage's gradients are all-reduced among its R copies.
///
/// \code
/// namespace sd = strata::distribute;
/// using Strategy = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::Balanced<3, sd::split::ByFlops>>;
/// Strategy pipeline({.micro_batches = 8});
/// strata::Model<Net, Strategy> model(pipeline, 42);   // trains exactly as OneDevice would
/// \endcode
///
/// - **Stages.** `split::At<3, 5>` starts stage 1 at layer 3 and stage 2 at layer 5 (layer
///   indices of the Sequential, Input not counted); `split::Balanced<P, Cost>` lets a constexpr
///   partitioner choose the P stages that minimise the largest stage's cost: its parameter
///   count (`split::ByParams`, what a stage's memory holds for good) or its FLOPs per example
///   (`split::ByFlops`, what a stage's time goes to). Either way the split is part of the type,
///   checked at compile time and printed by `Model::summary()`. `split::AnyBalanced<Cost>`
///   takes P at run time (`PipelineOptions::stages`) and runs the same partitioner then: a
///   program offering several stage counts compiles one model. The stages' code does not
///   depend on the split (each runs its range of the model's one compiled network), so every
///   split of a model shares it.
/// - **Micro-batches.** A replica's share of n examples is cut into m = min(M, n) micro-batches
///   of sizes that differ by at most one (the first n mod m take one more): M need not divide
///   the batch. Each micro-batch's loss is scaled by 1 / the global batch, so the gradients
///   accumulated over the micro-batches are the global batch's: the update is OneDevice's.
/// - **Schedules.** `GPipe`: all forwards, then all backwards; a stage holds the activations of
///   all m micro-batches. `OneFOneB`: after P - s - 1 warm-up forwards, stage s alternates one
///   forward and one backward; it holds at most P - s micro-batches' activations. Both have the
///   bubble (P - 1) / (m + P - 1); backwards run in micro-batch order in both, so both give the
///   same bits.
/// - **Places.** With at least R·P logical devices of the place's kind configured
///   (place::set_logical_device_configuration), stage s of replica r runs on device r·P + s,
///   inside its scope: its variables, optimizer slots and activations count against that
///   device's memory limit. Otherwise (host only) the stages share the host's cores evenly.
/// - **Between stages** activations go forward and their gradients back as copies from one
///   stage's buffers into the next one's (copy_between places), with a deadline
///   (`PipelineOptions::timeout`); a stage that throws stops the step with a DistributedError
///   naming the stage, its layers and its device, and nothing waits forever.
///
/// - **Across processes** (`PipelineOptions::processes = pipeline_processes()`, from
///   strata/distribute/pipeline_mpi.hpp; mpirun -np R·P): rank q runs stage q % P of replica
///   q / P and holds only that stage's variables, gradients and optimizer slots. Activations go
///   forward and their gradients back as MPI point-to-point messages (collective::Mailbox:
///   non-blocking, every wait with the deadline); the hybrid sums each stage's gradients over
///   its R copies on a sub-communicator (collective::ProcessGroup); the loss and the metrics of
///   the last stages are summed over every rank, so fit returns the same History everywhere;
///   get_weights, save and evaluate gather. The schedule and the micro-batches are the same as
///   in one process, so is the arithmetic. Without `processes`, a multi-process launch is
///   refused (it would train N separate copies).

#include <array>
#include <chrono>
#include <optional>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/distribute/collective/all_reduce.hpp"
#include "strata/distribute/replica_pool.hpp"
#include "strata/distribute/settings.hpp"
#include "strata/distribute/shard_group.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/nn/sequential.hpp"
#include "strata/place/devices.hpp"

namespace strata::distribute {

/// Pipeline schedule: every micro-batch's forward through all stages, then every backward
/// (Huang et al. 2019). Activation memory per stage: all m micro-batches.
struct GPipe {
    static constexpr const char* name = "GPipe";
    static constexpr bool one_f_one_b = false;
};
/// Pipeline schedule: one forward, one backward (Narayanan et al. 2019/2021, PipeDream-Flush):
/// stage s of P holds at most P - s micro-batches' activations, whatever m is.
struct OneFOneB {
    static constexpr const char* name = "1F1B";
    static constexpr bool one_f_one_b = true;
};
/// Pipeline schedule chosen at run time, by PipelineOptions::schedule (GPipe or 1F1B): a program
/// offering both compiles one pipeline per split instead of two (as sync::Any does for
/// ParameterServer's modes). The arithmetic is the named schedule's, bit for bit.
struct AnySchedule {
    static constexpr const char* name = "run-time (GPipe or 1F1B)";
};
/// The schedules PipelineOptions::schedule names.
enum class ScheduleKind { GPipe, OneFOneB };

/// Where a Pipeline cuts the model (see the file comment).
namespace split {

/// Balance stages by parameter count (what a stage keeps in memory for the whole run).
struct ByParams {
    static constexpr const char* name = "parameters";
};
/// Balance stages by forward FLOPs per example (what a stage spends its time on): a layer with
/// parameters costs 2 · parameters · (output positions per filter/unit), Conv2D and Dense
/// alike; one without, one operation per output value.
struct ByFlops {
    static constexpr const char* name = "FLOPs";
};

/// The cost of every layer of `Net` under `Cost`.
template <class Net, class Cost>
constexpr auto layer_costs() {
    using Layers = typename Net::template bound_layers<float, place::Host>;
    return []<std::size_t... I>(std::index_sequence<I...>) {
        return std::array<double, sizeof...(I)>{[] {
            using L = std::tuple_element_t<I, Layers>;
            if constexpr (std::is_same_v<Cost, ByParams>) {
                return double(L::num_params);
            } else {
                using Out = typename L::output_shape;
                if constexpr (L::num_params > 0) {
                    const double per = double(Out::size) / double(Out::dims[Out::dims.size() - 1]);
                    return 2.0 * double(L::num_params) * per;
                } else {
                    return double(Out::size);
                }
            }
        }()...};
    }(std::make_index_sequence<Net::num_layers>{});
}

namespace detail {
/// The balanced split: `stages` (1 <= stages <= L) runs of consecutive layers whose largest
/// summed `cost` is the smallest possible, by dynamic programming over the layers; ties go to
/// the split with the earliest boundaries. Writes the stages + 1 bounds to `out`.
template <std::size_t L>
constexpr void balance(const std::array<double, L>& cost, std::size_t stages, std::size_t* out) {
    const std::size_t S = stages;
    // best[s][l]: the smallest largest-stage cost of the first l layers in s stages.
    std::array<std::array<double, L + 1>, L + 1> best{};
    std::array<std::array<std::size_t, L + 1>, L + 1> cut{};
    constexpr double inf = 1e300;
    for (auto& row : best)
        for (auto& v : row) v = inf;
    best[0][0] = 0;
    for (std::size_t s = 1; s <= S; ++s)
        for (std::size_t l = s; l <= L; ++l) {
            double stage = 0;
            for (std::size_t j = l; j-- > s - 1;) {  // the last stage is layers [j, l)
                stage += cost[j];
                const double c = best[s - 1][j] > stage ? best[s - 1][j] : stage;
                if (c <= best[s][l]) {
                    best[s][l] = c;
                    cut[s][l] = j;
                }
            }
        }
    out[S] = L;
    for (std::size_t s = S; s > 0; --s) out[s - 1] = cut[s][out[s]];
}
}  // namespace detail

/// Stage s holds layers [bounds[s], bounds[s + 1]): stage 1 starts at layer `Starts...[0]`, ...
/// Requires strictly increasing starts inside (0, number of layers) (a static_assert names them).
template <std::size_t... Starts>
struct At {
    static constexpr int stages = int(sizeof...(Starts)) + 1;
    static constexpr const char* name = "At";
    template <class Net>
    static constexpr std::array<std::size_t, sizeof...(Starts) + 2> bounds() {
        constexpr std::array<std::size_t, sizeof...(Starts)> s{Starts...};
        constexpr bool ok = [&] {
            std::size_t prev = 0;
            for (auto b : s) {
                if (b <= prev || b >= Net::num_layers) return false;
                prev = b;
            }
            return true;
        }();
        static_assert(ok, "strata::distribute::split::At<starts...>: a stage boundary that does not exist: each start is the "
                          "index of the first layer of a stage (the Input not counted), strictly increasing and inside "
                          "(0, number of layers of the Sequential)");
        std::array<std::size_t, sizeof...(Starts) + 2> out{};
        for (std::size_t i = 0; i < s.size(); ++i) out[i + 1] = s[i];
        out[s.size() + 1] = Net::num_layers;
        return out;
    }
};

/// `Stages` stages of consecutive layers whose largest cost (`Cost`: ByParams or ByFlops) is
/// the smallest possible; a constexpr partitioner (dynamic programming over the layers) picks
/// them when the model is compiled. Ties go to the split with the earliest boundaries.
template <int Stages, class Cost>
struct Balanced {
    static_assert(Stages >= 1, "strata::distribute::split::Balanced<P, Cost>: P (the number of stages) must be >= 1");
    static_assert(std::is_same_v<Cost, ByParams> || std::is_same_v<Cost, ByFlops>,
                  "strata::distribute::split::Balanced<P, Cost>: Cost must be split::ByParams or split::ByFlops");
    static constexpr int stages = Stages;
    static constexpr const char* name = "Balanced";
    template <class Net>
    static constexpr std::array<std::size_t, std::size_t(Stages) + 1> bounds() {
        static_assert(std::size_t(Stages) <= Net::num_layers,
                      "strata::distribute::split::Balanced<P, Cost>: more stages than layers: every stage needs at least "
                      "one layer of the Sequential");
        std::array<std::size_t, std::size_t(Stages) + 1> out{};
        detail::balance(layer_costs<Net, Cost>(), std::size_t(Stages), out.data());
        return out;
    }
};

/// Balanced stages (as `Balanced<P, Cost>`) whose number P is chosen at run time, by
/// PipelineOptions::stages (required): a program offering several stage counts compiles one
/// Pipeline model instead of one per count (as AnySchedule does for the schedules). The split
/// is the one Balanced<P, Cost> gives, found when the model is built; a P above the model's
/// layer count is a ValueError then.
template <class Cost>
struct AnyBalanced {
    static_assert(std::is_same_v<Cost, ByParams> || std::is_same_v<Cost, ByFlops>,
                  "strata::distribute::split::AnyBalanced<Cost>: Cost must be split::ByParams or split::ByFlops");
    static constexpr int stages = 0;  // chosen at run time
    static constexpr const char* name = "Balanced";
    static constexpr const char* cost_name = Cost::name;
    template <class Net>
    static std::vector<std::size_t> bounds(int stages) {
        STRATA_CHECK(stages >= 1 && std::size_t(stages) <= Net::num_layers, ValueError, "Pipeline: ", stages,
                     " stages for a Sequential of ", Net::num_layers, " layers: every stage needs at least one layer");
        std::vector<std::size_t> out(std::size_t(stages) + 1);
        detail::balance(layer_costs<Net, Cost>(), std::size_t(stages), out.data());
        return out;
    }
};

}  // namespace split

/// The processes of a pipeline across an MPI job, one stage each: rank q runs stage q % P of
/// replica q / P (pipeline_mpi.hpp implements it over collective::Mailbox and
/// collective::ProcessGroup; this header needs no MPI). Every wait has the Pipeline's deadline
/// and names who did not answer.
class PipelineProcesses {
public:
    struct Received {
        std::uint32_t kind = 0;
        std::uint64_t step = 0;
        std::vector<std::byte> payload{};
    };
    virtual ~PipelineProcesses() = default;
    /// Joins the job as P stages × R replicas: ValueError on every rank unless it has R·P
    /// processes; `settings` (the strategy's) must be the same on every rank.
    virtual void join(int stages, int replicas, std::chrono::milliseconds timeout, collective::Settings settings) = 0;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    /// The job's number of this pipeline's rank q (its MPI_COMM_WORLD rank: a pipeline over part
    /// of the job, as each shard's under pipeline × tensor, names its ranks as mpirun does).
    virtual int job_rank(int q) const { return q; }
    /// "stage 1 of replica 0 (rank 1)".
    virtual std::string name(int rank) const = 0;
    virtual void send(int rank, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload) = 0;
    /// The next message from `rank`, waiting at most `timeout`; DistributedError `<what>: stage 1
    /// (rank 1) did not answer within 60000 ms` after it.
    virtual Received receive(int rank, std::string_view what, std::chrono::milliseconds timeout) = 0;
    /// Sums over every rank, in place (the same result everywhere).
    virtual void sum_all(std::span<double> values) = 0;
    virtual void sum_all(std::span<float> values) = 0;
    /// Sums over the R copies of this rank's stage (the hybrid's gradients), in place.
    virtual void sum_copies(std::span<double> values) = 0;
    virtual void sum_copies(std::span<float> values) = 0;
    /// Sums over the P stages of this rank's replica, in place (what a step decides from the
    /// whole model's gradient: global_clipnorm's norm, the loss scale's finiteness).
    virtual void sum_stages(std::span<double> values) = 0;
    virtual void barrier() = 0;
    /// Checks that every rank passes the same `settings` (the model, the optimizer): a
    /// ValueError on every rank naming each one that differs and which rank has what.
    virtual void agree(const collective::Settings& settings, std::string_view what) = 0;
    /// This rank failed (`why`): the job must not wait for the others at exit.
    virtual void fail(std::string_view why) noexcept = 0;
};

/// Options of a Pipeline.
struct PipelineOptions {
    /// M: micro-batches per replica's share of a global batch (m = min(M, examples) of them).
    int micro_batches = 4;
    /// R: copies of the pipeline (the hybrid: data parallelism over R pipelines). R·P threads.
    int replicas = 1;
    /// Host threads of each stage's ops; 0 = the configured logical device's, or the host's
    /// cores divided among the R·P stages.
    int cores_per_stage = 0;
    /// The all-reduce among a stage's R copies (hybrid only).
    Algorithm all_reduce = Algorithm::Auto;
    /// A stage that waits longer than this for its neighbour throws DistributedError.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    /// Across processes: the MPI job's ranks (pipeline_processes() of pipeline_mpi.hpp); empty:
    /// every stage in this process.
    std::shared_ptr<PipelineProcesses> processes{};
    /// The schedule, for Pipeline<P, AnySchedule, Split> (required there); with GPipe or OneFOneB
    /// in the type it may be left empty, or must name the same schedule.
    std::optional<ScheduleKind> schedule{};
    /// P, the stages, for a split chosen at run time (split::AnyBalanced: required there, >= 1);
    /// with the split in the type it may be left 0, or must be the type's count.
    int stages = 0;
    /// Across processes: the program's own settings that every rank must share (as
    /// MultiWorkerOptions::settings and ParameterServerOptions::settings), compared with the
    /// pipeline's (schedule, stages, replicas, micro-batches) and distribute::job_settings()
    /// when the ranks join: a difference is a ValueError on every rank naming the setting and
    /// who has what.
    collective::Settings settings{};
    /// Across processes with every stage split over a tensor-parallel group of N processes
    /// (pipeline × tensor: tensor_parallel_replicas, each shard's pipeline over its
    /// replica_comm()): each shard sends its neighbour's same shard 1/N of every message, its
    /// part of the activations or of their gradient, and the receiving stage's shards gather
    /// the parts among themselves (ShardGroup::gather). Megatron's scatter/gather between
    /// stages (Narayanan et al. 2021, §4.1): the link between stages carries one copy of each
    /// message instead of N. Off: every shard sends the whole message. The same on every rank
    /// (compared when they join); no effect on anything else.
    bool scatter_gather = true;
};

namespace detail {
/// Processes of the launch this process belongs to, as mpirun / srun tell their children.
inline int launched_processes() {
    // (Not SLURM_NTASKS: an allocation of many tasks may run one process outside srun.)
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"})
        if (const char* s = std::getenv(v))
            if (int n = std::atoi(s); n > 1) return n;
    return 1;
}

/// What a Pipeline strategy is at run time, whatever its type's place, schedule and split: its
/// stages' devices and threads, the hybrid's groups, the processes across MPI. Not a template,
/// so it is compiled once (in the compiled part); Pipeline<P, Schedule, Split> adds the
/// compile-time face the Strategy concept and the gradient path read.
class PipelineRuntime {
public:
    PipelineRuntime(const PipelineRuntime&) = delete;
    PipelineRuntime& operator=(const PipelineRuntime&) = delete;

    /// Whether the schedule is 1F1B (else GPipe): the type's, or PipelineOptions::schedule.
    bool one_f_one_b() const { return one_f_one_b_; }
    const char* schedule_name() const { return one_f_one_b_ ? OneFOneB::name : GPipe::name; }

    /// P: stages of each pipeline (the split's, or PipelineOptions::stages for a run-time split).
    int num_stages() const { return stages_; }
    /// The rank that runs stage s of replica r across processes (r · P + s).
    int rank_of(int replica, int stage) const { return replica * stages_ + stage; }
    /// R: replicas in sync (1 for a plain pipeline; the hybrid's pipelines otherwise).
    int num_replicas_in_sync() const { return options_.replicas; }
    int local_replicas() const { return options_.replicas; }
    int first_replica() const { return 0; }
    /// Rank 0 prints and writes files (always true in one process); with the stages' layers also
    /// split over processes (pipeline × tensor, tensor_parallel_replicas), rank 0 of shard 0's
    /// pipeline.
    bool is_chief() const { return rank_ == 0 && shard_group_chief(); }
    /// Across processes (PipelineOptions::processes): this process runs one stage of one replica.
    bool across_processes() const { return options_.processes != nullptr; }
    PipelineProcesses& processes() { return *options_.processes; }
    int rank() const { return rank_; }
    /// This process's rank as the job numbers it (what messages name; rank() is its place in the pipeline).
    int job_rank() const { return across_processes() ? options_.processes->job_rank(rank_) : rank_; }
    /// Whether this process runs stage s of replica r (every stage in one process).
    bool runs(int replica, int stage) const { return !across_processes() || replica * stages_ + stage == rank_; }
    int micro_batches() const { return options_.micro_batches; }
    /// Across processes, pipeline × tensor with PipelineOptions::scatter_gather: the shards of
    /// a stage send their neighbour parts of each message and gather what they receive
    /// (decided when the ranks join, the same on every rank).
    bool scatter_gather() const { return scatter_gather_; }
    const PipelineOptions& options() const { return options_; }
    /// The logical device of every stage: stage s of replica r is devices()[r · P + s].
    const std::vector<place::LogicalDevice>& devices() const { return devices_; }
    const place::LogicalDevice& device(int replica, int stage) const { return devices_[std::size_t(replica * stages_ + stage)]; }
    /// Whether the stages run inside their logical devices' scopes (memory limits apply).
    bool scoped() const { return scoped_; }
    /// The R copies of stage s, for the hybrid's all-reduce.
    collective::ReplicaGroup& stage_group(int s) { return *groups_[std::size_t(s)]; }
    /// The P stages of replica r (in one process), for what a step decides from the whole
    /// model's gradient (global_clipnorm's norm, the loss scale's finiteness).
    collective::ReplicaGroup& pipeline_group(int r) { return *pipelines_[std::size_t(r)]; }

    /// Runs `fn(replica, stage)` on every stage's thread, inside its device, and waits for all.
    /// `on_failure(replica, stage)` runs on a failing stage's thread at once (it must wake the
    /// other stages); the pool then throws DistributedError.
    STRATA_DECL void run_stages(FunctionRef<void(int, int)> fn, FunctionRef<void(int, int)> on_failure);

protected:
    /// `stages` stages (0: options.stages, a split chosen at run time) of `host` or GPU devices;
    /// `type_schedule`: the schedule the type names (empty for AnySchedule, which takes
    /// options.schedule), `type_name` its name in errors.
    STRATA_DECL PipelineRuntime(PipelineOptions options, int stages, bool host, std::optional<ScheduleKind> type_schedule,
                                const char* type_name);
    ~PipelineRuntime() = default;

private:
    STRATA_DECL void pick_devices(int threads);
    STRATA_DECL place::LogicalDevice process_device(int t) const;
    STRATA_DECL void enter_device(int t);

    PipelineOptions options_;
    int stages_;
    bool host_;
    bool one_f_one_b_ = false;  // the schedule: the type's, or options_.schedule under AnySchedule
    std::vector<place::LogicalDevice> devices_;
    std::vector<std::unique_ptr<collective::ReplicaGroup>> groups_;     // [s]: stage s's R copies
    std::vector<std::unique_ptr<collective::ReplicaGroup>> pipelines_;  // [r]: replica r's P stages
    std::unique_ptr<ReplicaPool> pool_;
    int cores_ = 1;
    int rank_ = 0;
    bool scoped_ = false;
    bool scatter_gather_ = false;
};

/// The placement log of a pipeline (place::log_device_placement): one line per stage (its
/// thread, layers and device) and one per variable copy. `bounds`: stage s holds layers
/// [bounds[s], bounds[s+1]); `offsets`: layer l's parameters start at offsets[l].
STRATA_DECL void log_pipeline_placement(PipelineRuntime& strategy, int units, std::span<const std::size_t> bounds,
                                        const std::vector<std::string>& layer_names, const std::vector<nn::ParamInfo>& params,
                                        std::span<const std::int64_t> offsets);

/// What a pipeline's error says when stage s of replica r threw `e` first: the stage, its
/// layers, where it ran, and e's message (across processes a stage's own "Pipeline: ..." message
/// already says where, and is kept).
STRATA_DECL std::string pipeline_stage_failure(PipelineRuntime& strategy, int units, int r, int s,
                                               std::span<const std::size_t> bounds, const std::vector<std::string>& layer_names,
                                               const std::exception& e);

/// The split's table under a model's summary: each stage's layers, parameters and FLOPs per
/// example (`params`, `flops`: the layers' costs), after a line naming the split and schedule.
STRATA_DECL std::string pipeline_split_table(std::span<const std::size_t> bounds, const std::vector<std::string>& layer_names,
                                             std::span<const double> params, std::span<const double> flops, const char* split_name,
                                             const char* schedule_name);

}  // namespace detail

/// Pipeline parallelism (see the file comment): `Split::stages` stages (split::AnyBalanced:
/// PipelineOptions::stages) on logical devices of place `P`, scheduled by `Schedule` (GPipe or
/// OneFOneB, or AnySchedule: chosen at run time by PipelineOptions::schedule). Satisfies the
/// Strategy concept. What it does at run time is detail::PipelineRuntime's, the same for every
/// P, schedule and split.
template <class P, class Schedule, class Split>
class Pipeline : public detail::PipelineRuntime {
    static_assert(place::Place<P>, "strata::distribute::Pipeline<Place, Schedule, Split>: Place must be strata::place::Host or strata::place::Cuda");
    static_assert(std::is_same_v<Schedule, GPipe> || std::is_same_v<Schedule, OneFOneB> || std::is_same_v<Schedule, AnySchedule>,
                  "strata::distribute::Pipeline<Place, Schedule, Split>: Schedule must be distribute::GPipe, distribute::OneFOneB "
                  "or distribute::AnySchedule");
    static_assert(requires { Split::stages; },
                  "strata::distribute::Pipeline<Place, Schedule, Split>: Split must be split::At<starts...>, split::Balanced<P, Cost> "
                  "or split::AnyBalanced<Cost>");

public:
    using place_type = P;
    using sync_mode = sync::Synchronous;
    using strategy_tag = Pipeline;
    using schedule = Schedule;
    using split_type = Split;
    static constexpr const char* name = "Pipeline";

    explicit Pipeline(PipelineOptions options = {})
        : PipelineRuntime(std::move(options), Split::stages, std::is_same_v<P, place::Host>, type_schedule(), Schedule::name) {}

    /// Where this pipeline cuts `Net`: stage s holds layers [bounds[s], bounds[s + 1]).
    template <class Net>
    std::vector<std::size_t> split_bounds() const {
        if constexpr (Split::stages == 0) {
            return Split::template bounds<Net>(num_stages());
        } else {
            constexpr auto b = Split::template bounds<Net>();
            return {b.begin(), b.end()};
        }
    }
    /// The split of `Net` as Model<Net, Pipeline>::summary() prints it under the layers (with
    /// the stage count and schedule of this pipeline, where the type leaves them to run time).
    template <class Net>
    std::string split_summary() const {
        return detail::pipeline_split_table(split_bounds<Net>(), Net::layer_names(), split::layer_costs<Net, split::ByParams>(),
                                            split::layer_costs<Net, split::ByFlops>(), Split::name, schedule_name());
    }

private:
    static std::optional<ScheduleKind> type_schedule() {
        if constexpr (std::is_same_v<Schedule, AnySchedule>) return std::nullopt;
        else return Schedule::one_f_one_b ? ScheduleKind::OneFOneB : ScheduleKind::GPipe;
    }
};

}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/pipeline.ipp"
#endif
