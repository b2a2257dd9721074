#pragma once
// What the translation units of tools/mnist_cnn share: the network, the flags, the report and
// the training function. The command line (flags, JSON) is in mnist_cnn.cpp, the in-process
// strategies in mnist_cnn_train.cpp, the same on the GPU in mnist_cnn_gpu.cu (nvcc), the
// parameter-server modes in mnist_cnn_ps.cpp and
// MultiWorkerMirrored (which needs MPI) in mnist_cnn_mw.cpp, so that they compile in parallel
// (compile time is part of the product) and a build without MPI still has the rest.
#include <strata/strata.hpp>
#include <strata/distribute/parameter_server_stats.hpp>
#include <strata/distribute/settings.hpp>
#include <strata/train/tensorboard.hpp>  // opt-in: not part of strata.hpp

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <csignal>

namespace mnist_example {

using namespace strata::nn;
using Net = Sequential<Input<28, 28, 1>,
                       Conv2D<32, 3, ReLU>, MaxPooling2D<2>,
                       Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
                       Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
static_assert(Net::num_params == 121930);

/// Every flag of the program, with its default.
struct Flags {
    std::string data = "data/mnist";
    int epochs = 6;
    std::int64_t steps_per_epoch = -1;  // -1: one full pass over the training set
    std::int64_t batch_size = 128;
    int threads = 0;                    // 0: all cores
    std::uint64_t seed = 42;
    std::string strategy = "one_device";
    int replicas = 1;
    bool replicas_given = false;  // --replicas on the command line (GPU: else one replica per logical GPU)
    // auto: the GPU where one is usable and the strategy trains there, else the CPU
    std::string device = "auto";
    int logical_gpus = 0;    // --device gpu: carve N logical GPUs from the first one (0: the GPUs as they are)
    int gpu_memory_mb = 0;   // --device gpu: memory limit of the GPU, shared evenly by its logical GPUs (0: none)
    std::string save;
    std::string load;
    std::string json;
    int verbose = 1;
    std::string plot;
    std::string tensorboard;
    int timeout_ms = 60000;  // collectives among replicas and processes
    // multi_worker_mirrored only
    std::string transport = "auto";
    std::string backup_dir;                // BackupAndRestore: a relaunch with the same flags resumes
    std::int64_t backup_every_steps = 0;   // 0: back up at every epoch end
    bool backup_force = false;             // resume a backup made with other flags
    // parameter_server only
    int workers = 2;
    int servers = 1;
    int shards = 0;  // 0: variables whole
    std::string sync = "async";
    int k = 0;
    int staleness = -1;
    std::string straggler = "none";
    std::string clock = "real";
    // pipeline and hybrid only
    int stages = 2;
    int micro_batches = 4;
    std::string schedule = "gpipe";
};

// Flags that only mean something for --strategy parameter_server.
struct Report {
    double test_accuracy = 0, test_loss = 0, images_per_second = 0, seconds = 0;
    double test_images_per_second = 0;  // evaluate() over the test set, batch 1000, after training
    std::vector<double> epoch_loss, epoch_accuracy, epoch_val_accuracy, epoch_seconds;
    std::optional<strata::distribute::ParameterServerStats> ps;  // parameter_server only
    strata::train::History history;
    int interrupted_by = 0;  // SIGINT or SIGTERM stopped training (the state was saved if --save)
    std::optional<strata::train::TrainingPosition> resumed_from;  // --backup-dir held a backup
    int epochs_done = 0;
};

// Across processes (multi_worker_mirrored, parameter_server): the flags that change the result
// or the files written, which every process must have alike (compared when the processes join,
// before anything else crosses processes). The strategy compares its own settings itself
// (--replicas, --transport, --timeout-ms; --workers, --servers, --sync, --k, --staleness,
// --straggler, --clock, --shards); --threads and --verbose may differ.
inline strata::distribute::collective::Settings shared_settings(const Flags& f, const strata::data::Mnist& mnist) {
    return {{"--batch-size", std::to_string(f.batch_size)},
            {"--seed", std::to_string(f.seed)},
            {"--epochs", std::to_string(f.epochs)},
            {"--steps-per-epoch", std::to_string(f.steps_per_epoch)},
            {"--load", f.load},
            {"--save", f.save},
            {"--json", f.json},
            {"--plot", f.plot},
            {"--tensorboard", f.tensorboard},
            {"--backup-dir", f.backup_dir},
            {"--backup-every-steps", std::to_string(f.backup_every_steps)},
            {"--backup-force", f.backup_force ? "given" : ""},
            {"training images", std::to_string(mnist.train.size())},
            {"test images", std::to_string(mnist.test.size())}};
}

template <class Strategy>
Report train(Strategy& strategy, const Flags& flags, const strata::data::Mnist& mnist) {
    strata::Model<Net, Strategy> model(strategy, flags.seed);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});

    const auto& tr = mnist.train;
    const auto& te = mnist.test;
    auto train = strata::data::Dataset<>::from_arrays(tr.images.data, {28, 28, 1}, tr.labels.data)
                     .shuffle(10000, flags.seed)
                     .batch(std::size_t(flags.batch_size))
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
    if (!flags.load.empty()) model.load(flags.load);
    // Ctrl-C or SIGTERM: finish the step in progress, save what --save asks for, report.
    auto stop = std::make_shared<strata::train::StopOnSignal>();
    // A NaN or infinite loss or weight ends training with an error instead of training on it.
    strata::train::CallbackList callbacks{timer, stop, std::make_shared<strata::train::TerminateOnNaN>()};
    std::shared_ptr<strata::train::BackupAndRestore> backup;
    if (!flags.backup_dir.empty()) {
        // First, so that the backup is restored before any other callback starts.
        // The flags that change the trajectory: a backup made under others is refused (--backup-force: resumed).
        std::map<std::string, std::string> config{
            {"strategy", flags.strategy}, {"batch size", std::to_string(flags.batch_size)}, {"seed", std::to_string(flags.seed)},
            {"steps per epoch", std::to_string(flags.steps_per_epoch)}, {"training images", std::to_string(mnist.train.size())},
            {"model", std::to_string(Net::num_params) + " parameters"}, {"optimizer", "RMSprop(learning_rate=0.001)"}};
        if constexpr (requires { strategy.num_replicas_in_sync(); })
            config["replicas in sync"] = std::to_string(strategy.num_replicas_in_sync());
        if (flags.strategy == "parameter_server")
            for (const auto& [k, v] : std::map<std::string, std::string>{
                     {"workers", std::to_string(flags.workers)}, {"servers", std::to_string(flags.servers)},
                     {"shards", std::to_string(flags.shards)}, {"sync", flags.sync}, {"k", std::to_string(flags.k)},
                     {"staleness", std::to_string(flags.staleness)}, {"straggler", flags.straggler}, {"clock", flags.clock}})
                config[k] = v;
        backup = std::make_shared<strata::train::BackupAndRestore>(
            flags.backup_dir, strata::train::BackupOptions{.save_every_steps = flags.backup_every_steps,
                                                           .config = config,
                                                           .allow_config_change = flags.backup_force});
        callbacks.insert(callbacks.begin(), backup);
    }
    if (!flags.tensorboard.empty()) callbacks.push_back(std::make_shared<strata::train::TensorBoard>(flags.tensorboard));
    const auto t0 = std::chrono::steady_clock::now();
    auto history = model.fit(train, {.epochs = flags.epochs,
                                     .steps_per_epoch = flags.steps_per_epoch,
                                     .validation_data = test,
                                     .callbacks = callbacks,
                                     .verbose = flags.verbose,
                                     .initial_epoch = model.epoch()});
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (backup) rep.resumed_from = backup->restored();
    rep.epochs_done = model.epoch();
    if (stop->interrupted()) {
        rep.interrupted_by = stop->signal_number();
        if (!flags.save.empty()) model.save(flags.save);
        return rep;
    }
    // Saved now, while a signal still waits for the save to end; then the handlers are released,
    // so that a signal during the final evaluation ends the process at once (its default action)
    // instead of being swallowed: what --save asked for is already written.
    if (!flags.save.empty()) model.save(flags.save);
    stop->release();
    if (stop->interrupted()) {
        rep.interrupted_by = stop->signal_number();
        return rep;
    }
    // The timed evaluation of the test set after training (inference throughput).
    const auto e0 = std::chrono::steady_clock::now();
    const auto ev = model.evaluate(test);
    const double eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    rep.test_images_per_second = eval_seconds > 0 ? double(ev.examples) / eval_seconds : 0;
    rep.test_accuracy = ev.accuracy;
    rep.test_loss = ev.loss;
    rep.images_per_second = train_seconds > 0 ? double(train_images) / train_seconds : 0;
    if (!history.epoch.empty()) {  // --epochs 0, or a checkpoint that already has them: evaluation only
        rep.epoch_loss = history["loss"];
        rep.epoch_accuracy = history["accuracy"];
        rep.epoch_val_accuracy = history["val_accuracy"];
    }
    rep.history = history;
    if constexpr (requires { model.gradient_path().stats(); }) rep.ps = model.gradient_path().stats();
    return rep;
}

