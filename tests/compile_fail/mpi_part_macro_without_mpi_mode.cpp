// STRATA_BUILDING_MPI_PART is src/strata_mpi.cpp's own macro: it turns the MPI headers' lists of
// instantiations into their definitions. Defined in a unit that is not built in the MPI part's
// mode, it would define them beside the inline MPI code, a second copy of libstrata_mpi's.
// expect: STRATA_BUILDING_MPI_PART: src/strata_mpi.cpp is compiled with STRATA_SEPARATE_COMPILATION and STRATA_SEPARATE_COMPILATION_MPI
#define STRATA_BUILDING_MPI_PART 1
#include <strata/config.hpp>
int main() {}
