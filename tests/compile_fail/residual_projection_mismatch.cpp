// A projection shortcut of stride 1 beside a branch of stride 2: the error names the block, the
// residual branch and its output shape, the projection and its output shape.
// expect: ResidualShapeError<strata::nn::Residual<strata::nn::Projection<8, 1, false>, strata::nn::Conv2D<8, 3, strata::nn::ReLU, 2, strata::nn::Padding::Same, true>, strata::nn::ReLU>, strata::nn::ResidualBranch<strata::nn::Conv2D<8, 3, strata::nn::ReLU, 2, strata::nn::Padding::Same, true> >, strata::StaticShape<4, 4, 8>, strata::nn::Projection<8>, strata::StaticShape<8, 8, 8>, false>
// expect: strata::nn::Residual: the Projection shortcut must give the residual branch's output shape
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8, 8, 4>, Residual<Projection<8>, Conv2D<8, 3, ReLU, 2, Padding::Same>, ReLU>, GlobalAveragePooling2D,
                       Dense<10, Softmax>>;
int main() { return int(Net::num_params); }
