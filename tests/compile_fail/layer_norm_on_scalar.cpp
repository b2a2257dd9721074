// LayerNormalization bound to a scalar example (rank 0): there is no last axis to normalize.
// The error names the layer, the shape it expects and the shape it was given.
// expect: strata::nn::NonEmptyLastAxis, strata::StaticShape<>, false>
// expect: strata::nn::LayerNormalization: it normalizes the last axis of each example, so the input needs one with at least one value
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using L = LayerNormalization<>::bind<strata::StaticShape<>, float, strata::place::Host>;
int main() { return int(L::num_params); }
