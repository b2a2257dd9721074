// MultiWorkerMirrored on GPUs across processes, run by mpirun -np 2: NCCL between the processes
// (one communicator per local replica) where every process has a GPU of its own, and the host
// staging (pinned copies into the process group's all-reduce) for 2 processes sharing one GPU
// (a logical GPU each), which NCCL refuses. Compiled by nvcc with MPI (and NCCL where found);
// every rank exits 77 (skipped) without a GPU; the NCCL case needs a GPU per process and says so
// when there is not.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "test_util.hpp"

#include <strata/strata.hpp>

#include "cuda_model_data.hpp"
#include <strata/distribute/multi_worker_mirrored.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;

namespace {
using Cnn = strata_test::CudaCnn;
strata::data::Dataset<> data(std::size_t n) { return strata_test::cuda_model_data(n); }

// The GPUs of this host, and its processes.
int gpus() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}
int processes_here() { return strata::distribute::collective::mpi::local_size(); }

// Trains 2 epochs on the GPUs of `mw` and on the host's one device; returns the largest weight
// difference relative to the largest weight.
double against_one_device(dist::MultiWorkerMirrored<strata::place::Cuda>& mw) {
    strata::Model<Cnn, dist::MultiWorkerMirrored<strata::place::Cuda>, double> on_gpus(mw, 3);
    strata::Model<Cnn, dist::Default, double> on_host(3);
    on_gpus.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    on_host.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    auto ds = data(70).batch(14);
    on_gpus.fit(ds, {.epochs = 2, .verbose = 0});
    on_host.fit(ds, {.epochs = 2, .verbose = 0});
    const auto a = on_gpus.get_weights(), b = on_host.get_weights();
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(a[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return diff / scale;
}
}  // namespace

TEST_CASE("2 processes sharing one GPU (a logical GPU each) train through the host staging, equal to the host's one device") {
    namespace pd = strata::place;
    const auto gpu = pd::list_physical_devices(pd::DeviceKind::Gpu).front();
    pd::reset_devices();
    pd::set_logical_device_configuration(gpu, std::vector<pd::LogicalDeviceConfiguration>(std::size_t(processes_here())));
    {
        // NCCL asked for explicitly: refused on every rank, naming the GPU held twice.
        const auto msg = strata_test::error_of<strata::ValueError>([] {
            dist::MultiWorkerMirrored<strata::place::Cuda> nccl(1, {}, {.device_transport = dist::DeviceTransport::Nccl});
        });
        CHECK((strata_test::has(msg, "holds replica 0 of 2 processes") || strata_test::has(msg, "NCCL was not found")));
        dist::MultiWorkerMirrored<strata::place::Cuda> mw(1);  // Auto: the host staging
        CHECK(mw.device_transport() == dist::DeviceTransport::HostStaging);
        CHECK(against_one_device(mw) <= 1e-12);
        CHECK(mw.staged_bytes(0) > 0);
    }
    pd::reset_devices();  // the next case: the GPUs as they are
}

TEST_CASE("MultiWorkerMirrored on GPUs equals the host's one device on the same global batches") {
    if (gpus() < processes_here()) {
        MESSAGE("NCCL across processes needs a GPU for each of the " << processes_here() << " processes here; this host has "
                << gpus() << ": not run");
        return;
    }
    dist::MultiWorkerMirrored<strata::place::Cuda> mw(1);
    CHECK(mw.device_transport() == dist::DeviceTransport::Nccl);
    CHECK(against_one_device(mw) <= 1e-12);
    // The host staging on the same GPUs: the same result.
    dist::MultiWorkerMirrored<strata::place::Cuda> staged(1, {}, {.device_transport = dist::DeviceTransport::HostStaging});
    CHECK(against_one_device(staged) <= 1e-12);
}

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int size = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    const int local = strata::distribute::collective::mpi::local_size();
    if (status != cudaSuccess || count < 1) {
        if (rank == 0)
            std::printf("strata multi-process CUDA test: no GPU for the %d processes on this host (%s); skipping\n", local,
                        status != cudaSuccess ? cudaGetErrorString(status) : "0 GPUs");
        MPI_Finalize();
        return 77;
    }
    doctest::Context context(argc, argv);
    if (rank != 0) context.setOption("minimal", true);
    const int failed = context.run();
    if (failed != 0) MPI_Abort(MPI_COMM_WORLD, failed);
    MPI_Finalize();
    return failed;
}
