// ClassToken on an image [28, 28, 1] (tokens expected): the error names the layer, the rank it
// expects and the shape it was given, and says to cut the image into patches first.
// expect: LayerShapeError<strata::nn::ClassToken, strata::nn::AnyShapeOfRank<2>, strata::StaticShape<28, 28, 1>, false>
// expect: after an image write PatchEmbedding first
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>, ClassToken, FirstToken, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
