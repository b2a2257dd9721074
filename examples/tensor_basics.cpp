// The tensor API in one page: create tensors on the host, fill them with reproducible random
// numbers, multiply, reduce, and apply a softmax. Build: see README.md. --json FILE writes the
// printed figures.
#include <strata/strata.hpp>

#include <cstdio>
#include <string>

#include "../tools/cli.hpp"

int main(int argc, char** argv) {
    CLI::App app{"The tensor API in one page.", "tensor_basics"};
    std::string json;
    app.add_option("--json", json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] {
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
        const double total = double(strata::sum(probs.view()));
        std::printf("sum of all probabilities = %.4f (4 rows of 1)\n", total);
        std::printf("column sums = %.4f, %.4f\n", column_sums[0], column_sums[1]);
        if (!json.empty()) {
            cli::Json j, rows = cli::Json::array();
            for (int i = 0; i < 4; ++i)
                rows.push_back({{"example", i}, {"p_class0", probs.at(i, 0)}, {"p_class1", probs.at(i, 1)}, {"argmax", label[i]}});
            j["rows"] = rows;
            j["sum_of_probabilities"] = total;
            j["column_sums"] = {column_sums[0], column_sums[1]};
            cli::write_json(json, j);
        }
        return 0;
    });
}
