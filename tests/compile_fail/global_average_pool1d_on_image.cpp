// GlobalAveragePooling1D on an image [28, 28, 1] (tokens expected): the error names the layer,
// the rank it expects and the shape it was given, and points to GlobalAveragePooling2D.
// expect: LayerShapeError<strata::nn::GlobalAveragePooling1D, strata::nn::AnyShapeOfRank<2>, strata::StaticShape<28, 28, 1>, false>
// expect: on an image [H, W, C] write GlobalAveragePooling2D
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>, GlobalAveragePooling1D, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
