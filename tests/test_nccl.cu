// NCCL all-reduce across every visible GPU. Has its own main: exits 77 (Meson: skipped) when
// no CUDA device can be found, so it is compiled everywhere and run where a GPU exists.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <strata/distribute/collective/nccl.hpp>

#if !defined(STRATA_HAS_NCCL)
#error "test_nccl.cu needs NCCL: <nccl.h> was not found (add the CUDA include directory)"
#endif

#include <cstdio>
#include <numeric>
#include <span>
#include <vector>

namespace coll = strata::distribute::collective;
using coll::detail::cuda_check;

namespace {

int visible_devices() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// One device buffer and stream per GPU, freed on scope exit.
template <class T>
struct PerDevice {
    std::vector<int> devices;
    std::vector<T*> buffers;
    std::vector<cudaStream_t> streams;

    PerDevice(std::vector<int> devs, std::size_t count) : devices(std::move(devs)) {
        for (int d : devices) {
            cuda_check(cudaSetDevice(d), "cudaSetDevice");
            T* p = nullptr;
            cuda_check(cudaMalloc(&p, (count > 0 ? count : 1) * sizeof(T)), "cudaMalloc");
            buffers.push_back(p);
            cudaStream_t s = nullptr;
            cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
            streams.push_back(s);
        }
    }
    ~PerDevice() {
        for (std::size_t i = 0; i < devices.size(); ++i) {
            cudaSetDevice(devices[i]);
            cudaStreamDestroy(streams[i]);
            cudaFree(buffers[i]);
        }
    }
    PerDevice(const PerDevice&) = delete;
    PerDevice& operator=(const PerDevice&) = delete;
};

template <class T>
T input(int member, std::size_t i) {
    return static_cast<T>(member + 1) + static_cast<T>(i % 7);
}

}  // namespace

int main(int argc, char** argv) {
    if (visible_devices() == 0) {
        std::printf("test_nccl: no CUDA device visible; skipped\n");
        return 77;
    }
    doctest::Context context;
    context.applyCommandLine(argc, argv);
    return context.run();
}

TEST_CASE_TEMPLATE("NcclCommunicator: all_reduce Sum and Mean across all visible GPUs", T, float,
                   double) {
    const int n = visible_devices();
    std::vector<int> devices(static_cast<std::size_t>(n));
    std::iota(devices.begin(), devices.end(), 0);
    coll::NcclCommunicator comm(devices);
    REQUIRE(comm.size() == n);

    for (std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{1} << 22}) {
        for (auto op : {coll::ReduceOp::Sum, coll::ReduceOp::Mean}) {
            INFO("count ", count, ", ", coll::to_string(op), ", ", n, " GPUs");
            PerDevice<T> mem(devices, count);
            std::vector<T> host(count);
            for (int m = 0; m < n; ++m) {
                for (std::size_t i = 0; i < count; ++i) host[i] = input<T>(m, i);
                cuda_check(cudaMemcpy(mem.buffers[m], host.data(), count * sizeof(T),
                                      cudaMemcpyHostToDevice),
                           "cudaMemcpy");
            }
            comm.all_reduce(std::span<T* const>(mem.buffers), count, op,
                            std::span<const cudaStream_t>(mem.streams));
            comm.synchronize(std::span<const cudaStream_t>(mem.streams));

            for (int m = 0; m < n; ++m) {
                cuda_check(cudaMemcpy(host.data(), mem.buffers[m], count * sizeof(T),
                                      cudaMemcpyDeviceToHost),
                           "cudaMemcpy");
                std::size_t bad = 0;
                for (std::size_t i = 0; i < count; ++i) {
                    double want = 0;
                    for (int q = 0; q < n; ++q) want += static_cast<double>(input<T>(q, i));
                    if (op == coll::ReduceOp::Mean) want /= n;
                    // Small integers (and their mean) are exact in float: no tolerance needed
                    // beyond the one rounding of the mean.
                    if (std::abs(static_cast<double>(host[i]) - want) > 1e-6 * std::abs(want)) ++bad;
                }
                INFO("member ", m);
                CHECK(bad == 0);
            }
        }
    }
}

TEST_CASE("NcclCommunicator: a device that does not exist is a DeviceError") {
    const int n = visible_devices();
    CHECK_THROWS_AS(coll::NcclCommunicator({n + 3}), strata::DeviceError);
    CHECK_THROWS_AS(coll::NcclCommunicator(std::vector<int>{}), strata::ValueError);
}

TEST_CASE("NcclCommunicator: a wrong number of buffers is a ShapeError") {
    coll::NcclCommunicator comm({0});
    std::vector<float*> none;
    std::vector<cudaStream_t> streams{nullptr};
    CHECK_THROWS_AS(comm.all_reduce(std::span<float* const>(none), 1, coll::ReduceOp::Sum,
                                    std::span<const cudaStream_t>(streams)),
                    strata::ShapeError);
}
