// A layer of your own in a Sequential: examples/prelu.hpp defines PReLU (a learned slope for
// negative inputs) against the Layer concept, and this program trains a small regression network
// with it, y = |x0| + x1^2 / 2 from two inputs, with Keras's fit. It prints the loss per epoch,
// the model summary (PReLU has its own row and variables) and the learned slopes; --json FILE
// writes the same figures. --loss huber trains with a user-defined loss instead of MSE
// (examples/huber.hpp, a strata::loss::Custom). docs/extending.md walks through both.
//
//   build/examples/custom_layer --epochs 20 --loss huber
#include <strata/strata.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "../tools/cli.hpp"
#include "huber.hpp"
#include "prelu.hpp"

using namespace strata::nn;
using Net = Sequential<Input<2>, Dense<32>, example::PReLU, Dense<16>, example::PReLU, Dense<1>>;

int main(int argc, char** argv) {
    CLI::App app{"Trains a network with a user-defined layer (PReLU, examples/prelu.hpp).", "custom_layer"};
    int epochs = 30;
    std::uint64_t seed = 7;
    std::string json;
    std::string loss_name = "mse";
    app.add_option("--epochs", epochs, "passes over the 2048 examples")->transform(cli::integer(1, 100'000))->capture_default_str();
    app.add_option("--seed", seed, "seed of the data and the weights")
        ->transform(cli::integer<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()))->capture_default_str();
    app.add_option("--loss", loss_name, "mse (built in) or huber (user-defined, examples/huber.hpp)")
        ->check(cli::one_of({"mse", "huber"}))->capture_default_str();
    app.add_option("--json", json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] {
        // The data: 2048 points in [-1, 1]^2 and their targets.
        std::vector<float> x(2 * 2048), y(2048);
        strata::Tensor<float> r({2 * 2048});
        strata::random_uniform(r.view(), -1.0f, 1.0f, seed);
        for (std::size_t i = 0; i < y.size(); ++i) {
            x[2 * i] = r[std::int64_t(2 * i)];
            x[2 * i + 1] = r[std::int64_t(2 * i + 1)];
            y[i] = std::abs(x[2 * i]) + 0.5f * x[2 * i + 1] * x[2 * i + 1];
        }

        std::printf("%s", Net::summary().c_str());
        strata::Model<Net> model(seed);
        const strata::loss::Loss chosen = loss_name == "huber" ? strata::loss::Loss{example::huber(1.0)}
                                                               : strata::loss::Loss{strata::loss::MeanSquaredError{}};
        model.compile(chosen, strata::optim::Adam{.learning_rate = 3e-3}, {});
        const auto h = model.fit(std::move(x), std::move(y), {.epochs = epochs, .verbose = 0, .batch_size = 64});

        std::printf("\n%-8s loss (%s)\n", "epoch", strata::loss::name(chosen));
        const auto& loss = h["loss"];
        for (std::size_t e = 0; e < loss.size(); ++e)
            if (e < 3 || (e + 1) % 10 == 0 || e + 1 == loss.size()) std::printf("%-8zu %.6f\n", e + 1, loss[e]);

        // The learned slopes: the variables named p_re_lu/alpha and p_re_lu_1/alpha.
        const auto weights = model.get_weights();
        std::vector<std::pair<std::string, std::vector<double>>> alphas;
        for (const auto& p : Net::parameters())
            if (p.name.find("alpha") != std::string::npos)
                alphas.push_back({p.name, std::vector<double>(weights.begin() + p.offset, weights.begin() + p.offset + p.shape.size())});
        std::printf("\n%-18s %-8s %-8s %-8s %s\n", "variable", "min", "mean", "max", "(initial 0.25)");
        cli::Json slopes = cli::Json::object();
        for (const auto& [name, a] : alphas) {
            const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
            const double mean = std::accumulate(a.begin(), a.end(), 0.0) / double(a.size());
            std::printf("%-18s %-8.4f %-8.4f %-8.4f\n", name.c_str(), *lo, mean, *hi);
            slopes[name] = {{"min", *lo}, {"mean", mean}, {"max", *hi}};
        }
        if (!json.empty()) {
            cli::Json j;
            j["layer"] = "PReLU";
            j["loss"] = strata::loss::name(chosen);
            j["epochs"] = epochs;
            j["seed"] = seed;
            j["num_params"] = Net::num_params;
            j["epoch_loss"] = loss;
            j["final_loss"] = loss.back();
            j["alpha"] = slopes;
            cli::write_json(json, j);
        }
        return 0;
    });
}
