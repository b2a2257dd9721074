// The smallest strata program: one Dense(1) unit learns y = x from examples, with mean squared
// error and SGD. Prints the learned weight and bias; --json FILE writes them.
#include <strata/strata.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "../tools/cli.hpp"

using Net = strata::nn::Sequential<strata::nn::Input<1>, strata::nn::Dense<1>>;

int main(int argc, char** argv) {
    CLI::App app{"One Dense(1) unit learns y = x with SGD.", "linear_regression"};
    int epochs = 50;
    std::string json;
    app.add_option("--epochs", epochs, "passes over the 101 examples")->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--json", json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] {
        std::vector<float> x, y;
        for (int i = -50; i <= 50; ++i) {
            x.push_back(float(i) / 50.0f);
            y.push_back(float(i) / 50.0f);  // y = x
        }
        strata::Model<Net> model(/*seed=*/1);
        model.compile(strata::loss::MeanSquaredError{}, strata::optim::SGD{.learning_rate = 0.1}, {});
        auto h = model.fit(std::move(x), std::move(y), {.epochs = epochs, .verbose = 0, .batch_size = 16});
        const auto w = model.get_weights();  // kernel (1, 1), then bias (1,)
        std::printf("%-10s %-12s %-12s %-12s\n", "epochs", "weight", "bias", "final loss");
        std::printf("%-10d %-12.6f %-12.6f %-12.3g\n", epochs, w[0], w[1], h["loss"].back());
        if (!json.empty()) {
            cli::Json j;
            j["epochs"] = epochs;
            j["weight"] = w[0];
            j["bias"] = w[1];
            j["final_loss"] = h["loss"].back();
            cli::write_json(json, j);
        }
        return 0;
    });
}
