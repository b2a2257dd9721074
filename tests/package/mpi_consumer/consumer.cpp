// A tiny downstream program of strata's MPI code: the processes of MPI_COMM_WORLD join a
// collective::ProcessGroup and all-reduce a vector (the code the MPI compiled part holds: with
// STRATA_SEPARATE_COMPILATION_MPI it must come from libstrata_mpi). Runs alone or under mpirun;
// exit 0 when this rank got the sums.
#include <strata/distribute/collective/process_group.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
    namespace coll = strata::distribute::collective;
    coll::ProcessGroup group(MPI_COMM_WORLD, 1);
    const int n = group.size(), r = group.rank();
    std::vector<double> v{double(r + 1), 1.0};
    group.all_reduce(0, std::span<double>(v));
    std::vector<float> w{float(r)};
    group.broadcast(0, std::span<float>(w), n - 1);
    group.barrier();
    const bool ok = v[0] == n * (n + 1) / 2.0 && v[1] == n && w[0] == float(n - 1);
    std::printf("consumer: rank %d of %d: all_reduce, broadcast (%s) -> %s\n", r, n,
                STRATA_MPI_HEADER_ONLY ? "header-only" : "compiled part", ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
