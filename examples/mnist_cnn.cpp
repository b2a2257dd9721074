// The classic MNIST CNN, trained the Keras way on the real MNIST data:
//   Conv2D(32, 3x3, relu) -> MaxPooling2D(2) -> Conv2D(64, 3x3, relu) -> MaxPooling2D(2)
//   -> Flatten -> Dense(64, relu) -> Dense(10, softmax); RMSprop(1e-3); batch 128;
//   shuffle buffer 10000. 121,930 parameters.
//
//   scripts/fetch-mnist data/mnist && build/examples/mnist_cnn --data data/mnist --epochs 3
//   build/examples/mnist_cnn --strategy mirrored --replicas 2 --threads 1 ...
#include <strata/strata.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "cli.hpp"

using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>,
                       Conv2D<32, 3, ReLU>, MaxPooling2D<2>,
                       Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
                       Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
static_assert(Net::num_params == 121930);

namespace {

const char* usage =
    "usage: mnist_cnn [--data DIR] [--epochs N] [--steps-per-epoch N] [--batch-size N] [--threads N]\n"
    "                 [--seed N] [--strategy one_device|mirrored|central_storage] [--replicas N]\n"
    "                 [--save FILE.safetensors] [--json FILE] [--verbose 0|1|2]\n"
    "  --threads N    host threads (default: all cores); with several replicas, threads per replica\n";

struct Report {
    double test_accuracy = 0, test_loss = 0, images_per_second = 0, seconds = 0;
    std::vector<double> epoch_loss, epoch_accuracy, epoch_val_accuracy, epoch_seconds;
};

template <class Strategy>
Report train(Strategy& strategy, const example::Args& args, const strata::data::Mnist& mnist) {
    strata::Model<Net, Strategy> model(strategy, std::uint64_t(args.num("seed")));
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});

    const auto& tr = mnist.train;
    const auto& te = mnist.test;
    auto train = strata::data::Dataset<>::from_arrays(tr.images.data, {28, 28, 1}, tr.labels.data)
                     .shuffle(10000, std::uint64_t(args.num("seed")))
                     .batch(std::size_t(args.num("batch-size")))
                     .prefetch(2);
    auto test = strata::data::Dataset<>::from_arrays(te.images.data, {28, 28, 1}, te.labels.data).batch(1000);

    Report rep;
    auto timer = std::make_shared<strata::train::LambdaCallback>();
    double train_seconds = 0;
    std::int64_t train_images = 0;
    timer->epoch_end = [&](strata::train::TrainingContext&, int, const strata::train::Logs&) {
        // The model's epoch timer stops before validation: images/s counts training only.
        train_seconds += model.last_epoch_seconds();
        train_images += model.last_epoch_examples();
        rep.epoch_seconds.push_back(model.last_epoch_seconds());
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto history = model.fit(train, {.epochs = int(args.num("epochs")),
                                     .steps_per_epoch = args.num("steps-per-epoch"),
                                     .validation_data = test,
                                     .callbacks = {timer},
                                     .verbose = int(args.num("verbose"))});
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto ev = model.evaluate(test);
    rep.test_accuracy = ev.accuracy;
    rep.test_loss = ev.loss;
    rep.images_per_second = train_seconds > 0 ? double(train_images) / train_seconds : 0;
    rep.epoch_loss = history["loss"];
    rep.epoch_accuracy = history["accuracy"];
    rep.epoch_val_accuracy = history["val_accuracy"];
    if (!args.str("save").empty()) model.save(args.str("save"));
    return rep;
}

}  // namespace

int main(int argc, char** argv) {
    example::Args args(argc, argv,
                       {{"data", "data/mnist"}, {"epochs", "6"}, {"steps-per-epoch", "-1"}, {"batch-size", "128"},
                        {"threads", "0"}, {"seed", "42"}, {"strategy", "one_device"}, {"replicas", "1"},
                        {"save", ""}, {"json", ""}, {"verbose", "1"}},
                       usage);
    try {
        const int threads = int(args.num("threads"));
        const int replicas = int(args.num("replicas"));
        const std::string strategy = args.str("strategy");
        strata::set_num_threads(threads);

        const auto mnist = strata::data::load_mnist(args.str("data"));
        std::printf("%s", Net::summary().c_str());
        std::printf("MNIST: %zu training and %zu test images from %s\n", mnist.train.size(), mnist.test.size(),
                    args.str("data").c_str());

        Report rep;
        int used_replicas = 1;
        strata::distribute::StrategyOptions opts{.cores_per_replica = threads};
        if (strategy == "one_device") {
            if (replicas != 1) args.fail("--strategy one_device takes --replicas 1");
            strata::distribute::OneDevice<> s(threads);
            rep = train(s, args, mnist);
        } else if (strategy == "mirrored") {
            strata::distribute::Mirrored<> s(replicas, opts);
            used_replicas = s.num_replicas_in_sync();
            rep = train(s, args, mnist);
        } else if (strategy == "central_storage") {
            strata::distribute::CentralStorage<> s(replicas, opts);
            used_replicas = s.num_replicas_in_sync();
            rep = train(s, args, mnist);
        } else {
            args.fail("unknown --strategy '" + strategy + "' (one_device, mirrored, central_storage)");
        }

        std::printf("\n%-28s %s\n", "strategy", strategy.c_str());
        std::printf("%-28s %d\n", "replicas", used_replicas);
        std::printf("%-28s %d\n", "threads", threads > 0 ? threads : strata::hardware_threads());
        std::printf("%-28s %lld\n", "epochs", args.num("epochs"));
        std::printf("%-28s %lld\n", "batch size", args.num("batch-size"));
        std::printf("%-28s %.2f%%\n", "test accuracy", 100.0 * rep.test_accuracy);
        std::printf("%-28s %.4f\n", "test loss", rep.test_loss);
        std::printf("%-28s %.1f\n", "train images/s", rep.images_per_second);
        std::printf("%-28s %.1f\n", "seconds", rep.seconds);

        if (!args.str("json").empty()) {
            example::Json j;
            j.str("framework", "strata");
            j.str("strategy", strategy);
            j.num("replicas", used_replicas);
            j.num("threads", threads > 0 ? threads : strata::hardware_threads());
            j.num("epochs", double(args.num("epochs")));
            j.num("batch_size", double(args.num("batch-size")));
            j.num("steps_per_epoch", double(args.num("steps-per-epoch")));
            j.num("seed", double(args.num("seed")));
            j.num("test_accuracy", rep.test_accuracy);
            j.num("test_loss", rep.test_loss);
            j.num("train_images_per_second", rep.images_per_second);
            j.num("seconds", rep.seconds);
            j.array("epoch_loss", rep.epoch_loss);
            j.array("epoch_accuracy", rep.epoch_accuracy);
            j.array("epoch_val_accuracy", rep.epoch_val_accuracy);
            j.array("epoch_train_seconds", rep.epoch_seconds);
            if (!j.write(args.str("json"))) {
                std::fprintf(stderr, "error: cannot write %s\n", args.str("json").c_str());
                return 1;
            }
        }
    } catch (const strata::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
