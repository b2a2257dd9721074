// GEMM on integer tensors.
// expect: strata::gemm: T must be float or double
#include <strata/strata.hpp>
int main() {
    strata::Tensor<std::int32_t> a({2, 2}), b({2, 2}), c({2, 2});
    strata::gemm(strata::Trans::No, strata::Trans::No, 1, a.view(), b.view(), 0, c.view());
}
