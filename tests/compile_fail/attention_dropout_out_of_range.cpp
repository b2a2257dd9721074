// MultiHeadAttention's dropout is a probability of dropping an attention weight: 1 (or more, or a
// negative rate) does not compile, and the message says what the rate must be.
// expect: MultiHeadAttentionOptions::dropout is the probability of dropping an attention weight in training and must be in [0, 1)
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<4, 8>, MultiHeadAttention<2, 4, 0, MultiHeadAttentionOptions{.dropout = 1.0}>>;
int main() { return int(Net::num_params); }
