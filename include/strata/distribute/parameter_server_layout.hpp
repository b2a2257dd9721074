#pragma once
/// \file strata/distribute/parameter_server_layout.hpp
/// Which rank of an MPI job plays which part of a parameter server across processes (like
/// TF's cluster spec, but from MPI's ranks): rank 0 is the coordinator, ranks 1..S the servers,
/// ranks S+1..S+W the workers. A job of any other size is refused before anything else happens,
/// naming the count it expected and the one it found.
///
/// \code
/// auto layout = strata::distribute::ParameterServerLayout::of(world_size, /*workers=*/3, /*servers=*/1);
/// if (layout.role(rank) == ParameterServerLayout::Role::Worker) ... layout.worker_index(rank) ...
/// \endcode
///
/// Used by ParameterServer across processes (strata/distribute/parameter_server_mpi.hpp,
/// docs/parameter_server.md, "Across processes").
#include <strata/core/error.hpp>

#include <string>

namespace strata::distribute {

/// Roles of the ranks of a multi-process parameter server.
struct ParameterServerLayout {
    enum class Role { Coordinator, Server, Worker };

    int workers = 1;
    int servers = 1;

    /// The layout of a job of `processes` ranks; ValueError unless processes = 1 + servers + workers.
    [[nodiscard]] static ParameterServerLayout of(int processes, int workers, int servers) {
        STRATA_CHECK(workers >= 1, ValueError, "ParameterServer across processes: the number of workers must be >= 1, got ", workers);
        STRATA_CHECK(servers >= 1, ValueError, "ParameterServer across processes: the number of servers must be >= 1, got ", servers);
        const long long expected = 1LL + servers + workers;
        STRATA_CHECK(processes == expected, ValueError, "ParameterServer across processes: 1 coordinator, ", servers,
                     servers == 1 ? " server" : " servers", " and ", workers, workers == 1 ? " worker" : " workers",
                     " need ", expected, " processes (mpirun -np ", expected, "), found ", processes);
        return ParameterServerLayout{workers, servers};
    }

    [[nodiscard]] int processes() const noexcept { return 1 + servers + workers; }
    [[nodiscard]] static constexpr int coordinator_rank() noexcept { return 0; }
    [[nodiscard]] int server_rank(int s) const { return 1 + checked(s, servers, "server"); }
    [[nodiscard]] int worker_rank(int w) const { return 1 + servers + checked(w, workers, "worker"); }

    [[nodiscard]] Role role(int rank) const {
        checked(rank, processes(), "rank");
        return rank == 0 ? Role::Coordinator : rank <= servers ? Role::Server : Role::Worker;
    }
    /// The index of a server or worker rank among its kind (0 for the coordinator).
    [[nodiscard]] int index(int rank) const {
        switch (role(rank)) {
            case Role::Coordinator: return 0;
            case Role::Server: return rank - 1;
            case Role::Worker: return rank - 1 - servers;
        }
        return 0;
    }
    /// "coordinator (rank 0)", "server 1 (rank 2)", "worker 0 (rank 3)": how messages name a rank.
    [[nodiscard]] std::string name(int rank) const {
        std::string s = role(rank) == Role::Coordinator ? "coordinator" : role(rank) == Role::Server ? "server" : "worker";
        if (rank != 0) s.append(" ").append(std::to_string(index(rank)));
        s.append(" (rank ").append(std::to_string(rank)).append(")");
        return s;
    }

private:
    static int checked(int i, int n, const char* what) {
        STRATA_CHECK(i >= 0 && i < n, ValueError, "ParameterServerLayout: ", what, " ", i, " is outside [0, ", n, ")");
        return i;
    }
};

}  // namespace strata::distribute
