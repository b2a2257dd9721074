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
#include <strata/distribute/multi_worker_mirrored.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;

namespace {
using Cnn = Sequential<Input<8, 8, 1>, Conv2D<4, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<8, Tanh>, Dense<3, Softmax>>;

strata::data::Dataset<> data(std::size_t n) {
    std::vector<float> x(n * 64);
    std::vector<std::int32_t> y(n);
    std::uint64_t s = 12345;
    for (auto& v : x) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v = float(s >> 40) / float(1 << 24);
    }
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((x[i * 64] + x[i * 64 + 9] > 1.0f) + (x[i * 64 + 30] > 0.5f));
    return strata::data::Dataset<>::from_arrays(x, {8, 8, 1}, y);
}
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
