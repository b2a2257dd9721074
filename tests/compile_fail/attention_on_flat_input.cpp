// MultiHeadAttention on a flat example (32 features, no token axis): it takes [tokens, features].
// expect: strata::nn::AnyShapeOfRank<2>, strata::StaticShape<32>, false>
// expect: strata::nn::MultiHeadAttention: the input must be [tokens, features] per example (rank 2)
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<32>, MultiHeadAttention<4, 8>>;
int main() { return int(Net::num_params); }
