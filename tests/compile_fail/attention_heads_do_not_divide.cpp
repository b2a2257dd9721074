// MultiHeadAttention with KeyDim 0 (features / NumHeads) where 3 heads do not divide 32
// features: the error names the layer, the features and the heads.
// expect: AttentionHeadsError<strata::nn::MultiHeadAttention<3, 0>, 32, 3, false>
// expect: KeyDim 0 means features / NumHeads, and NumHeads does not divide the features
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<16, 32>, MultiHeadAttention<3, 0>>;
int main() { return int(Net::num_params); }
