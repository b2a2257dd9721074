// A layer that cannot carry the token mask (ClassToken adds a token the mask does not cover)
// between a masking Embedding and the pooling that consumes the mask: the error names the layer
// and its index.
// expect: TokenMaskLayerError<strata::nn::detail::ClassTokenImpl
// expect: does not carry it
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8>, Embedding<100, 16, EmbeddingOptions{.mask_zero = true}>, ClassToken, GlobalAveragePooling1D,
                       Dense<2, Softmax>>;
int main() {
    Network<Net, float, strata::place::Host> net;
    return int(net.first_layer());
}
