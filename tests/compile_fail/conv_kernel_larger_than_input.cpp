// A 3x3 convolution with valid padding over a 2x5 image: the error names the layer, the
// smallest image it takes and the image it was given.
// expect: LayerShapeError<strata::nn::Conv2D<8, 3, strata::nn::ReLU>, strata::nn::AtLeastSpatial<3, 3>, strata::StaticShape<2, 5, 1>, false>
// expect: with Padding::Valid the image must be at least as large as the kernel
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<2, 5, 1>, Conv2D<8, 3, ReLU>, Flatten, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