/// --strategy one_device, mirrored or central_storage (mnist_cnn_train.cpp): `replicas_in_sync`
/// gets the replicas the strategy runs.
Report train_in_process(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync);

/// --strategy parameter_server (mnist_cnn_ps.cpp): one instantiation for every sync mode (sync::Any).
Report train_parameter_server(const Flags& f, const strata::data::Mnist& mnist);

/// --strategy pipeline or hybrid (mnist_cnn_pipeline.cpp): `replicas_in_sync` gets --replicas.
Report train_pipeline(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync);

/// --strategy multi_worker_mirrored (mnist_cnn_mw.cpp): `replicas_in_sync` gets processes ×
/// --replicas. Throws a usage error where the build has no MPI.
Report train_multi_worker(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync);
/// This process's rank in the MPI job (MPI is initialized by the call), for
/// --strategy multi_worker_mirrored: only rank 0 prints and writes files.
int multi_worker_rank();

/// --device gpu (mnist_cnn_gpu.cu, compiled by nvcc): --strategy one_device, mirrored or
/// central_storage with CUDA tensors. Where nvcc was not found, mnist_cnn_nogpu.cpp throws an
/// error saying the program was built without CUDA.
Report train_on_gpu(const Flags& f, const strata::data::Mnist& mnist, int& replicas_in_sync);
/// Whether the GPU unit is in this program.
bool built_with_cuda();

}  // namespace mnist_example
