// A custom training loop, as with tf.distribute: the reference MNIST CNN trained with Mirrored
// by hand. Each global batch is split across the replicas by a distributed dataset;
// strategy.run executes the step on every replica (forward, loss, backward, all-reduce,
// update); strategy.reduce combines the per-replica losses.
//
//   build/examples/custom_training_loop --data data/mnist --replicas 2 --epochs 1
#include <strata/strata.hpp>

#include <chrono>
#include <cstdio>

#include "cli.hpp"

using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>,
                       Conv2D<32, 3, ReLU>, MaxPooling2D<2>,
                       Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
                       Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
namespace dist = strata::distribute;

int main(int argc, char** argv) {
    example::Args args(argc, argv,
                       {{"data", "data/mnist"}, {"epochs", "1"}, {"steps-per-epoch", "-1"}, {"batch-size", "128"},
                        {"replicas", "2"}, {"threads", "0"}, {"seed", "42"}, {"json", ""}},
                       "usage: custom_training_loop [--data DIR] [--epochs N] [--steps-per-epoch N] [--batch-size N]\n"
                       "                            [--replicas N] [--threads N per replica] [--seed N] [--json FILE]\n");
    try {
        const auto mnist = strata::data::load_mnist(args.str("data"));
        dist::Mirrored<> strategy(int(args.num("replicas")), {.cores_per_replica = int(args.num("threads"))});
        strata::Model<Net, dist::Mirrored<>> model(strategy, std::uint64_t(args.num("seed")));
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});

        auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1}, mnist.train.labels.data)
                         .shuffle(10000, std::uint64_t(args.num("seed")))
                         .batch(std::size_t(args.num("batch-size")))   // the GLOBAL batch
                         .prefetch(2);
        auto distributed = dist::distribute_dataset(strategy, train);

        std::printf("%-6s %-8s %-12s %-10s %-10s\n", "epoch", "steps", "train loss", "seconds", "images/s");
        std::vector<double> epoch_loss;
        double images_per_second = 0;
        for (int epoch = 0; epoch < int(args.num("epochs")); ++epoch) {
            const auto t0 = std::chrono::steady_clock::now();
            double loss_sum = 0;
            std::int64_t seen = 0, steps = 0;
            for (auto it = distributed.iterate(std::uint64_t(epoch)); it != std::default_sentinel; ++it) {
                if (args.num("steps-per-epoch") > 0 && steps >= args.num("steps-per-epoch")) break;
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
            std::printf("%-6d %-8lld %-12.4f %-10.1f %-10.1f\n", epoch + 1, (long long)steps, epoch_loss.back(), secs,
                        images_per_second);
        }
        const auto test = strata::data::Dataset<>::from_arrays(mnist.test.images.data, {28, 28, 1}, mnist.test.labels.data).batch(1000);
        const auto ev = model.evaluate(test);
        std::printf("\n%-24s %d\n%-24s %.2f%%\n%-24s %.4f\n", "replicas", strategy.num_replicas_in_sync(), "test accuracy",
                    100 * ev.accuracy, "test loss", ev.loss);
        if (!args.str("json").empty()) {
            example::Json j;
            j.str("strategy", "mirrored");
            j.num("replicas", strategy.num_replicas_in_sync());
            j.num("test_accuracy", ev.accuracy);
            j.num("test_loss", ev.loss);
            j.num("train_images_per_second", images_per_second);
            j.array("epoch_loss", epoch_loss);
            if (!j.write(args.str("json"))) return 1;
        }
    } catch (const strata::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
