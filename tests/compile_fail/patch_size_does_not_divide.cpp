// A patch size that does not divide the image (5 into 28): the error names the layer, the image
// and the patch size (a valid strided convolution would silently drop the last 3 rows and columns).
// expect: PatchSizeError<strata::nn::PatchEmbedding<5, 64>, strata::StaticShape<28, 28, 1>, 5, false>
// expect: Patch must divide the image's height and width
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>, PatchEmbedding<5, 64>, GlobalAveragePooling1D, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
