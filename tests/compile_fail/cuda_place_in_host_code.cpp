// Using place::Cuda in a translation unit that nvcc does not compile.
// expect: strata::place::Cuda can only be used in a translation unit compiled by nvcc
#include <strata/strata.hpp>
int main() {
    strata::Tensor<float> x({4});
    auto y = strata::copy_to<strata::place::Cuda>(x.view());
}
