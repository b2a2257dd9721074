#pragma once
// The seed CNN that tools/mnist_cnn trains, alone: the benchmarks that time its step include this
// header and compile the network's passes in their own unit (tools/mnist_cnn.hpp, for the tool's
// units, declares them compiled once, in mnist_cnn_train.cpp).
#include <strata/nn/layers.hpp>

namespace mnist_example {

using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>,
                       Conv2D<32, 3, ReLU>, MaxPooling2D<2>,
                       Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
                       Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
static_assert(Net::num_params == 121930);

}  // namespace mnist_example
