// An identity residual block whose branch (a valid 3x3 convolution to 8 channels) changes the
// shape of its 8x8x4 input: the error names the block, the residual branch and its output shape,
// the identity shortcut and the input shape, and says what to change.
// expect: ResidualShapeError<strata::nn::Residual<strata::nn::Conv2D<8, 3, strata::nn::ReLU, 1, strata::nn::Padding::Valid, true> >, strata::nn::ResidualBranch<strata::nn::Conv2D<8, 3, strata::nn::ReLU, 1, strata::nn::Padding::Valid, true> >, strata::StaticShape<6, 6, 8>, strata::nn::IdentityShortcut, strata::StaticShape<8, 8, 4>, false>
// expect: strata::nn::Residual: the residual branch must give back its input's shape
// expect: or give the block a Projection<Filters, Stride> shortcut
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8, 8, 4>, Residual<Conv2D<8, 3, ReLU>>, GlobalAveragePooling2D, Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
