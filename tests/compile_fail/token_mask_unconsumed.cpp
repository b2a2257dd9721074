// An Embedding that masks padding (mask_zero) with nothing to consume the mask before a
// per-token output: the padded tokens' predictions would reach a loss that takes no mask.
// expect: TokenMaskUnconsumedError
// expect: the token mask reaches the model's output
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8>, Embedding<100, 16, EmbeddingOptions{.mask_zero = true}>, TokenDense<100, Softmax>>;
int main() {
    Network<Net, float, strata::place::Host> net;
    return int(net.first_layer());
}
