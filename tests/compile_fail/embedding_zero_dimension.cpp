// An embedding of zero features: the error names the layer and which dimension must be >= 1.
// expect: strata::nn::Embedding<100, 0>
// expect: OutputDim (the features of each id's row) must be >= 1
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8>, Embedding<100, 0>>;
int main() { return int(Net::num_params); }
