#pragma once
/// \file strata/distribute/parameter_server_mpi.hpp
/// ParameterServer across the processes of an MPI job: rank 0 the coordinator, ranks 1..S the
/// servers, ranks S+1..S+W the workers (ParameterServerLayout). Every process runs the same
/// program and makes the same calls; give each one's strategy
/// `ParameterServerOptions::processes = parameter_server_processes(W, S, timeout)`:
///
/// \code
/// sd::ParameterServerOptions o{.clock = sd::Clock::Virtual};
/// o.processes = sd::parameter_server_processes(/*workers=*/3, /*servers=*/1, o.timeout);  // mpirun -np 5
/// sd::ParameterServer<strata::place::Host, strata::sync::Asynchronous<>> ps(3, 1, o);
/// \endcode
///
/// Inside an epoch the coordinator runs the in-process schedule and admission rules unchanged;
/// its worker threads are proxies of the worker ranks, and its pulls, pushes and updates are
/// messages (collective::Mailbox: non-blocking, every wait with a deadline that names the rank):
/// at dispatch each server sends the worker its shards, tagged with the job; a worker computes
/// and reports; an admitted mini-batch is pushed by the worker into each server's inbox; an
/// update tells the servers to sum their inboxes in admission order and apply, and they
/// acknowledge. After each epoch the servers send their state to every rank, so evaluate,
/// predict, save and BackupAndRestore work on every rank as in one process. Needs <mpi.h>.
#include <strata/config.hpp>
#include <strata/distribute/collective/process_group.hpp>
#include <strata/distribute/parameter_server.hpp>

#include <chrono>
#include <memory>

namespace strata::distribute {

/// The roles of this job's ranks for a parameter server of `workers` workers and `servers`
/// servers. Every rank of `comm` calls it: the ranks join first (within `timeout`; a rank with
/// other workers, servers or timeout is a ValueError on every rank naming who has what), then
/// ValueError on every rank unless the job has 1 + servers + workers processes.
STRATA_MPI_DECL std::shared_ptr<ParameterServerProcesses> parameter_server_processes(int workers, int servers,
                                                                                     std::chrono::milliseconds timeout,
                                                                                     MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace strata::distribute

#if STRATA_MPI_DEFINITIONS
#include "strata/distribute/impl/parameter_server_mpi.ipp"
#endif
