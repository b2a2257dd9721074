// A stage boundary after the last layer.
// expect: split::At<starts...>: a stage boundary that does not exist
#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
using namespace strata::nn;
using Net = Sequential<Input<4>, Dense<3, ReLU>, Dense<2, Softmax>>;
int main() {
    using S = strata::distribute::Pipeline<strata::place::Host, strata::distribute::OneFOneB, strata::distribute::split::At<2>>;
    S pipeline;
    strata::Model<Net, S> model(pipeline);
}
