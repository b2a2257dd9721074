#pragma once
/// \file strata/distribute/launcher.hpp
/// What started this process: a parallel launcher (mpirun, srun, mpiexec) that started N copies
/// of it, read from the environment the launcher sets, without initializing MPI. A program whose
/// strategy lives in one process (OneDevice, Mirrored, CentralStorage, an in-process
/// ParameterServer) asks it, so that `mpirun -np 4 prog` is refused rather than training four
/// independent copies that print four reports and overwrite each other's files.
///
/// Read, in order (the first that names more than one process wins):
///   Open MPI            OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK
///   MPICH / Hydra, PMI  PMI_SIZE, PMI_RANK
///   Slurm's srun        SLURM_STEP_NUM_TASKS, SLURM_PROCID (srun sets both for every task; a batch
///                       script alone, outside srun, has SLURM_NTASKS but is one process: not counted)
/// (Open MPI 5's prterun sets OMPI_COMM_WORLD_SIZE as well; Intel MPI and MVAPICH set PMI_SIZE.)
#include <cstdlib>
#include <string>

namespace strata::distribute {

/// The launcher's view of this process: `size` processes were started (1 when none, or one
/// process), this one is `rank`; `variable` names the environment variable that said so.
struct LaunchInfo {
    int size = 1;
    int rank = 0;
    std::string variable{};   ///< e.g. "OMPI_COMM_WORLD_SIZE"; empty when no launcher was found
    std::string launcher{};   ///< e.g. "mpirun (Open MPI)"

    /// "mpirun (Open MPI) started 4 processes (OMPI_COMM_WORLD_SIZE=4)".
    [[nodiscard]] std::string describe() const {
        if (variable.empty()) return "no parallel launcher";
        return launcher + " started " + std::to_string(size) + " processes (" + variable + "=" + std::to_string(size) + ")";
    }
};

namespace detail {
inline int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 1 << 24) return fallback;
    return int(n);
}
}  // namespace detail

/// Reads the environment of the launchers listed in the file comment. Never throws; never
/// initializes MPI.
[[nodiscard]] inline LaunchInfo launch_info() {
    struct Source {
        const char* size;
        const char* rank;
        const char* launcher;
    };
    static constexpr Source sources[] = {
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpirun (Open MPI)"},
        {"PMI_SIZE", "PMI_RANK", "mpiexec (PMI: MPICH, Intel MPI)"},
        {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun (Slurm)"},
    };
    for (const auto& s : sources) {
        const int n = detail::env_int(s.size, 0);
        if (n >= 1) return LaunchInfo{n, detail::env_int(s.rank, 0), s.size, s.launcher};
    }
    return {};
}

}  // namespace strata::distribute
