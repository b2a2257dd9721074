// A tensor-parallel attention layer's shard holds whole heads: more shards than heads does not
// compile, and the message says so.
// expect: more shards than heads (a shard holds whole heads)
#include <strata/nn/layers.hpp>
#include <strata/distribute/tensor_parallel_attention.hpp>
using namespace strata::nn;
using Net = Sequential<Input<4, 8>, strata::distribute::TensorParallelMultiHeadAttention<2, 4, 0, 3>>;
int main() { return int(Net::num_params); }
