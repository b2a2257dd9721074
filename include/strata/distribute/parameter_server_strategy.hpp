#pragma once
/// \file strata/distribute/parameter_server_strategy.hpp
/// (Included by strata/distribute/parameter_server.hpp, which brings the strategy's gradient path with it:
/// include that one.)
///
/// `ParameterServer<Place, Sync>` (tf.distribute's ParameterServerStrategy): W workers compute
/// gradients of their own mini-batches; S servers hold the variables, sharded by a partitioner
/// (TF's FixedShards / MinSize / MaxSize, along axis 0), each server owning its shards'
/// optimizer slots and applying the updates. A coordinator (the thread that calls fit) hands
/// out mini-batches and decides, by the sync mode's rule, which gradients make an update:
///
/// \code
/// namespace sd = strata::distribute;
/// sd::ParameterServer<strata::place::Host, strata::sync::KBatchSync<2>> ps(/*workers=*/4, /*servers=*/2,
///     {.partitioner = sd::FixedShards{2}, .clock = sd::Clock::Virtual,
///      .stragglers = sd::Stragglers::exponential(0.010)});
/// strata::Model<Net, decltype(ps)> model(ps, 42);
/// model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
/// model.fit(train.batch(64), {.epochs = 1});   // 64 = one worker's mini-batch
/// \endcode
///
/// In one process the servers and workers are threads on logical devices, but the data path is
/// messages, as they are sent over MPI across processes (ParameterServerOptions::processes,
/// strata/distribute/parameter_server_mpi.hpp): a worker *pulls* a
/// version-stamped copy of every shard into its own buffer, computes, and its gradient is
/// *pushed* as one message per server (a copy of that server's shards into its inbox); the
/// coordinator tells the servers which pushes make the next version and they acknowledge by
/// applying it. Nothing is shared by pointer between a worker and a server.
///
/// Two clocks. `Clock::Real`: straggler delays are really waited out. `Clock::Virtual`: each
/// mini-batch's compute time is drawn from the straggler model and events (finishes, updates,
/// cancellations) happen in virtual-time order while the gradients are really computed, so every
/// mode, asynchronous ones included, is bitwise reproducible from the seed.

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/distribute/combinations.hpp"
#include "strata/distribute/parameter_server_processes.hpp"
#include "strata/distribute/partitioner.hpp"
#include "strata/distribute/settings.hpp"
#include "strata/distribute/straggler.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/distribute/sync.hpp"

namespace strata::distribute {

/// Which clock orders a parameter server's events.
enum class Clock {
    Real,     ///< wall-clock time; straggler delays are slept
    Virtual,  ///< compute times drawn from the straggler model; events in virtual-time order
};

inline const char* clock_name(Clock c) { return c == Clock::Real ? "real" : "virtual"; }

/// Options of ParameterServer.
struct ParameterServerOptions {
    /// How variables are split into shards (std::monostate: each variable whole). Shards are
    /// placed round-robin over the servers.
    Partitioner partitioner{};
    Clock clock = Clock::Real;
    /// Who is slow, and by how much (none: every mini-batch takes the same time).
    Stragglers stragglers = Stragglers::none();
    /// Seed of the straggler draws.
    std::uint64_t straggler_seed = 0;
    /// Virtual clock: the compute time of one mini-batch before the straggler model's factor
    /// (stragglers none / slow); Exp and shifted Exp draw their own.
    double virtual_batch_seconds = 0.001;
    /// Host cores each worker's ops may use; 0 = the machine's cores divided among the workers.
    int cores_per_worker = 0;
    /// The mode of `ParameterServer<P, sync::Any>` (required there); any other sync mode says
    /// its own rule in its type, and this must be left empty or equal to it.
    std::optional<sync::Rule> rule{};
    /// K of a mode whose K is `sync::dynamic` (KSync<sync::dynamic>, ...) or of a K mode chosen
    /// at run time (sync::Any); 0 otherwise (or K).
    int k = 0;
    /// B of `Asynchronous<sync::dynamic>` (>= 0, or -1 unbounded); ignored otherwise unless it
    /// contradicts the mode's B.
    int staleness_bound = -1;
    /// A worker that does not report a finished (or cancelled) mini-batch within this time is
    /// named in a DistributedError.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    /// Across processes: the ranks' roles and messages (parameter_server_mpi.hpp); empty: one process.
    std::shared_ptr<ParameterServerProcesses> processes{};
    /// Across processes: the program's own settings that every rank must share (the flags that
    /// change the result: batch size, seed, output files, ...), as (name, value) text. They are
    /// checked with the strategy's own (settings()) in its constructor: a difference is a
    /// ValueError on every rank naming the setting and who has what.
    collective::Settings settings{};
};

namespace detail {

/// A ParameterServer's sync mode as its type fixes it: what the options are checked against.
struct ParameterServerType {
    const char* mode_name;  ///< Sync::name
    bool dynamic_rule;      ///< sync::Any: the rule, K and B come from the options
    sync::Rule rule;        ///< the type's rule (unused under sync::Any)
    int k, bound;           ///< the type's K and B (sync::dynamic: from the options)
};

/// What of a ParameterServer depends on neither its place nor its sync type: the options
/// checked against the type, the mode in force (rule, K, B), its name and settings, and the
/// servers' logical devices. Compiled once (in the compiled part, or inline header-only).
class ParameterServerConfig {
public:
    /// Checks `options` against `type`, `workers` and `servers`; across processes, agrees on
    /// the settings with every rank. `device`: the replicas' device, which the servers share.
    STRATA_DECL ParameterServerConfig(int workers, int servers, ParameterServerOptions options, ParameterServerType type,
                                      const place::LogicalDevice& device);

