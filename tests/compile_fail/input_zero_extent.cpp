// An input shape with a zero extent.
// expect: strata::nn::Input<D...>: every extent must be positive
#include <strata/strata.hpp>
using Net = strata::nn::Sequential<strata::nn::Input<28, 0, 1>, strata::nn::Flatten, strata::nn::Dense<2>>;
int main() { return int(Net::num_params); }
