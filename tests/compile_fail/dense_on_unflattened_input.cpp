// A Dense layer straight after a convolution, without Flatten: the error names the layer, the
// shape it expects (rank 1) and the image shape it was given.
// expect: LayerShapeError<strata::nn::Dense<10, strata::nn::Softmax>, strata::nn::AnyShapeOfRank<1>, strata::StaticShape<26, 26, 32>, false>
// expect: strata::nn::Dense: the input must be flat (rank 1 per example); put Flatten before Dense
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
