// A layer that cannot carry the token mask (Flatten merges the tokens the mask marks) after a
// masking Embedding: the error names the layer and its index, as Keras refuses a layer without
// supports_masking.
// expect: TokenMaskLayerError<strata::nn::detail::FlattenImpl
// expect: does not carry it
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8>, Embedding<100, 16, EmbeddingOptions{.mask_zero = true}>, Flatten, Dense<2, Softmax>>;
int main() {
    Network<Net, float, strata::place::Host> net;
    return int(net.first_layer());
}
