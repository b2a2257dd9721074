// PatchEmbedding on tokens [49, 64] instead of an image: the error names the layer, the rank it
// expects and the shape it was given.
// expect: LayerShapeError<strata::nn::PatchEmbedding<4, 64>, strata::nn::AnyShapeOfRank<3>, strata::StaticShape<49, 64>, false>
// expect: strata::nn::PatchEmbedding: the input must be an image, rank 3 per example
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<49, 64>, PatchEmbedding<4, 64>>;
int main() { return int(Net::num_params); }
