// A position embedding of 32 positions on 49 tokens: the error names the layer, the tokens and
// the embedding's length.
// expect: SequenceLengthError<strata::nn::PositionEmbedding<32>, 49, 32, false>
// expect: the input has more tokens than the position embedding has positions
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>, PatchEmbedding<4, 64>, PositionEmbedding<32>>;
int main() { return int(Net::num_params); }
