// The smallest strata program: one Dense(1) unit learns y = x from examples, with mean squared
// error and SGD. Prints the learned weight and bias; --json FILE writes them.
#include <strata/strata.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"

using Net = strata::nn::Sequential<strata::nn::Input<1>, strata::nn::Dense<1>>;

int main(int argc, char** argv) {
    example::Args args(argc, argv, {{"epochs", "50"}, {"json", ""}}, "usage: linear_regression [--epochs N] [--json FILE]\n");
    std::vector<float> x, y;
    for (int i = -50; i <= 50; ++i) {
        x.push_back(float(i) / 50.0f);
        y.push_back(float(i) / 50.0f);  // y = x
    }
    strata::Model<Net> model(/*seed=*/1);
    model.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{.learning_rate = 0.1}, {});
    auto h = model.fit(std::move(x), std::move(y), {.epochs = int(args.num("epochs")), .verbose = 0, .batch_size = 16});
    const auto w = model.get_weights();  // kernel (1, 1), then bias (1,)
    std::printf("%-10s %-12s %-12s %-12s\n", "epochs", "weight", "bias", "final loss");
    std::printf("%-10lld %-12.6f %-12.6f %-12.3g\n", args.num("epochs"), w[0], w[1], h["loss"].back());
    if (!args.str("json").empty()) {
        example::Json j;
        j.num("epochs", double(args.num("epochs")));
        j.num("weight", w[0]);
        j.num("bias", w[1]);
        j.num("final_loss", h["loss"].back());
        if (!j.write(args.str("json"))) return 1;
    }
    return 0;
}
