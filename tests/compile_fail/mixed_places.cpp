// An op whose operands live on different places.
// expect: all operands of an op must live on the same place
#include <strata/strata.hpp>
int main() {
    strata::Tensor<float> x({4});
    strata::TensorView<float, strata::place::Cuda> y(nullptr, strata::Shape{4});
    strata::map(x.view(), y, [](float v) { return v; });
}
