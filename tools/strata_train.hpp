#pragma once
// What the units of tools/strata_train (and tools/mnist_cnn, the same program with its choices
// fixed) share: the flags, the job, the report and the training function. The command line
// (flags, data, table, JSON) is in strata_train_driver.cpp, compiled once; each model's
// trainers are in units of their own, compiled once per model of strata_train_models.hpp
// (tools/meson.build): the in-process strategies in strata_train_in_process.cpp, the same on
// the GPU in strata_train_gpu.cu (nvcc), the parameter-server modes in strata_train_ps.cpp,
// the pipeline and hybrid in strata_train_pipeline.cpp and MultiWorkerMirrored (which needs
// MPI) in strata_train_mw.cpp, so that they compile in parallel (compile time is part of the
// product) and a build without MPI still has the rest.
#include <strata/strata.hpp>
#include <strata/distribute/parameter_server_stats.hpp>
#include <strata/distribute/settings.hpp>

#include "strata_train_tool.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <csignal>

namespace strata_train {

/// Every flag of the program, with its default.
struct Flags {
    // strata_train only (mnist_cnn: the first model, the first dataset, RMSprop(1e-3))
    std::string model{model_names[0]};
    std::string dataset{datasets[0].name};
    std::string optimizer = "rmsprop";
    double learning_rate = 0;  // 0: the optimizer's default (Keras's: sgd 0.01, rmsprop and adam 0.001)
    double momentum = 0;       // sgd, rmsprop
    double weight_decay = 0.004;        // adamw (Keras's default)
    double global_clipnorm = 0;         // 0: off
    std::string lr_schedule = "constant";  // --lr-schedule: constant | cosine (linear warm-up, then cosine decay to 0)
    double warmup_epochs = 0;           // cosine: epochs of linear warm-up from 0
    std::string sync_batch_norm = "auto";  // auto | on | off: statistics over every replica's share
    int tensor_parallel = 1;               // --tensor-parallel N: the model's layers split over N logical devices (1: whole)
    bool sync_bn = false;                  // what auto resolved to (check_flags)
    std::string augment = "auto";          // auto (the model's recipe) | on | off
    bool augmenting = false;               // what auto resolved to
    int augment_pad = 2;                   // zero padding before the random crop
    // --precision: what the layers compute in (strata/core/precision.hpp; both programs). One
    // Model<Net, Strategy, precision::Any> serves every policy: chosen at run time (set_precision).
    std::string precision = "float32";
    strata::precision::Compute compute = strata::precision::Compute::Float32;  // what check_flags parsed
    std::string data;          // empty: the dataset's default directory (data/mnist, data/fashion_mnist)
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
    // pipeline × tensor across processes (strata_train --tensor-parallel N --strategy pipeline |
    // hybrid under mpirun): each shard sends 1/N of a message between stages, gathered there
    std::string scatter_gather = "on";
};

/// What a trainer trains: the flags, the data, and what the driver made of them.
struct Job {
    const Flags& flags;
    const ModelEntry& model;
    const Dataset& dataset;
    const strata::data::Mnist& data;
    strata::optim::Optimizer optimizer;  // make_optimizer(): the one place the flags become an optimizer
    std::string optimizer_text;          // its description, for the backup's configuration
};

/// A trainer's figures, for the table and the JSON.
struct Report {
    double test_accuracy = 0, test_loss = 0, images_per_second = 0, seconds = 0;
    double test_images_per_second = 0;  // evaluate() over the test set, batch 1000, after training
    std::vector<double> epoch_loss, epoch_accuracy, epoch_val_accuracy, epoch_seconds;
    std::optional<strata::distribute::ParameterServerStats> ps;  // parameter_server only
    strata::train::History history;
    int interrupted_by = 0;  // SIGINT or SIGTERM stopped training (the state was saved if --save)
    std::optional<strata::train::TrainingPosition> resumed_from;  // --backup-dir held a backup
    int epochs_done = 0;
    // The precision the model trained under (its dtype_policy()), its optimizer updates, and
    // under mixed_float16 the dynamic loss scale's state after training.
    strata::precision::Compute compute = strata::precision::Compute::Float32;
    std::int64_t optimizer_iterations = 0;
    strata::optim::LossScaleState loss_scale{};
    // --tensor-parallel N across processes: the sums the split layers made on this process over
    // the whole run (training, validation, the test evaluation) and the bytes they summed, and
    // their gathers (the split variables' gradients) and the bytes gathered.
    std::int64_t tensor_parallel_sums = 0, tensor_parallel_bytes = 0;
    std::int64_t tensor_parallel_gathers = 0, tensor_parallel_gathered_bytes = 0;
    // A pipeline across processes: the messages this process sent its neighbouring stages, and
    // the bytes of their values (distribute::PipelineStats), over the whole run (training,
    // validation, the test evaluation).
    std::int64_t pipeline_messages = 0, pipeline_message_bytes = 0;
};

// Across processes (every strategy: multi_worker_mirrored, parameter_server, pipeline, hybrid):
// the flags that change the result or the files written, which every process must have alike
// (the model, the dataset, the precision and the optimizer too).
// main() hands them to strata::distribute::set_job_settings before any strategy is built, and
// every process group compares them when its ranks join, before anything else crosses
// processes: one place for every strategy, so that a new one cannot forget them (issue 41:
// pipeline and hybrid once compared none, and a rank with another --seed trained to garbage
// with exit status 0). The strategies compare their own settings themselves, each named once
// (--replicas, --transport, --timeout-ms; --workers, --servers, --sync, --k, --staleness,
// --straggler, --clock, --shards; --stages, --micro-batches, --schedule); --threads, --verbose
// and --data (a path per host; the data's size is compared) may differ.
inline strata::distribute::collective::Settings shared_settings(const Flags& f, const strata::data::Mnist& mnist,
                                                                const std::string& optimizer_text) {
    return {{"--batch-size", std::to_string(f.batch_size)},
            {"--seed", std::to_string(f.seed)},
            {"--epochs", std::to_string(f.epochs)},
            {"--steps-per-epoch", std::to_string(f.steps_per_epoch)},
            {"--load", f.load},
            // Rank 0 writes every file: a file named on another rank only would not be written.
            {"--save", f.save},
            {"--json", f.json},
            {"--plot", f.plot},
            {"--tensorboard", f.tensorboard},
            {"--backup-dir", f.backup_dir},
            {"--backup-every-steps", std::to_string(f.backup_every_steps)},
            {"--backup-force", f.backup_force ? "given" : ""},
            {"--model", f.model},
            // The split layers' shards pair up across processes: one split on every rank.
            {"--tensor-parallel", std::to_string(f.tensor_parallel)},
            {"--dataset", f.dataset},
            {"--sync-batch-norm", f.sync_bn ? "on" : "off"},
            {"--precision", f.precision},
            {"--augment", f.augmenting ? "pad " + std::to_string(f.augment_pad) : "off"},
            {"optimizer", optimizer_text},  // --optimizer, --learning-rate, --momentum
            {"training images", std::to_string(mnist.train.size())},
            {"test images", std::to_string(mnist.test.size())}};
}

/// What train() does that does not depend on the strategy, compiled once (strata_train_driver.cpp) rather
/// than in every model's unit: the datasets, the callbacks (the epoch timer, Ctrl-C and SIGTERM,
/// NaN, --backup-dir, --tensorboard) and the report.
class Session {
public:
    /// `replicas_in_sync`: the strategy's, for the backup's configuration (-1: it has none);
    /// `epoch_figures()`: the model's last epoch's training seconds and examples.
    Session(const Job& job, int replicas_in_sync, std::function<std::pair<double, std::int64_t>()> epoch_figures);
    strata::data::Dataset<> train, test;
    strata::train::CallbackList callbacks;
    /// fit's options: --epochs, --steps-per-epoch, --verbose, the test set, the callbacks.
    strata::FitOptions<> fit_options(int initial_epoch) const;
    /// After fit: its history, how long it took, the epochs done. Returns whether a signal
    /// stopped training (then save, and report as it stands).
    bool trained(const strata::train::History& history, double seconds, int epochs_done);
    /// After the save: releases the signal handlers (a signal during the final evaluation ends
    /// the process); returns whether one came before.
    bool release_signals();
    /// The final evaluation's figures; `ps`, the parameter server's statistics when it has them.
    Report finish(const strata::Evaluation& ev, double eval_seconds, std::optional<strata::distribute::ParameterServerStats> ps);
    Report& report() { return rep_; }

private:
    Report rep_;
    strata::train::History history_;
    double train_seconds_ = 0;
    std::int64_t train_images_ = 0;
    const Flags& flags_;
    std::shared_ptr<strata::train::StopOnSignal> stop_;
    std::shared_ptr<strata::train::BackupAndRestore> backup_;
    std::function<std::pair<double, std::int64_t>()> epoch_figures_;
};

/// Trains `job`'s model, Net, under `strategy` with fit, saves what --save asks for, evaluates.
/// One Model per network and strategy whatever --precision says (precision::Any: the policy is a
/// run-time choice, set before compile; check_flags refused what set_precision would refuse).
template <class Net, class Strategy>
Report train(Strategy& strategy, const Job& job) {
    const Flags& flags = job.flags;
    strata::Model<Net, Strategy, strata::precision::Any> model(strategy, flags.seed);
    model.set_precision(flags.compute);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, job.optimizer);
    int replicas = -1;
    if constexpr (requires { strategy.num_replicas_in_sync(); }) replicas = strategy.num_replicas_in_sync();
    // The model's epoch timer stops before validation: images/s counts training only.
    Session session(job, replicas, [&] { return std::pair{model.last_epoch_seconds(), model.last_epoch_examples()}; });
    if (!flags.load.empty()) model.load(flags.load);
    const auto t0 = std::chrono::steady_clock::now();
    auto history = model.fit(session.train, session.fit_options(model.epoch()));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The precision and the loss scale's state after training (every return below reports them).
    session.report().compute = model.dtype_policy();
    session.report().optimizer_iterations = model.optimizer_iterations();
    session.report().loss_scale = model.loss_scale();
    auto pipeline_traffic = [&] {  // (again after the test set's evaluation: the whole run's)
        if constexpr (requires { model.gradient_path().pipeline_stats(); }) {
            session.report().pipeline_messages = model.gradient_path().pipeline_stats().messages_sent;
            session.report().pipeline_message_bytes = model.gradient_path().pipeline_stats().message_bytes_sent;
        }
    };
    pipeline_traffic();
    if (session.trained(history, seconds, model.epoch())) {  // Ctrl-C or SIGTERM: save what --save asks for, report
        if (!flags.save.empty()) model.save(flags.save);
        return session.report();
    }
    // Saved now, while a signal still waits for the save to end; then the handlers are released,
    // so that a signal during the final evaluation ends the process at once (its default action)
    // instead of being swallowed: what --save asked for is already written.
    if (!flags.save.empty()) model.save(flags.save);
    if (session.release_signals()) return session.report();
    // The timed evaluation of the test set after training (inference throughput).
    const auto e0 = std::chrono::steady_clock::now();
    const auto ev = model.evaluate(session.test);
    const double eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    pipeline_traffic();
    std::optional<strata::distribute::ParameterServerStats> ps;
    if constexpr (requires { model.gradient_path().stats(); }) ps = model.gradient_path().stats();
    return session.finish(ev, eval_seconds, ps);
}

/// This process's rank in the MPI job (MPI is initialized by the call), for the strategies
/// across processes: only rank 0 prints and writes files. A usage error where the build has no MPI.
int multi_worker_rank();
/// Ends an MPI job whose rank 0 finished (report and files written) but that lost a rank:
/// prints `why` and calls MPI_Abort(MPI_COMM_WORLD, status), so that the launcher ends every
/// process, a stopped one too (mpirun --enable-recovery otherwise waits for it for ever), and
/// the job's status is non-zero. Returns `status` where the build has no MPI.
int end_job_with_lost_ranks(const std::string& program, const std::string& why, int status);

}  // namespace strata_train
