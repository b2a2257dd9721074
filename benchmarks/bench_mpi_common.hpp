#pragma once
// What the benchmarks across MPI processes share (bench_mpi_allreduce, bench_all_gather). Include
// after <mpi.h> and bench_common.hpp.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace bench {

/// How many hosts the `size` processes of MPI_COMM_WORLD run on: distinct MPI_Get_processor_name
/// names (collective: every rank calls it).
inline int count_hosts(int size) {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> all(std::size_t(size) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
    std::vector<std::string> names;
    for (int r = 0; r < size; ++r) names.emplace_back(all.data() + std::size_t(r) * MPI_MAX_PROCESSOR_NAME);
    std::sort(names.begin(), names.end());
    return int(std::unique(names.begin(), names.end()) - names.begin());
}

/// The main() of a benchmark across MPI processes: MPI_Init_thread (MPI_THREAD_MULTIPLE), then
/// every rank parses the flags declared by declare(app) (they all need them; only rank 0 reports
/// a mistake or the usage), runs run(rank, size) and finalizes. A rank that failed while running
/// (status 1) may have failed alone and would leave the others waiting in a collective for ever:
/// it aborts the job. Flag mistakes (status 2) are the same on every rank.
template <class Declare, class Run>
int mpi_main(int argc, char** argv, const std::string& about, const std::string& name, Declare declare, Run run) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CLI::App app{about, name};
    declare(app);
    const int status = cli::run(app, argc, argv, [&] { return run(rank, size); }, rank == 0);
    if (status == 1 && size > 1) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
    return status;
}

}  // namespace bench
