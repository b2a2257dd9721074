// A compile-time policy is fixed: only precision::Any chooses the precision at run time.
// expect: the precision is fixed at compile time
// expect: only precision::Any chooses it at run time
#include <strata/strata.hpp>
using namespace strata::nn;
using Net = Sequential<Input<4>, Dense<2>>;
int main() {
    strata::Model<Net, strata::distribute::OneDevice<>, strata::precision::MixedBFloat16> model;
    model.set_precision(strata::precision::Compute::Float16);
}
