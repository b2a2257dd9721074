#pragma once
/// \file strata/distribute/impl/parameter_server.ipp
/// The definitions behind strata/distribute/parameter_server.hpp's ParameterServerConfig:
/// included by it in the header-only mode, compiled once in src/strata.cpp under
/// STRATA_SEPARATE_COMPILATION.

#include "strata/distribute/parameter_server_strategy.hpp"

namespace strata::distribute::detail {

STRATA_DECL ParameterServerConfig::ParameterServerConfig(int workers, int servers, ParameterServerOptions options,
                                                         ParameterServerType type, const place::LogicalDevice& device)
    : servers_(servers), ps_options_(std::move(options)) {
    const auto& o = ps_options_;
    STRATA_CHECK(servers >= 1, ValueError, "ParameterServer: the number of servers must be >= 1, got ", servers);
    STRATA_CHECK(servers <= max_replica_threads(), ValueError, "ParameterServer: ", servers, " servers (one thread each) on ",
                 hardware_threads(), " hardware threads; at most ", max_replica_threads(), " (16 per hardware thread, at least 64)");
    if (type.dynamic_rule) {
        STRATA_CHECK(o.rule.has_value(), ValueError, "ParameterServer<sync::Any>: choose the mode in "
                     "ParameterServerOptions::rule (Synchronous, KSync, KBatchSync, KAsync, KBatchAsync or Asynchronous)");
    } else {
        STRATA_CHECK(!o.rule || *o.rule == type.rule, ValueError, "ParameterServer<", type.mode_name,
                     ">: ParameterServerOptions::rule = ", sync::rule_name(*o.rule),
                     " contradicts the type's mode (leave it empty, or use sync::Any to choose the mode at run time)");
    }
    // The mode in force: the type's, or the options' where the type leaves it to run time.
    rule_ = type.dynamic_rule ? o.rule.value_or(sync::Rule::Synchronous) : type.rule;
    if (type.dynamic_rule) k_ = rule_ == sync::Rule::Synchronous ? 0 : rule_ == sync::Rule::Asynchronous ? 1 : o.k;
    else k_ = type.k == sync::dynamic ? o.k : type.k;
    bound_ = rule_ != sync::Rule::Asynchronous ? -1 : type.bound == sync::dynamic ? o.staleness_bound : type.bound;

    const bool k_mode = rule_ != sync::Rule::Synchronous && rule_ != sync::Rule::Asynchronous;
    if (type.k == sync::dynamic && k_mode) {
        STRATA_CHECK(o.k >= 1, ValueError, "ParameterServer<", type.mode_name, type.dynamic_rule ? "" : "<sync::dynamic>",
                     ">: give K in ParameterServerOptions::k (>= 1), got ", o.k);
    } else if (k_mode) {
        STRATA_CHECK(o.k == 0 || o.k == type.k, ValueError, "ParameterServer<", type.mode_name, "<", type.k,
                     ">>: ParameterServerOptions::k = ", o.k, " contradicts the mode's K = ", type.k, " (leave it 0, or use ",
                     type.mode_name, "<sync::dynamic>)");
    } else {
        STRATA_CHECK(o.k == 0, ValueError, "ParameterServer<", sync_name(), ">: ParameterServerOptions::k = ", o.k,
                     " means nothing for this mode (only the K modes take a K)");
    }
    if (type.bound == sync::dynamic && rule_ == sync::Rule::Asynchronous) {
        STRATA_CHECK(o.staleness_bound >= -1, ValueError, "ParameterServer<",
                     type.dynamic_rule ? "sync::Any" : "Asynchronous<sync::dynamic>",
                     ">: ParameterServerOptions::staleness_bound must be >= 0, or -1 for unbounded, got ", o.staleness_bound);
    } else if (rule_ == sync::Rule::Asynchronous) {
        STRATA_CHECK(o.staleness_bound == -1 || o.staleness_bound == type.bound, ValueError, "ParameterServer<", sync_name(),
                     ">: ParameterServerOptions::staleness_bound = ", o.staleness_bound, " contradicts the mode's bound ",
                     type.bound, " (use Asynchronous<sync::dynamic> to choose it at run time)");
    } else {
        STRATA_CHECK(o.staleness_bound == -1, ValueError, "ParameterServer<", sync_name(),
                     ">: a staleness bound means nothing for this mode (only Asynchronous<B> takes one)");
    }
    if (k_ > 0)
        STRATA_CHECK(k_ <= workers, ValueError, "ParameterServer<", sync_name(), ">: K = ", k_, " needs at least ", k_,
                     " workers, got ", workers);
    STRATA_CHECK(o.virtual_batch_seconds > 0 && o.virtual_batch_seconds < 1e9, ValueError,
                 "ParameterServer: virtual_batch_seconds must be in (0, 1e9), got ", o.virtual_batch_seconds);
    STRATA_CHECK(o.timeout.count() > 0, ValueError, "ParameterServer: timeout must be > 0 ms, got ", o.timeout.count());
    validate(o.partitioner);
    o.stragglers.validate(workers);
    if (o.processes)
        STRATA_CHECK(o.processes->processes() == 1 + servers + workers, ValueError, "ParameterServer: ", workers,
                     " workers and ", servers, " servers across processes need ", 1 + servers + workers, " processes, the job has ",
                     o.processes->processes());
    if (o.processes) {
        auto mine = settings();
        for (const auto& kv : o.settings) mine.push_back(kv);
        o.processes->agree(mine, "ParameterServer's settings (every process must be started with the same ones)");
    }
    for (int s = 0; s < servers; ++s) {
        place::LogicalDevice d = device;
        d.name = "/job:ps/task:" + std::to_string(s) + "/device:CPU:0";
        server_devices_.push_back(d);
    }
    if (place::get_log_device_placement())
        for (int s = 0; s < servers; ++s)
            place::log_placement("ParameterServer server " + std::to_string(s) + " (its shards and their updates)",
                                 server_devices_[std::size_t(s)]);
}

STRATA_DECL std::string ParameterServerConfig::sync_name() const {
    switch (rule_) {
        case sync::Rule::Synchronous: return "Synchronous";
        case sync::Rule::Asynchronous: return "Asynchronous<" + std::to_string(bound_) + ">";
        case sync::Rule::KSync: return "KSync<" + std::to_string(k_) + ">";
        case sync::Rule::KBatchSync: return "KBatchSync<" + std::to_string(k_) + ">";
        case sync::Rule::KAsync: return "KAsync<" + std::to_string(k_) + ">";
        case sync::Rule::KBatchAsync: return "KBatchAsync<" + std::to_string(k_) + ">";
    }
    return "?";
}

STRATA_DECL collective::Settings ParameterServerConfig::settings() const {
    char vbs[40];
    std::snprintf(vbs, sizeof vbs, "%.17g", ps_options_.virtual_batch_seconds);
    return {{"sync mode", sync_name()},
            {"clock", clock_name(ps_options_.clock)},
            {"partitioner", describe(ps_options_.partitioner)},
            {"stragglers", ps_options_.stragglers.describe()},
            {"straggler_seed", std::to_string(ps_options_.straggler_seed)},
            {"virtual_batch_seconds", vbs}};
}

STRATA_DECL int ParameterServerConfig::checked_workers(int workers) {
    STRATA_CHECK(workers >= 1, ValueError, "ParameterServer: the number of workers must be >= 1, got ", workers);
    STRATA_CHECK(workers <= max_replica_threads(), ValueError, "ParameterServer: ", workers, " workers (one thread each) on ",
                 hardware_threads(), " hardware threads; at most ", max_replica_threads(),
                 " (16 per hardware thread, at least 64): more only wait for each other and each holds its own buffers");
    return workers;
}

STRATA_DECL StrategyOptions ParameterServerConfig::runtime_options(const ParameterServerOptions& o) {
    StrategyOptions s;
    s.cores_per_replica = o.cores_per_worker;
    s.timeout = o.timeout;
    return s;
}

}  // namespace strata::distribute::detail
