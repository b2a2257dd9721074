// A 3x3 average pooling with valid padding over a 2x5 image: the error names the layer, the
// smallest image it takes and the image it was given.
// expect: LayerShapeError<strata::nn::AveragePooling2D<3>, strata::nn::AtLeastSpatial<3, 3>, strata::StaticShape<2, 5, 1>, false>
// expect: strata::nn::AveragePooling2D: with Padding::Valid the image must be at least as large as the window
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<2, 5, 1>, AveragePooling2D<3>, Flatten, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
