// The one unit of test_extern_network that compiles the network's passes (see extern_network.hpp).
#include "extern_network.hpp"

template class strata::nn::Network<extern_network::Cnn, float, strata::place::Host>;
template class strata::nn::Network<extern_network::Cnn, double, strata::place::Host>;
