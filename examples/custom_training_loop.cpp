// A custom training loop, as with tf.distribute: the reference MNIST CNN trained with Mirrored
// by hand. Each global batch is split across the replicas by a distributed dataset;
// strategy.run executes the step on every replica (forward, loss, backward, all-reduce,
// update); strategy.reduce combines the per-replica losses.
//
//   build/examples/custom_training_loop --data data/mnist --replicas 2 --epochs 1
#include <strata/strata.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "../tools/cli.hpp"

using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>,
                       Conv2D<32, 3, ReLU>, MaxPooling2D<2>,
                       Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
                       Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
namespace dist = strata::distribute;

int main(int argc, char** argv) {
    CLI::App app{"The reference MNIST CNN trained with Mirrored by a hand-written loop.", "custom_training_loop"};
    std::string data = "data/mnist", json;
    int epochs = 1, replicas = 2, threads = 0;
    std::int64_t steps_per_epoch = -1, batch_size = 128;
    std::uint64_t seed = 42;
    app.add_option("--data", data, "directory with the four MNIST IDX files")->capture_default_str();
    app.add_option("--epochs", epochs, "passes over the training set")->transform(cli::integer(1, 1'000'000))->capture_default_str();
    app.add_option("--steps-per-epoch", steps_per_epoch, "batches per epoch; -1: the whole training set")
        ->transform(cli::integer<std::int64_t>(-1, 1'000'000'000))->capture_default_str();
    app.add_option("--batch-size", batch_size, "the global batch (split over the replicas)")
        ->transform(cli::integer<std::int64_t>(1, 1'000'000))->capture_default_str();
    app.add_option("--replicas", replicas, "replicas in sync")->transform(cli::integer(1, 1024))->capture_default_str();
    app.add_option("--threads", threads, "threads per replica (0: the cores shared out)")
        ->transform(cli::integer(0, 4096))->capture_default_str();
    app.add_option("--seed", seed, "seed of the weights and the shuffle")
        ->transform(cli::integer<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()))->capture_default_str();
    app.add_option("--json", json, "also write the figures as JSON to FILE");
    return cli::run(app, argc, argv, [&] {
        if (steps_per_epoch == 0)
            throw cli::usage_error("--steps-per-epoch: expected -1 (the whole training set) or a count >= 1, found 0");
        const auto mnist = strata::data::load_mnist(data);
        dist::Mirrored<> strategy(replicas, {.cores_per_replica = threads});
        strata::Model<Net, dist::Mirrored<>> model(strategy, seed);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});

        auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1}, mnist.train.labels.data)
                         .shuffle(10000, seed)
                         .batch(std::size_t(batch_size))   // the GLOBAL batch
                         .prefetch(2);
        auto distributed = dist::distribute_dataset(strategy, train);

        std::printf("%-6s %-8s %-12s %-10s %-10s\n", "epoch", "steps", "train loss", "seconds", "images/s");
        std::vector<double> epoch_loss, epoch_seconds, epoch_images_per_second;
        std::vector<std::int64_t> epoch_steps;
        double images_per_second = 0;
        for (int epoch = 0; epoch < epochs; ++epoch) {
            const auto t0 = std::chrono::steady_clock::now();
            double loss_sum = 0;
            std::int64_t seen = 0, steps = 0;
            for (auto it = distributed.iterate(std::uint64_t(epoch)); it != std::default_sentinel; ++it) {
                if (steps_per_epoch > 0 && steps >= steps_per_epoch) break;
                const auto batch = *it;
                model.begin_step();
                // Runs on every replica's thread, with that replica's share of the batch.
                auto per_replica = strategy.run([&](dist::ReplicaContext& ctx) {
                    const double loss = model.compute_gradients(ctx, batch[ctx.replica_id_in_sync_group()]);
                    model.apply_gradients(ctx);  // all-reduce, then the same update on every replica
                    return loss;
                });
                loss_sum += strategy.reduce(dist::ReduceOp::Sum, per_replica);
                model.end_step(batch.global_size());
                seen += batch.global_size();
                ++steps;
            }
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            images_per_second = double(seen) / secs;
            epoch_loss.push_back(loss_sum / double(seen));
            epoch_steps.push_back(steps);
            epoch_seconds.push_back(secs);
            epoch_images_per_second.push_back(images_per_second);
            std::printf("%-6d %-8lld %-12.4f %-10.1f %-10.1f\n", epoch + 1, (long long)steps, epoch_loss.back(), secs,
                        images_per_second);
        }
        const auto test = strata::data::Dataset<>::from_arrays(mnist.test.images.data, {28, 28, 1}, mnist.test.labels.data).batch(1000);
        const auto ev = model.evaluate(test);
        std::printf("\n%-24s %d\n%-24s %.2f%%\n%-24s %.4f\n", "replicas", strategy.num_replicas_in_sync(), "test accuracy",
                    100 * ev.accuracy, "test loss", ev.loss);
        if (!json.empty()) {
            cli::Json j;
            j["strategy"] = "mirrored";
            j["replicas"] = strategy.num_replicas_in_sync();
            j["test_accuracy"] = ev.accuracy;
            j["test_loss"] = ev.loss;
            j["train_images_per_second"] = images_per_second;
            j["epoch_loss"] = epoch_loss;
            j["epoch_steps"] = epoch_steps;
            j["epoch_seconds"] = epoch_seconds;
            j["epoch_images_per_second"] = epoch_images_per_second;
            cli::write_json(json, j);
        }
        return 0;
    });
}
