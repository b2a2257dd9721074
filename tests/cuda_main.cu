// The doctest main of every CUDA test binary: exits 77 (Meson: skipped) when no GPU is usable,
// so CI compiles the CUDA suite on machines without one and runs it where one is present.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cuda_runtime.h>

int main(int argc, char** argv) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        std::printf("strata CUDA tests: no usable GPU (%s); skipping\n",
                    status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
