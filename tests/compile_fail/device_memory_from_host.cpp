// Reading device memory from host code without a copy.
// expect: this place's memory is not accessible from host code
#include <strata/strata.hpp>
int main() {
    strata::TensorView<float, strata::place::Cuda> y(nullptr, strata::Shape{4});
    return int(y[0]);
}