    /// The mode's rule: the type's, or ParameterServerOptions::rule under sync::Any.
    sync::Rule rule() const { return rule_; }
    /// K in force (the type's, or ParameterServerOptions::k for a dynamic one): 0 for
    /// Synchronous (every worker), 1 for Asynchronous.
    int k() const { return k_; }
    /// The SSP bound in force (−1: unbounded or not an SSP mode).
    int staleness_bound() const { return bound_; }
    int num_servers() const { return servers_; }
    const ParameterServerOptions& ps_options() const { return ps_options_; }
    /// The logical device of each server (in one process: host memory, named like TF's ps tasks).
    const std::vector<place::LogicalDevice>& server_devices() const { return server_devices_; }
    /// "KSync<2>", "Asynchronous<3>", "Synchronous" (dynamic knobs shown by their run-time value).
    STRATA_DECL std::string sync_name() const;
    /// What every rank of a parameter server across processes must share, beyond the number
    /// of workers and servers and the timeout (compared when the ranks join): the mode (its
    /// rule, K and B), the clock, the partitioner, the straggler model and its seed, and the
    /// virtual batch time. (cores_per_worker may differ.)
    STRATA_DECL collective::Settings settings() const;

protected:
    /// `workers` checked (>= 1, not more threads than the machine takes); the replicas' options.
    STRATA_DECL static int checked_workers(int workers);
    STRATA_DECL static StrategyOptions runtime_options(const ParameterServerOptions& o);

private:
    int servers_;
    ParameterServerOptions ps_options_;
    sync::Rule rule_;
    int k_, bound_;
    std::vector<place::LogicalDevice> server_devices_;
};

}  // namespace detail

/// Workers and sharded parameter servers in one process, under sync mode `Sync` (default:
/// asynchronous, as tf.distribute's ParameterServerStrategy).
template <class P, class Sync>
class ParameterServer : public ReplicaRuntime<P>, public detail::ParameterServerConfig {
    static_assert(place::Place<P>, "strata::distribute::ParameterServer<Place, Sync>: Place must be strata::place::Host or strata::place::Cuda");
    static_assert(sync::SyncMode<Sync>, "strata::distribute::ParameterServer<Place, Sync>: Sync must be a sync mode (strata::sync::Synchronous, "
                                        "KSync<K>, KBatchSync<K>, KAsync<K>, KBatchAsync<K>, Asynchronous<B>)");
    static_assert(parameter_server_sync_v<Sync>, "strata::distribute::ParameterServer: " STRATA_VALID_COMBINATIONS);

public:
    using place_type = P;
    using sync_mode = Sync;
    using strategy_tag = ParameterServer;
    static constexpr const char* name = "ParameterServer";
    /// Whether the mode is chosen at run time (sync::Any): rule(), k() and staleness_bound()
    /// then come from ParameterServerOptions.
    static constexpr bool dynamic_rule = std::is_same_v<Sync, sync::Any>;
    /// K of the K modes as the type says (sync::dynamic: given at run time; 1 for
    /// Asynchronous; 0 for Synchronous: every worker).
    static constexpr int static_k = sync::traits<Sync>::k;
    /// Asynchronous<B>'s B as the type says (−1: unbounded, or not an SSP mode).
    static constexpr int static_bound = sync::traits<Sync>::bound;

    /// `workers` compute units and `servers` parameter servers.
    ParameterServer(int workers, int servers, ParameterServerOptions options = {})
        : ReplicaRuntime<P>(checked_workers(workers), runtime_options(options), "ParameterServer", true),
          detail::ParameterServerConfig(workers, servers, std::move(options),
                                        {Sync::name, dynamic_rule, sync::traits<Sync>::rule, static_k, static_bound},
                                        this->devices()[0]) {}

    int num_workers() const { return this->num_replicas_in_sync(); }
};

}  // namespace strata::distribute

#if STRATA_DEFINITIONS
#include "strata/distribute/impl/parameter_server.ipp"
#endif
