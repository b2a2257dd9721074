#pragma once
/// \file strata/distribute/parameter_server_processes.hpp
/// `ParameterServerProcesses`: the ranks of a ParameterServer across processes, as its gradient
/// path sees them (ParameterServerOptions::processes; parameter_server_mpi.hpp makes one over
/// MPI). Included by parameter_server.hpp; on its own here so that the path's transport
/// (ps_transport.hpp) needs no strategy header.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/distribute/settings.hpp"

namespace strata::distribute {

/// The ranks of a parameter server across processes, as the gradient path sees them: its own
/// role and index, the ranks of the others, and point-to-point messages with deadlines.
/// strata/distribute/parameter_server_mpi.hpp makes one over MPI (parameter_server_processes());
/// left empty, the servers and workers are threads of this process.
class ParameterServerProcesses {
public:
    enum class Role { Coordinator, Server, Worker };
    struct Received {
        int source = -1;
        std::uint32_t kind = 0;
        std::uint64_t step = 0;
        std::vector<std::byte> payload{};
    };
    virtual ~ParameterServerProcesses() = default;
    virtual Role role() const = 0;
    /// This rank's index among the servers or the workers (0 for the coordinator).
    virtual int index() const = 0;
    virtual int coordinator_rank() const = 0;
    virtual int server_rank(int s) const = 0;
    virtual int worker_rank(int w) const = 0;
    virtual int processes() const = 0;
    /// "worker 1 (rank 3)".
    virtual std::string name(int rank) const = 0;
    virtual void send(int rank, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload) = 0;
    /// The next message from `rank`, waiting at most `timeout`; DistributedError naming it otherwise.
    virtual Received receive(int rank, std::string_view what, std::chrono::milliseconds timeout) = 0;
    virtual std::optional<Received> try_receive(int rank) = 0;
    /// `rank` is gone (a lost worker; -1: the job failed): the job must not wait for it at exit.
    virtual void mark_lost(int rank) = 0;
    /// Checks that every rank passes the same `settings` (`what` names them in the message):
    /// ValueError on every rank naming each setting that differs and which rank has what;
    /// DistributedError naming a rank that does not come within the timeout. Every rank calls it
    /// at the same point, from one thread (the strategy's constructor, the model's, compile).
    virtual void agree(const collective::Settings& settings, std::string_view what) = 0;
};

}  // namespace strata::distribute
