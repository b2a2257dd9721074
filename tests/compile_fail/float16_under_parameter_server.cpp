// MixedFloat16's loss scale needs one skip decision for every replica: ParameterServer applies
// each worker's gradient alone, so the combination is refused, naming the policy to use.
// expect: precision::MixedFloat16 needs a strategy whose replicas step together
// expect: use MixedBFloat16
#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
using namespace strata::nn;
using Net = Sequential<Input<4>, Dense<2>>;
int main() {
    strata::distribute::ParameterServer<> ps(2, 1);
    strata::Model<Net, strata::distribute::ParameterServer<>, strata::precision::MixedFloat16> model(ps);
}
