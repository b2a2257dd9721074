// A Model whose second argument is not a strategy.
// expect: strata::Model<Net, Strategy, T>: Strategy must be a strategy
#include <strata/strata.hpp>
using Net = strata::nn::Sequential<strata::nn::Input<4>, strata::nn::Dense<2>>;
int main() {
    strata::Model<Net, strata::place::Host> model;
}
