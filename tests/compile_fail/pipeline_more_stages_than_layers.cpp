// A pipeline of more stages than the model has layers.
// expect: more stages than layers
#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
using namespace strata::nn;
using Net = Sequential<Input<4>, Dense<3, ReLU>, Dense<2, Softmax>>;
int main() {
    using S = strata::distribute::Pipeline<strata::place::Host, strata::distribute::GPipe, strata::distribute::split::Balanced<3>>;
    S pipeline;
    strata::Model<Net, S> model(pipeline);
}
