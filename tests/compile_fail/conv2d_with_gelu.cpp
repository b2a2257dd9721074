// GELU's derivative needs its input, which a convolution does not keep: the error says what to
// write instead.
// expect: strata::nn::Conv2D<Filters, Kernel, Act>: GELU's derivative needs the pre-activation, which a convolution does not keep
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8, 8, 1>, Conv2D<4, 3, GELU>, Flatten, Dense<2>>;
int main() { return int(Net::num_params); }
