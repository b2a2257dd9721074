// MultiWorkerMirrored on GPUs across processes (NCCL between the processes, one communicator per
// local replica), run by mpirun -np 2. Compiled by nvcc with MPI and NCCL wherever they are
// found; every rank exits 77 (skipped) unless there is a GPU for every process on this host
// (NCCL must not put one GPU twice in a communicator).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <strata/strata.hpp>

#include "cuda_model_data.hpp"
#include <strata/distribute/multi_worker_mirrored.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;

namespace {
using Cnn = strata_test::CudaCnn;
strata::data::Dataset<> data(std::size_t n) { return strata_test::cuda_model_data(n); }
}  // namespace

TEST_CASE("MultiWorkerMirrored on GPUs equals the host's one device on the same global batches") {
    dist::MultiWorkerMirrored<strata::place::Cuda> mw(1);
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
    CHECK(diff / scale <= 1e-12);
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
    if (status != cudaSuccess || count < local) {
        if (rank == 0)
            std::printf("strata multi-process CUDA test: %d GPU(s) for %d processes on this host (%s); skipping\n",
                        status == cudaSuccess ? count : 0, local, status != cudaSuccess ? cudaGetErrorString(status) : "need one each");
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
