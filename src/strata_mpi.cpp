// strata's MPI compiled part, libstrata_mpi: the non-template code of the MPI headers (their
// impl/*.ipp files) compiled once, and ProcessGroup's collectives for float and double, which the
// headers declare `extern template` under STRATA_SEPARATE_COMPILATION_MPI. As in src/strata.cpp,
// each header lists its own once (strata/config.hpp); this file includes every one of them with
// STRATA_BUILDING_MPI_PART defined. libstrata is built without MPI, so this is a library of its
// own, built on it: compile it with -DSTRATA_SEPARATE_COMPILATION -DSTRATA_SEPARATE_COMPILATION_MPI
// and MPI's flags, as the `strata-mpi-compiled` Meson dependency and its pkg-config file do, and
// link it, with libstrata and MPI, into a program whose every translation unit defines both
// macros too.
#if !defined(STRATA_SEPARATE_COMPILATION) || !defined(STRATA_SEPARATE_COMPILATION_MPI)
#error "src/strata_mpi.cpp is strata's MPI compiled part: compile it with -DSTRATA_SEPARATE_COMPILATION -DSTRATA_SEPARATE_COMPILATION_MPI"
#endif
#define STRATA_BUILDING_MPI_PART 1

#include "strata/distribute/collective/mailbox.hpp"
#include "strata/distribute/collective/process_group.hpp"
#include "strata/distribute/multi_worker_mirrored.hpp"
#include "strata/distribute/parameter_server_mpi.hpp"
#include "strata/distribute/pipeline_mpi.hpp"
