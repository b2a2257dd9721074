// The doctest main of the tests that run under mpirun: every rank runs every test case (they
// call collectives together), rank 0 reports, the others print only failures. The exit status
// is non-zero on any rank that saw a failure, and mpirun passes it on.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    doctest::Context context(argc, argv);
    if (rank != 0) context.setOption("minimal", true);
    const int failed = context.run();
    // A rank that failed must not wait in MPI_Finalize for ranks that may never come.
    if (failed != 0) MPI_Abort(MPI_COMM_WORLD, failed);
    // The fault tests leave failed groups behind on purpose; every rank is still here, so
    // finalizing is safe.
    MPI_Finalize();
    return failed;
}
