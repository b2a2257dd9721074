// TensorParallelTokenDense applies its kernel per token: on a flat input (no token axis) it does
// not compile, and the message names the flat layer to use instead.
// expect: on a flat input write TensorParallelDense
#include <strata/nn/layers.hpp>
#include <strata/distribute/tensor_parallel.hpp>
using namespace strata::nn;
using Net = Sequential<Input<16>, strata::distribute::TensorParallelTokenDense<8, ReLU, 2, strata::distribute::Columns>>;
int main() { return int(Net::num_params); }
