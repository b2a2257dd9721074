// An embedding of an empty vocabulary: the error names the layer and the vocabulary size.
// expect: strata::nn::Embedding<0, 16>
// expect: InputDim (the vocabulary size: ids are in [0, InputDim)) must be >= 1
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8>, Embedding<0, 16>>;
int main() { return int(Net::num_params); }
