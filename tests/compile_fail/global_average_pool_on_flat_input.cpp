// Global average pooling over the flat output of a Dense layer: the error names the layer, the
// rank it expects (an image, rank 3) and the flat shape it was given.
// expect: LayerShapeError<strata::nn::GlobalAveragePooling2D, strata::nn::AnyShapeOfRank<3>, strata::StaticShape<64>, false>
// expect: strata::nn::GlobalAveragePooling2D: the input must be an image, rank 3 per example
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<784>, Dense<64, ReLU>, GlobalAveragePooling2D, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
