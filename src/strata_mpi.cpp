// strata's MPI compiled part: the non-template code of the MPI headers that have an impl/*.ipp
// (collective/process_group.hpp, collective/mailbox.hpp, pipeline_mpi.hpp,
// parameter_server_mpi.hpp, multi_worker_mirrored.hpp), compiled once, and ProcessGroup's
// all_reduce and broadcast for float and double, which the headers declare `extern template` for
// under STRATA_SEPARATE_COMPILATION_MPI (strata/config.hpp). libstrata is built without MPI, so
// this is a library of its own, libstrata_mpi, built on it: compile it with
// -DSTRATA_SEPARATE_COMPILATION -DSTRATA_SEPARATE_COMPILATION_MPI and MPI's flags, as the
// `strata-mpi-compiled` Meson dependency and its pkg-config file do, and link it, with libstrata
// and MPI, into a program whose every translation unit defines both macros too.
#if !defined(STRATA_SEPARATE_COMPILATION) || !defined(STRATA_SEPARATE_COMPILATION_MPI)
#error "src/strata_mpi.cpp is strata's MPI compiled part: compile it with -DSTRATA_SEPARATE_COMPILATION -DSTRATA_SEPARATE_COMPILATION_MPI"
#endif

#include "strata/distribute/collective/process_group.hpp"
#include "strata/distribute/collective/mailbox.hpp"
#include "strata/distribute/multi_worker_mirrored.hpp"
#include "strata/distribute/parameter_server_mpi.hpp"
#include "strata/distribute/pipeline_mpi.hpp"
#include "strata/distribute/collective/impl/mailbox.ipp"
#include "strata/distribute/collective/impl/process_group.ipp"
#include "strata/distribute/impl/multi_worker_mirrored.ipp"
#include "strata/distribute/impl/parameter_server_mpi.ipp"
#include "strata/distribute/impl/pipeline_mpi.ipp"

namespace strata::distribute::collective {
template void ProcessGroup::all_reduce<float>(int, std::span<float>, ReduceOp, SyncPoint);
template void ProcessGroup::all_reduce<double>(int, std::span<double>, ReduceOp, SyncPoint);
template void ProcessGroup::broadcast<float>(int, std::span<float>, int, SyncPoint);
template void ProcessGroup::broadcast<double>(int, std::span<double>, int, SyncPoint);
template void ProcessGroup::hier_all_reduce<float>(int, std::span<float>, ReduceOp, const SyncPoint&);
template void ProcessGroup::hier_all_reduce<double>(int, std::span<double>, ReduceOp, const SyncPoint&);
template void ProcessGroup::hier_broadcast<float>(int, std::span<float>, int, const SyncPoint&);
template void ProcessGroup::hier_broadcast<double>(int, std::span<double>, int, const SyncPoint&);
template void ProcessGroup::leader_broadcast<float>(int, std::span<float>, const SyncPoint&);
template void ProcessGroup::leader_broadcast<double>(int, std::span<double>, const SyncPoint&);
template void ProcessGroup::shm_all_reduce<float>(int, std::span<float>, ReduceOp, const SyncPoint&);
template void ProcessGroup::shm_all_reduce<double>(int, std::span<double>, ReduceOp, const SyncPoint&);
template void ProcessGroup::shm_broadcast<float>(int, std::span<float>, int, const SyncPoint&, std::chrono::milliseconds);
template void ProcessGroup::shm_broadcast<double>(int, std::span<double>, int, const SyncPoint&, std::chrono::milliseconds);
template void ProcessGroup::mpi_all_reduce<float>(int, std::span<float>, ReduceOp, const SyncPoint&);
template void ProcessGroup::mpi_all_reduce<double>(int, std::span<double>, ReduceOp, const SyncPoint&);
template void ProcessGroup::mpi_broadcast<float>(int, std::span<float>, int, const SyncPoint&);
template void ProcessGroup::mpi_broadcast<double>(int, std::span<double>, int, const SyncPoint&);
}  // namespace strata::distribute::collective
