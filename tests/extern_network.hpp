#pragma once
// A network compiled once for a whole program (docs/building.md, "Compile a network once"):
// extern_network_instance.cpp instantiates its passes, test_extern_network.cpp only declares them.
#include <strata/strata.hpp>

namespace extern_network {
using namespace strata::nn;
// Every kind of layer whose pass a path drives differently: a convolution fused with its
// pooling, Flatten (a view), Dropout (its own random stream), two Dense.
using Cnn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<7, Tanh>, Dropout<25>,
                       Dense<3, Softmax>>;
}  // namespace extern_network

extern template class strata::nn::Network<extern_network::Cnn, float, strata::place::Host>;
extern template class strata::nn::Network<extern_network::Cnn, double, strata::place::Host>;
