// tools/mnist_cnn: the classic MNIST CNN, trained the Keras way on the real MNIST data:
//   Conv2D(32, 3x3, relu) -> MaxPooling2D(2) -> Conv2D(64, 3x3, relu) -> MaxPooling2D(2)
//   -> Flatten -> Dense(64, relu) -> Dense(10, softmax); RMSprop(1e-3); batch 128;
//   shuffle buffer 10000. 121,930 parameters.
//
// It is tools/strata_train with --model cnn --dataset mnist and RMSprop(1e-3) fixed: the same
// driver (strata_train_driver.cpp) and the seed CNN's units, without the flags that choose (its
// flags, table and JSON are what they have always been). scripts/demo runs it.
//
//   scripts/fetch-mnist data/mnist && build/tools/mnist_cnn --data data/mnist --epochs 3
//   build/tools/mnist_cnn --strategy mirrored --replicas 2 --threads 1 ...
//   build/tools/mnist_cnn --help             every flag, its default and its range
// (more in strata_train_driver.cpp and docs/tools.md)
#include "strata_train_tool.hpp"

int main(int argc, char** argv) {
    using namespace strata_train;
    const Tool tool{.name = "mnist_cnn",
                    .description = "The reference MNIST CNN trained with fit, on any strategy.",
                    .models = {entry<std::tuple_element_t<model_index("cnn"), Models>>()}};
    return run(tool, argc, argv);
}
