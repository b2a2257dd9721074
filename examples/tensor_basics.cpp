// The tensor API in one page: create tensors on the host, fill them with reproducible random
// numbers, multiply, reduce, and apply a softmax. Build: see README.md.
#include <strata/strata.hpp>

#include <cstdio>

int main() {
    strata::Tensor<float> x({4, 3});                    // 4 examples, 3 features
    strata::Tensor<float> w({3, 2});                    // a 3 -> 2 linear map
    strata::random_uniform(x.view(), -1.0f, 1.0f, /*seed=*/1);
    strata::random_normal(w.view(), 0.0f, 0.5f, /*seed=*/2);

    strata::Tensor<float> logits({4, 2});
    strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, x.view(), w.view(), 0.0f, logits.view());

    auto bias = strata::from_vector<float>({0.1f, -0.1f}, {2});
    strata::add_bias(logits.view(), bias.view());       // broadcast over rows

    strata::Tensor<float> probs({4, 2});
    strata::softmax(logits.view(), probs.view());
    strata::Tensor<std::int32_t> label({4});
    strata::argmax_rows(probs.view(), label.view());

    strata::Tensor<float> column_sums({2});
    strata::sum(probs.view(), /*axis=*/0, column_sums.view());

    std::printf("%-8s %-10s %-10s %s\n", "example", "p(class0)", "p(class1)", "argmax");
    for (int i = 0; i < 4; ++i) std::printf("%-8d %-10.4f %-10.4f %d\n", i, probs.at(i, 0), probs.at(i, 1), label[i]);
    std::printf("sum of all probabilities = %.4f (4 rows of 1)\n", double(strata::sum(probs.view())));
    std::printf("column sums = %.4f, %.4f\n", column_sums[0], column_sums[1]);
}
