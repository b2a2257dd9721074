// LayerNormalization bound to examples whose last axis has no value (an empty feature axis).
// expect: strata::nn::NonEmptyLastAxis, strata::StaticShape<4, 0>, false>
// expect: strata::nn::LayerNormalization: it normalizes the last axis of each example
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using L = LayerNormalization<>::bind<strata::StaticShape<4, 0>, float, strata::place::Host>;
int main() { return int(L::num_params); }
