// tools/mnist_cnn without CUDA: nvcc was not found when the program was configured, so
// --device gpu is an error that says so (mnist_cnn_gpu.cu is the unit that trains on the GPU).
#include "mnist_cnn.hpp"

namespace mnist_example {

bool built_with_cuda() { return false; }

Report train_on_gpu(const Flags&, const strata::data::Mnist&, int&) {
    throw strata::ValueError("--device gpu: this build of mnist_cnn has no CUDA (nvcc was not found when it was configured; "
                             "install the CUDA toolkit and reconfigure with -Dcuda=enabled)");
}

}  // namespace mnist_example
