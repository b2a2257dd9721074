// A tiny downstream program: includes the umbrella header, multiplies two matrices and checks
// the answer. Exit 0 when the library works from this way of consuming it.
#include <strata/strata.hpp>

#include <cstdio>

int main() {
    auto a = strata::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    auto b = strata::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
    strata::Tensor<float> c({2, 2});
    strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view());
    const bool ok = c.at(0, 0) == 4 && c.at(0, 1) == 5 && c.at(1, 0) == 10 && c.at(1, 1) == 11 &&
                    strata::sum(c.view()) == 30.0;
    std::printf("consumer: c = [[%g, %g], [%g, %g]] -> %s\n", c.at(0, 0), c.at(0, 1), c.at(1, 0), c.at(1, 1),
                ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
