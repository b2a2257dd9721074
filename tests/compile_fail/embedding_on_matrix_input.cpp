// Embedding on [tokens, features] examples (rank 2): it takes [tokens] ids; the error names the
// layer, the rank it expects and the shape it was given.
// expect: LayerShapeError<strata::nn::Embedding<100, 16>, strata::nn::AnyShapeOfRank<1>, strata::StaticShape<8, 4>, false>
// expect: the input must be [tokens] integer ids per example (rank 1
#include <strata/nn/layers.hpp>
using namespace strata::nn;
using Net = Sequential<Input<8, 4>, Embedding<100, 16>>;
int main() { return int(Net::num_params); }
