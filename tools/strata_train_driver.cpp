// The driver of tools/strata_train and tools/mnist_cnn (strata_train with its choices fixed):
// the flags, the data, the table and the JSON, compiled once for both programs and for every
// model; the models' trainers are in their own units (strata_train.hpp). Here the flags become
// a Job: the model (strata_train_models.hpp), the dataset, the optimizer (make_optimizer) and
// its learning rate (make_learning_rate).
//
//   build/tools/strata_train --model cnn --dataset fashion_mnist --epochs 3
//   build/tools/strata_train --optimizer sgd --learning-rate 0.05 --momentum 0.9
//   build/tools/strata_train --help          the models, the datasets, every flag and its range
//
// Every strategy, as mnist_cnn has them (mnist_cnn.cpp):
//   scripts/fetch-mnist data/mnist && build/tools/mnist_cnn --data data/mnist --epochs 3
//   build/tools/mnist_cnn --strategy mirrored --replicas 2 --threads 1 ...
//   mpirun -np 2 build/tools/mnist_cnn --strategy multi_worker_mirrored --replicas 1 (...)
//       (--replicas per process; rank 0 prints and writes the files)
//   build/tools/mnist_cnn --strategy parameter_server --workers 4 --servers 2 --sync kbatch_sync --k 2
//       --straggler exp:20 --clock virtual ...   (--batch-size is per worker; steps count updates)
//   mpirun -np 4 build/tools/mnist_cnn --strategy parameter_server --workers 2 --servers 1 ...
//       (the same job across processes: rank 0 the coordinator, 1..S the servers, then the workers)
//   build/tools/mnist_cnn --plot curves.svg  training curves (loss, accuracy per epoch) as SVG
//   build/tools/mnist_cnn --tensorboard logs  TensorBoard scalars (tensorboard --logdir logs)
//   build/tools/mnist_cnn --backup-dir run1 --backup-every-steps 100   killed? the same command resumes
#include "strata_train.hpp"

#include <strata/train/plot.hpp>         // opt-in: not part of strata.hpp
#include <strata/train/tensorboard.hpp>  // opt-in too; only this unit makes the callback

#include "cli.hpp"

#include <strata/distribute/launcher.hpp>   // mpirun -np 4 of a one-process strategy is refused
#include <strata/distribute/straggler.hpp>  // --straggler is checked with the flags
#ifdef STRATA_TRAIN_HAVE_MPI
#include <strata/distribute/collective/process_group.hpp>  // the rank, MPI_Abort
#endif

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <vector>

namespace strata_train {

// The training images: shuffled, augmented with --augment (a random crop after zero padding,
// and on Fashion-MNIST a horizontal flip; digits are not symmetric), batched. The draws depend
// on --seed, the epoch and the example's place in it only: every strategy sees the same images.
strata::data::Dataset<> training_data(const Job& job) {
    const Flags& f = job.flags;
    auto ds = strata::data::Dataset<>::from_arrays(job.data.train.images.data, {28, 28, 1}, job.data.train.labels.data)
                  .shuffle(10000, f.seed);
    if (f.augmenting)
        ds = ds.augment({.pad = f.augment_pad, .flip = job.dataset.name == "fashion_mnist", .seed = f.seed});
    return ds.batch(std::size_t(f.batch_size)).prefetch(2);
}

Session::Session(const Job& job, int replicas_in_sync, std::function<std::pair<double, std::int64_t>()> epoch_figures)
    : train(training_data(job)),
      test(strata::data::Dataset<>::from_arrays(job.data.test.images.data, {28, 28, 1}, job.data.test.labels.data).batch(1000)),
      flags_(job.flags),
      epoch_figures_(std::move(epoch_figures)) {
    const Flags& flags = job.flags;
    auto timer = std::make_shared<strata::train::LambdaCallback>();
    timer->epoch_end = [this](strata::train::TrainingContext&, int, const strata::train::Logs&) {
        const auto [seconds, examples] = epoch_figures_();
        train_seconds_ += seconds;
        train_images_ += examples;
        rep_.epoch_seconds.push_back(seconds);
    };
    // Ctrl-C or SIGTERM: finish the step in progress, save what --save asks for, report.
    stop_ = std::make_shared<strata::train::StopOnSignal>();
    // A NaN or infinite loss or weight ends training with an error instead of training on it.
    callbacks = {timer, stop_, std::make_shared<strata::train::TerminateOnNaN>()};
    if (!flags.backup_dir.empty()) {
        // First, so that the backup is restored before any other callback starts.
        // The flags that change the trajectory: a backup made under others is refused (--backup-force: resumed).
        std::map<std::string, std::string> config{
            {"strategy", flags.strategy}, {"batch size", std::to_string(flags.batch_size)}, {"seed", std::to_string(flags.seed)},
            {"steps per epoch", std::to_string(flags.steps_per_epoch)}, {"training images", std::to_string(job.data.train.size())},
            {"model", std::to_string(job.model.num_params) + " parameters"}, {"optimizer", job.optimizer_text}};
        // strata_train's choices, where they are not mnist_cnn's (whose backups stay as they were).
        if (flags.model != model_names[0]) config["model name"] = flags.model;
        if (flags.dataset != datasets[0].name) config["dataset"] = flags.dataset;
        if (replicas_in_sync >= 0) config["replicas in sync"] = std::to_string(replicas_in_sync);
        // A policy other than float32 changes the arithmetic (float32's backups read as they did).
        if (flags.compute != strata::precision::Compute::Float32) config["precision"] = flags.precision;
        // The split changes the order of the sums over shards.
        if (flags.tensor_parallel > 1) config["tensor parallel"] = std::to_string(flags.tensor_parallel);
        if (flags.strategy == "parameter_server")
            for (const auto& [k, v] : std::map<std::string, std::string>{
                     {"workers", std::to_string(flags.workers)}, {"servers", std::to_string(flags.servers)},
                     {"shards", std::to_string(flags.shards)}, {"sync", flags.sync}, {"k", std::to_string(flags.k)},
                     {"staleness", std::to_string(flags.staleness)}, {"straggler", flags.straggler}, {"clock", flags.clock}})
                config[k] = v;
        // The cut and the schedule change the arithmetic's order (the micro-batches' sums): a
        // backup resumed under others would not go on bit for bit, and once did without a word.
        if (flags.strategy == "pipeline" || flags.strategy == "hybrid") {
            config["stages"] = std::to_string(flags.stages);
            config["micro-batches"] = std::to_string(flags.micro_batches);
            config["schedule"] = flags.schedule;
        }
        backup_ = std::make_shared<strata::train::BackupAndRestore>(
            flags.backup_dir, strata::train::BackupOptions{.save_every_steps = flags.backup_every_steps,
                                                           .config = config,
                                                           .allow_config_change = flags.backup_force});
        callbacks.insert(callbacks.begin(), backup_);
    }
    if (!flags.tensorboard.empty()) callbacks.push_back(std::make_shared<strata::train::TensorBoard>(flags.tensorboard));
}

strata::FitOptions<> Session::fit_options(int initial_epoch) const {
    return {.epochs = flags_.epochs,
            .steps_per_epoch = flags_.steps_per_epoch,
            .validation_data = test,
            .callbacks = callbacks,
            .verbose = flags_.verbose,
            .initial_epoch = initial_epoch};
}

bool Session::trained(const strata::train::History& history, double seconds, int epochs_done) {
    rep_.seconds = seconds;
    if (backup_) rep_.resumed_from = backup_->restored();
    rep_.epochs_done = epochs_done;
    history_ = history;
    if (!stop_->interrupted()) return false;
    rep_.interrupted_by = stop_->signal_number();
    return true;
}

bool Session::release_signals() {
    stop_->release();
    // Across processes a signal that reached one rank between fit's last agreement and here
    // must send every rank down the same branch: the evaluation that follows is collective.
    // (Not the parameter server's: its ranks evaluate on their own, and a sum over every rank
    // would wait for a lost worker.)
    if (flags_.strategy != "parameter_server") strata::distribute::agree_stop({stop_->interrupted(), stop_->signal_number()});
    if (!stop_->interrupted()) return false;
    rep_.interrupted_by = stop_->signal_number();
    return true;
}

Report Session::finish(const strata::Evaluation& ev, double eval_seconds, std::optional<strata::distribute::ParameterServerStats> ps) {
    rep_.test_images_per_second = eval_seconds > 0 ? double(ev.examples) / eval_seconds : 0;
    rep_.test_accuracy = ev.accuracy;
    rep_.test_loss = ev.loss;
    rep_.images_per_second = train_seconds_ > 0 ? double(train_images_) / train_seconds_ : 0;
    if (!history_.epoch.empty()) {  // --epochs 0, or a checkpoint that already has them: evaluation only
        rep_.epoch_loss = history_["loss"];
        rep_.epoch_accuracy = history_["accuracy"];
        rep_.epoch_val_accuracy = history_["val_accuracy"];
    }
    rep_.history = history_;
    rep_.ps = std::move(ps);
    return rep_;
}

#ifdef STRATA_TRAIN_HAVE_MPI
int multi_worker_rank() { return strata::distribute::collective::mpi::world_rank(); }

int end_job_with_lost_ranks(const std::string& program, const std::string& why, int status) {
    std::fprintf(stderr, "%s: %s: ending the job (MPI_Abort, exit status %d) so that no process waits for it\n", program.c_str(),
                 why.c_str(), status);
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    return status;
}
#else
// Built without MPI: the strategies exist in the library, but this program was not linked with MPI.
int multi_worker_rank() {
    throw cli::usage_error("--strategy multi_worker_mirrored: this build has no MPI (install libopenmpi-dev and reconfigure)");
}
int end_job_with_lost_ranks(const std::string&, const std::string&, int status) { return status; }
#endif

namespace {

const std::vector<std::string> ps_only = {"--workers", "--servers", "--shards", "--sync", "--k", "--staleness", "--straggler", "--clock"};

/// "a, b, c": the names of `items` (for --help and the messages).
template <class Items>
std::string names_of(const Items& items) {
    std::string list;
    for (const auto& item : items) list += (list.empty() ? "" : ", ") + std::string(item.name);
    return list;
}

/// The dataset --dataset names (checked by its flag's validator).
const Dataset& dataset_named(const std::string& name) {
    for (const Dataset& d : datasets)
        if (d.name == name) return d;
    throw cli::usage_error("--dataset: expected one of " + names_of(datasets) + "; found '" + name + "'");
}

/// The model --model names (checked by its flag's validator).
const ModelEntry& model_named(const Tool& tool, const std::string& name) {
    for (const ModelEntry& m : tool.models)
        if (m.name == name) return m;
    throw cli::usage_error("--model: expected one of " + names_of(tool.models) + "; found '" + name + "'");
}

/// --help's text before the flags: the program, then (strata_train) its models and datasets.
std::string description(const Tool& tool) {
    std::string text(tool.description);
    if (!tool.choices) return text;
    const auto list = [&](const char* title, const auto& items, std::string_view first) {
        text += "\n\n";
        text += title;
        for (const auto& item : items) {
            std::string line = "  " + std::string(item.name);
            line.append(line.size() < 18 ? 18 - line.size() : 1, ' ');
            text += "\n" + line + std::string(item.description) + (item.name == first ? " (the default)" : "");
        }
    };
    list("Models (--model NAME; tools/strata_train_models.hpp lists them):", tool.models, tool.models.front().name);
    list("Datasets (--dataset NAME; 28x28 grey images, 10 classes):", datasets, datasets[0].name);
    return text + "\n";
}

/// Declares the flags on `app`. A new strategy's knobs go here (their ranges in the validator,
/// combinations in check_flags), so that --help lists them and nothing is read by hand.
void declare_flags(CLI::App& app, Flags& f, const Tool& tool) {
    if (tool.choices) {
        std::vector<std::string> models, sets;
        for (const ModelEntry& m : tool.models) models.emplace_back(m.name);
        for (const Dataset& d : datasets) sets.emplace_back(d.name);
        f.model = models.front();
        app.add_option("--model", f.model, "the model to train (listed above)")->check(cli::one_of(models))->capture_default_str();
        app.add_option("--dataset", f.dataset, "the dataset to train on (listed above)")->check(cli::one_of(sets))->capture_default_str();
        app.add_option("--data", f.data, "directory with the dataset's four IDX files (default: data/DATASET: data/mnist, "
                                         "data/fashion_mnist; scripts/fetch-mnist DIR, scripts/fetch-fashion-mnist DIR)");
        // Another optimizer: its name here and in make_optimizer; its own knobs beside --momentum.
        app.add_option("--optimizer", f.optimizer, "the optimizer, with Keras's defaults for what no flag sets (default: the "
                                                   "model's recipe; rmsprop for cnn, adamw for resnet)")
            ->check(cli::one_of({"rmsprop", "adam", "sgd", "adamw"}));
        app.add_option("--learning-rate", f.learning_rate, "the learning rate, a cosine schedule's peak (default: the model's "
                                                           "recipe, else the optimizer's, Keras's: rmsprop, adam and adamw 0.001, sgd 0.01)")
            ->transform(cli::number(0, 1e6));
        app.add_option("--momentum", f.momentum, "sgd, rmsprop: momentum in [0, 1)")->transform(cli::number(0, 1))->capture_default_str();
        app.add_option("--weight-decay", f.weight_decay, "adamw: decoupled weight decay (w -= w * weight_decay * lr each step; "
                                                         "default: the model's recipe, else Keras's 0.004)")
            ->transform(cli::number(0, 1e6));
        app.add_option("--global-clipnorm", f.global_clipnorm, "scale the reduced gradient to this global norm when above it "
                                                               "(Keras's global_clipnorm; 0: off)")
            ->transform(cli::number(0, 1e12))->capture_default_str();
        app.add_option("--lr-schedule", f.lr_schedule, "learning-rate schedule: constant, or cosine (Keras's CosineDecay: linear "
                                                 "warm-up from 0 over --warmup-epochs, then cosine decay to 0 at the last step)")
            ->check(cli::one_of({"constant", "cosine"}));
        app.add_option("--warmup-epochs", f.warmup_epochs, "--lr-schedule cosine: epochs of linear warm-up (default: the model's recipe)")
            ->transform(cli::number(0, 1e6));
        app.add_option("--sync-batch-norm", f.sync_batch_norm,
                       "batch normalization's statistics over every replica's share of the global batch (Keras's "
                       "synchronized=True): on, off, or auto (on for mirrored, central_storage and multi_worker_mirrored "
                       "with more than one replica in sync; a model without batch normalization has none to sync); hybrid "
                       "takes on (in one process: each micro-batch over every replica's same micro-batch)")
            ->check(cli::one_of({"auto", "on", "off"}))->capture_default_str();
        app.add_option("--tensor-parallel", f.tensor_parallel,
                       "split the model's layers over N logical CPU devices of this process, as Megatron-LM splits a "
                       "transformer (vit: every attention layer by heads, every MLP column-then-row; 2 or 4), under "
                       "one_device, or mirrored for data x tensor parallelism (--replicas copies of the split model); "
                       "under mpirun -np N, over the N processes (rank j shard j; --strategy one_device); 1: whole")
            ->transform(cli::integer(1, 64))->capture_default_str();
        app.add_option("--scatter-gather", f.scatter_gather,
                       "--tensor-parallel N --strategy pipeline or hybrid under mpirun (each stage's N processes its "
                       "shards): each shard sends the same shard of the next stage 1/N of every message, and the stage's "
                       "shards gather the parts (Megatron's scatter/gather between stages): on, or off (every shard sends "
                       "the whole message)")
            ->check(cli::one_of({"on", "off"}))->capture_default_str();
        app.add_option("--augment", f.augment, "random crop after zero padding (--augment-pad) and, on fashion_mnist, random "
                                               "horizontal flip of the training images, drawn from --seed and the epoch "
                                               "whatever the replica count: on, off, or auto (the model's recipe: resnet on)")
            ->check(cli::one_of({"auto", "on", "off"}))->capture_default_str();
        app.add_option("--augment-pad", f.augment_pad, "--augment: pixels of zero padding on each side before the crop")
            ->transform(cli::integer(0, 27))->capture_default_str();
    } else {
        f.data = std::string(datasets[0].default_dir);
        app.add_option("--data", f.data, "directory with the four MNIST IDX files (scripts/fetch-mnist DIR)")
            ->capture_default_str();
    }
    app.add_option("--epochs", f.epochs, "train until this many epochs are done (with --load: counting the checkpoint's); "
                                         "0 with --load: only evaluate the checkpoint")
        ->transform(cli::integer(0, 1'000'000))->capture_default_str();
    app.add_option("--load", f.load, "start from this checkpoint (weights, optimizer state, epoch) instead of fresh weights");
    app.add_option("--steps-per-epoch", f.steps_per_epoch, "batches per epoch (parameter_server: updates); -1: the whole training set")
        ->transform(cli::integer<std::int64_t>(-1, 1'000'000'000))->capture_default_str();
    app.add_option("--batch-size", f.batch_size, "the global batch (split over the replicas); parameter_server: one worker's mini-batch")
        ->transform(cli::integer<std::int64_t>(1, 1'000'000))->capture_default_str();
    app.add_option("--threads", f.threads, "host threads (0: all cores); with several replicas, threads per replica")
        ->transform(cli::integer(0, 4096))->capture_default_str();
    app.add_option("--seed", f.seed, "seed of the weights and the shuffle")
        ->transform(cli::integer<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()))->capture_default_str();
    app.add_option("--precision", f.precision, "what the layers compute in (Keras's dtype policies; variables stay float32): "
                                               "float32, tf32 (TF32 GEMMs on a GPU; float32 on a host), mixed_bfloat16 or "
                                               "mixed_float16 (values rounded to bfloat16 or float16 between layers; float16 "
                                               "with a dynamic loss scale, not under parameter_server, pipeline or hybrid)")
        ->check(cli::one_of({strata::precision::name_of(strata::precision::Compute::Float32),
                             strata::precision::name_of(strata::precision::Compute::TF32),
                             strata::precision::name_of(strata::precision::Compute::BFloat16),
                             strata::precision::name_of(strata::precision::Compute::Float16)}))
        ->capture_default_str();
    app.add_option("--strategy", f.strategy, "distribution strategy")
        ->check(cli::one_of({"one_device", "mirrored", "central_storage", "parameter_server", "multi_worker_mirrored", "pipeline", "hybrid"}))->capture_default_str();
    app.add_option("--workers", f.workers, "parameter_server: workers")->transform(cli::integer(1, 1024))->capture_default_str();
    app.add_option("--servers", f.servers, "parameter_server: parameter servers")->transform(cli::integer(1, 1024))->capture_default_str();
    app.add_option("--shards", f.shards, "parameter_server: split each variable into N shards along axis 0 (FixedShards; 0: whole)")
        ->transform(cli::integer(0, 1024))->capture_default_str();
    app.add_option("--sync", f.sync, "parameter_server: sync mode")
        ->check(cli::one_of({"sync", "ksync", "kbatch_sync", "kasync", "kbatch_async", "async"}))->capture_default_str();
    app.add_option("--k", f.k, "parameter_server: K of ksync, kbatch_sync, kasync, kbatch_async (1 <= K <= workers)")
        ->transform(cli::integer(1, 1024));
    app.add_option("--staleness", f.staleness, "parameter_server --sync async: staleness bound B (-1: unbounded)")
        ->transform(cli::integer(-1, 1'000'000))->capture_default_str();
    app.add_option("--straggler", f.straggler, "parameter_server: none | slow:WORKER:FACTOR | exp:MEAN_MS | sexp:SHIFT_MS:MEAN_MS")
        ->capture_default_str();
    app.add_option("--clock", f.clock, "parameter_server: real (delays slept) or virtual (times drawn, reproducible)")
        ->check(cli::one_of({"real", "virtual"}))->capture_default_str();
    app.add_option("--timeout-ms", f.timeout_ms, "a collective that waits longer than this fails, naming who did not arrive")
        ->transform(cli::integer(1, 86'400'000))->capture_default_str();
    app.add_option("--transport", f.transport, "multi_worker_mirrored: how processes exchange gradients (auto: shared memory on one host, "
                                           "hierarchical across hosts; STRATA_FAKE_HOSTS=H declares H hosts)")
        ->check(cli::one_of({"auto", "shared_memory", "mpi", "hierarchical"}))->capture_default_str();
    app.add_option("--device", f.device, "where to train: gpu, cpu, or auto (the GPU when one is usable and the strategy "
                                         "trains there: one_device, mirrored, central_storage, parameter_server)")
        ->check(cli::one_of({"auto", "cpu", "gpu"}))->capture_default_str();
    app.add_option("--logical-gpus", f.logical_gpus, "--device gpu: carve N logical GPUs from the first GPU, each with its own "
                                                     "stream (mirrored and central_storage run one replica, parameter_server one worker on each)")
        ->transform(cli::integer(1, 64));
    app.add_option("--gpu-memory-mb", f.gpu_memory_mb, "--device gpu: the GPU's memory limit in MiB, shared evenly by its "
                                                       "logical GPUs (an allocation past it is an error naming the device)")
        ->transform(cli::integer(1, 16'777'216));
    app.add_option("--replicas", f.replicas, "replicas in sync (one_device: 1; multi_worker_mirrored: per process)")
        ->transform(cli::integer(1, 1024))->capture_default_str();
    std::size_t layers = 2;  // the most stages a model can take: one per layer
    for (const ModelEntry& m : tool.models) layers = std::max(layers, m.num_layers);
    app.add_option("--stages", f.stages, "pipeline, hybrid: stages (2-" + std::to_string(layers) + ": at most one per layer), balanced by FLOPs")
        ->transform(cli::integer(2, int(layers)))->capture_default_str();
    app.add_option("--micro-batches", f.micro_batches, "pipeline, hybrid: micro-batches per replica's share of a batch")
        ->transform(cli::integer(1, 4096))->capture_default_str();
    app.add_option("--schedule", f.schedule, "pipeline, hybrid: gpipe or 1f1b")->check(cli::one_of({"gpipe", "1f1b"}))->capture_default_str();
    app.add_option("--save", f.save, "write the trained weights to FILE.safetensors");
    app.add_option("--json", f.json, "also write the figures as JSON to FILE");
    app.add_option("--verbose", f.verbose, "0 silent, 1 progress bar, 2 one line per epoch")
        ->transform(cli::integer(0, 2))->capture_default_str();
    app.add_option("--plot", f.plot, "draw loss and accuracy per epoch (train, validation) as FILE.svg");
    app.add_option("--tensorboard", f.tensorboard, "write TensorBoard scalars per epoch to DIR (tensorboard --logdir DIR)");
    app.add_option("--backup-dir", f.backup_dir, "back the training state up into DIR at every epoch end (BackupAndRestore); "
                                                 "run again with the same flags after a crash to resume; removed at the end");
    app.add_option("--backup-every-steps", f.backup_every_steps, "with --backup-dir: back up every N batches instead")
        ->transform(cli::integer<std::int64_t>(1, 1'000'000'000));
    app.add_flag("--backup-force", f.backup_force, "with --backup-dir: resume a backup made with other flags (batch size, seed, "
                                                   "...) instead of refusing it");
}

// An output file must be writable before hours of training are spent: its directory exists and
// takes new files, and the path is a regular file, a link or a new name that fits the file
// system (strata::io::check_output_target: never a device, FIFO or socket, never a name past
// NAME_MAX or PATH_MAX, each of which once failed only after training, or replaced the node).
void check_writable(const std::string& flag, const std::string& path) {
    namespace fs = std::filesystem;
    if (path.empty()) return;
    const fs::path p(path);
    std::error_code ec;
    if (fs::is_directory(p, ec)) throw cli::usage_error(flag + " " + path + ": is a directory; expected a file name");
    try {
        strata::io::check_output_target(p);
    } catch (const strata::Error& e) {
        throw cli::usage_error(flag + " " + path + ": " + e.what());
    }
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (!fs::is_directory(dir, ec)) {
        // A regular file on the way ("model.safetensors/out.json") is named as such.
        fs::path up = dir;
        while (!up.empty() && !fs::exists(up, ec)) up = up.parent_path();
        if (!up.empty() && !fs::is_directory(up, ec))
            throw cli::usage_error(flag + " " + path + ": " + up.string() + " is not a directory");
        throw cli::usage_error(flag + " " + path + ": the directory " + dir.string() + " does not exist");
    }
    if (::access(dir.c_str(), W_OK) != 0)
        throw cli::usage_error(flag + " " + path + ": cannot write into " + dir.string() + " (" + std::strerror(errno) + ")");
}

// A directory the run writes into (--tensorboard, --backup-dir): an existing directory, or a new
// name whose every missing component fits the file system and whose nearest existing ancestor
// takes new entries. (Its files are new names of their own: the event file is created
// exclusively, the backup goes through AtomicFileWriter.)
void check_output_dir(const std::string& flag, const std::string& path) {
    namespace fs = std::filesystem;
    if (path.empty()) return;
    const fs::path d(path);
    std::error_code ec;
    struct stat st {};
    if (::lstat(d.c_str(), &st) == 0) {
        if (fs::is_directory(d, ec)) {
            if (::access(d.c_str(), W_OK) != 0) throw cli::usage_error(flag + " " + path + ": cannot write into it (" + std::strerror(errno) + ")");
            return;
        }
        throw cli::usage_error(flag + " " + path + ": expected a directory or a new name, found " +
                               (S_ISREG(st.st_mode) ? "a regular file" : S_ISLNK(st.st_mode) ? "a link to no directory"
                                : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
                                : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a special file"));
    }
    fs::path up = d;
    while (!up.empty() && up != up.parent_path() && ::lstat(up.c_str(), &st) != 0) {
        // Each missing component becomes a directory: its name must fit where it is created.
        if (up.has_filename()) {
            const fs::path parent = up.has_parent_path() ? up.parent_path() : fs::path(".");
            fs::path existing = parent;
            while (!existing.empty() && existing != existing.parent_path() && !fs::exists(existing, ec)) existing = existing.parent_path();
            if (existing.empty()) existing = ".";
            const long name_max = ::pathconf(existing.c_str(), _PC_NAME_MAX);
            if (name_max > 0 && up.filename().native().size() > std::size_t(name_max))
                throw cli::usage_error(flag + " " + path + ": expected names of at most " + std::to_string(name_max) +
                                       " bytes (NAME_MAX), found " + up.filename().string().substr(0, 40) + "... of " +
                                       std::to_string(up.filename().native().size()) + " bytes");
        }
        up = up.has_parent_path() ? up.parent_path() : fs::path();
    }
    if (path.size() + 64 >= std::size_t(PATH_MAX))
        throw cli::usage_error(flag + " " + path.substr(0, 40) + "...: expected a path shorter than " + std::to_string(PATH_MAX - 64) +
                               " bytes (PATH_MAX, with room for the files in it), found " + std::to_string(path.size()));
    if (up.empty()) up = ".";
    if (!fs::is_directory(up, ec)) throw cli::usage_error(flag + " " + path + ": " + up.string() + " is not a directory");
    if (::access(up.c_str(), W_OK) != 0)
        throw cli::usage_error(flag + " " + path + ": cannot create it in " + up.string() + " (" + std::strerror(errno) + ")");
}

// A strategy that lives in one process, started N times by mpirun or srun, would train N
// separate copies, each printing its report and writing the same files: refused on every rank.
void check_launcher(const Flags& f) {
    const auto launch = strata::distribute::launch_info();
    if (launch.size <= 1) return;
    if (f.tensor_parallel > 1) {  // one job: a shard per process (and replicas of the shards)
#ifdef STRATA_TRAIN_HAVE_MPI
        const std::string tp = "--tensor-parallel " + std::to_string(f.tensor_parallel);
        if (f.strategy == "multi_worker_mirrored") {  // data x tensor: R replicas of N shards
            if (f.replicas != 1)
                throw cli::usage_error(tp + " --strategy multi_worker_mirrored: one replica per process (--replicas 1); the replicas "
                                            "are the job's processes in groups of " + std::to_string(f.tensor_parallel) + ", not " +
                                       std::to_string(f.replicas));
            if (launch.size % f.tensor_parallel != 0)
                throw cli::usage_error(tp + " --strategy multi_worker_mirrored needs replicas of " + std::to_string(f.tensor_parallel) +
                                       " processes (mpirun -np R·" + std::to_string(f.tensor_parallel) + "), found " +
                                       std::to_string(launch.size) + " (" + launch.describe() + ")");
            return;
        }
        if (f.strategy == "pipeline" || f.strategy == "hybrid") {  // pipeline x tensor: each stage N processes
            const int replicas = f.strategy == "hybrid" ? f.replicas : 1, need = replicas * f.stages * f.tensor_parallel;
            if (launch.size != need)
                throw cli::usage_error(tp + " --strategy " + f.strategy + ": " + std::to_string(replicas) + " replica(s) × " +
                                       std::to_string(f.stages) + " stages × " + std::to_string(f.tensor_parallel) +
                                       " shards need " + std::to_string(need) + " processes (mpirun -np " + std::to_string(need) +
                                       "; ranks s·N to s·N + N − 1 run stage s's shards), found " + std::to_string(launch.size) +
                                       " (" + launch.describe() + ")");
            return;
        }
        if (f.strategy != "one_device")
            throw cli::usage_error(tp + " across processes (" + launch.describe() +
                                   ") runs one replica in each process, each its shard of the split layers: --strategy one_device "
                                   "(or multi_worker_mirrored --replicas 1 for replicas of the shards, pipeline or hybrid for "
                                   "stages of the shards), not " + f.strategy);
        if (launch.size != f.tensor_parallel)
            throw cli::usage_error("--tensor-parallel " + std::to_string(f.tensor_parallel) + " across processes needs one process per shard (mpirun -np " +
                                   std::to_string(f.tensor_parallel) + "), found " + std::to_string(launch.size) + " (" +
                                   launch.describe() + ")");
        return;
#else
        throw cli::usage_error("--tensor-parallel across processes needs MPI, and this build has none, but " + launch.describe() +
                               " (install libopenmpi-dev and reconfigure, or start it once without the launcher)");
#endif
    }
    if (f.strategy == "multi_worker_mirrored") return;
    if (f.strategy == "pipeline" || f.strategy == "hybrid") {  // one job: a stage per process
#ifdef STRATA_TRAIN_HAVE_MPI
        return;  // the Pipeline refuses a job of the wrong size, naming the count it needs
#else
        throw cli::usage_error("--strategy " + f.strategy + " across processes needs MPI, and this build has none, but " +
                               launch.describe() + " (install libopenmpi-dev and reconfigure, or start it once without the launcher)");
#endif
    }
    if (f.strategy == "parameter_server") {  // one job: rank 0 the coordinator, then the servers, then the workers
#ifdef STRATA_TRAIN_HAVE_MPI
        const int need = 1 + f.servers + f.workers;
        if (launch.size != need)
            throw cli::usage_error("--strategy parameter_server across processes: 1 coordinator, " + std::to_string(f.servers) +
                                   " server(s) and " + std::to_string(f.workers) + " worker(s) need " + std::to_string(need) +
                                   " processes (mpirun -np " + std::to_string(need) + "), found " + std::to_string(launch.size) +
                                   " (" + launch.describe() + ")");
        return;
#else
        throw cli::usage_error("--strategy parameter_server across processes needs MPI, and this build has none, but " +
                               launch.describe() + " (install libopenmpi-dev and reconfigure, or start it once without the launcher)");
#endif
    }
    throw cli::usage_error("--strategy " + f.strategy + " trains in one process, but " + launch.describe() +
                           ": they would train " + std::to_string(launch.size) +
                           " separate copies. Expected 1 process: start it without the launcher, or use "
                           "--strategy multi_worker_mirrored or parameter_server for one job across the processes");
}

/// Checks what a single flag's range cannot (combinations), before any data is loaded.
void check_flags(const CLI::App& app, Flags& f, const Tool& tool) {
    f.replicas_given = app.count("--replicas") > 0;
    if (f.epochs == 0 && f.load.empty())
        throw cli::usage_error("--epochs 0 trains nothing: it evaluates a checkpoint, so give --load FILE (or --epochs >= 1)");
    if (!f.load.empty()) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(f.load, ec) || ::access(f.load.c_str(), R_OK) != 0)
            throw cli::usage_error("--load " + f.load + ": expected a readable checkpoint file");
    }
    check_writable("--save", f.save);
    check_writable("--json", f.json);
    check_writable("--plot", f.plot);
    check_output_dir("--tensorboard", f.tensorboard);
    if (f.threads > strata::hardware_threads())
        std::fprintf(stderr, "%s: warning: --threads %d is more than the %d hardware threads here; the extra threads "
                             "only wait for each other (expect it to be much slower)\n", app.get_name().c_str(), f.threads,
                     strata::hardware_threads());
    const bool ps = f.strategy == "parameter_server";
    // One thread per replica or worker: more than the library starts is refused before any data is read.
    const int most = strata::distribute::max_replica_threads();
    if (ps ? f.workers > most : f.replicas > most)
        throw cli::usage_error((ps ? "--workers " + std::to_string(f.workers) : "--replicas " + std::to_string(f.replicas)) +
                               ": at most " + std::to_string(most) + " on " + std::to_string(strata::hardware_threads()) +
                               " hardware threads (16 per hardware thread, at least 64; each is a thread with its own buffers)");
    if (!ps)
        for (const auto& name : ps_only)
            if (app.count(name))
                throw cli::usage_error(name + " is a parameter_server flag; it means nothing for --strategy " + f.strategy);
    if (ps) {
        if (app.count("--replicas"))
            throw cli::usage_error("--strategy parameter_server takes --workers and --servers, not --replicas");
        const bool k_mode = f.sync != "sync" && f.sync != "async";
        if (k_mode && !app.count("--k")) throw cli::usage_error("--sync " + f.sync + " needs --k K (1 <= K <= workers)");
        if (!k_mode && app.count("--k")) throw cli::usage_error("--k means nothing for --sync " + f.sync + " (only the K modes take it)");
        if (k_mode && f.k > f.workers)
            throw cli::usage_error("--k " + std::to_string(f.k) + " needs at least as many workers, found --workers " +
                                   std::to_string(f.workers));
        if (f.sync != "async" && app.count("--staleness"))
            throw cli::usage_error("--staleness means nothing for --sync " + f.sync + " (only async takes a bound)");
        try {
            strata::distribute::Stragglers::parse(f.straggler).validate(f.workers);
        } catch (const strata::Error& e) {
            std::string what = e.what();
            if (what.rfind("Stragglers::parse: ", 0) == 0) what.erase(0, 19);  // the flag names it
            throw cli::usage_error("--straggler: " + what);
        }
    }
    if (app.count("--backup-every-steps") && f.backup_dir.empty())
        throw cli::usage_error("--backup-every-steps needs --backup-dir DIR");
    if (f.backup_force && f.backup_dir.empty()) throw cli::usage_error("--backup-force needs --backup-dir DIR");
    if (ps && app.count("--backup-every-steps"))
        throw cli::usage_error("--backup-every-steps: parameter_server backs up at epoch ends only (its updates do not follow "
                               "the data's order, so there is no batch to resume at)");
    if (!f.backup_dir.empty()) {
        std::error_code ec;
        if (std::filesystem::exists(f.backup_dir, ec) && !std::filesystem::is_directory(f.backup_dir, ec))
            throw cli::usage_error("--backup-dir " + f.backup_dir + ": is a file; expected a directory");
        check_output_dir("--backup-dir", f.backup_dir);
    }
    if (f.steps_per_epoch == 0)
        throw cli::usage_error("--steps-per-epoch: expected -1 (the whole training set) or a count >= 1, found 0");
    if (f.strategy != "multi_worker_mirrored" && app.count("--transport"))
        throw cli::usage_error("--transport is a multi_worker_mirrored flag; it means nothing for --strategy " + f.strategy);
    const bool piped = f.strategy == "pipeline" || f.strategy == "hybrid";
    for (const char* name : {"--stages", "--micro-batches", "--schedule"})
        if (!piped && app.count(name))
            throw cli::usage_error(std::string(name) + " is a pipeline/hybrid flag; it means nothing for --strategy " + f.strategy);
    if (f.scatter_gather != "on" && !(piped && f.tensor_parallel > 1))
        throw cli::usage_error("--scatter-gather " + f.scatter_gather + ": the messages between pipeline stages split over "
                               "processes are sent in parts only under --tensor-parallel N with --strategy pipeline or hybrid; "
                               "it means nothing here");
    // --precision (its name was checked by the flag). mixed_float16's loss scale skips a step whose
    // gradient is not finite, one decision for every replica, every pipeline stage and every
    // parameter server (each sums its part's squares into the whole update's first).
    if (!strata::precision::parse(f.precision, f.compute))
        throw cli::usage_error("--precision: expected one of float32, tf32, mixed_bfloat16, mixed_float16; found '" + f.precision + "'");
    if (f.strategy == "pipeline" && f.replicas != 1)
        throw cli::usage_error("--strategy pipeline takes --replicas 1 (R pipelines are --strategy hybrid), found --replicas " +
                               std::to_string(f.replicas));
    if (f.strategy == "one_device" && f.replicas != 1)
        throw cli::usage_error("--strategy one_device takes --replicas 1, found --replicas " + std::to_string(f.replicas));
    check_launcher(f);
    for (const char* name : {"--logical-gpus", "--gpu-memory-mb"})
        if (app.count(name) && f.device == "cpu") throw cli::usage_error(std::string(name) + " is a GPU flag; it means nothing with --device cpu");
    // strata_train's choices (mnist_cnn's are fixed: the first model and dataset, RMSprop(1e-3)).
    const ModelEntry& model = model_named(tool, f.model);
    if (f.data.empty()) f.data = std::string(dataset_named(f.dataset).default_dir);
    if (piped && std::size_t(f.stages) > model.num_layers)
        throw cli::usage_error("--stages " + std::to_string(f.stages) + ": --model " + f.model + " has " +
                               std::to_string(model.num_layers) + " layers, and a stage takes one or more");
    // The model's recipe for what no flag sets.
    // (mnist_cnn declares none of strata_train's choices: its model's recipe is the defaults.)
    const auto given = [&](const char* name) { return (tool.choices || std::string_view(name) == "--epochs") && app.count(name) > 0; };
    const Recipe& recipe = model.recipe;
    if (!given("--epochs")) f.epochs = recipe.epochs;
    if (!given("--optimizer")) f.optimizer = std::string(recipe.optimizer);
    if (!given("--learning-rate")) f.learning_rate = recipe.learning_rate;
    if (!given("--weight-decay")) f.weight_decay = recipe.weight_decay;
    if (!given("--lr-schedule")) f.lr_schedule = std::string(recipe.lr_schedule);
    if (!given("--warmup-epochs")) f.warmup_epochs = recipe.warmup_epochs;
    f.augmenting = f.augment == "on" || (f.augment == "auto" && recipe.augment);
    if (!given("--augment-pad")) f.augment_pad = recipe.augment_pad;
    if (given("--augment-pad") && !f.augmenting) throw cli::usage_error("--augment-pad needs --augment on");
    if (f.augmenting && f.augment_pad >= 28)
        throw cli::usage_error("--augment-pad " + std::to_string(f.augment_pad) + ": expected fewer pixels than the 28 of an image side");
    if (f.optimizer != "adamw" && given("--weight-decay"))
        throw cli::usage_error("--weight-decay is adamw's (decoupled weight decay); it means nothing for --optimizer " + f.optimizer);
    if (f.lr_schedule != "cosine" && given("--warmup-epochs"))
        throw cli::usage_error("--warmup-epochs is the cosine schedule's; give --lr-schedule cosine");
    // Synchronized batch normalization: where the replicas step together, on shares of one batch.
    const bool can_sync = f.strategy == "mirrored" || f.strategy == "central_storage" || f.strategy == "multi_worker_mirrored";
    // The hybrid syncs each micro-batch over the replicas when asked (on), never by default: its
    // statistics are then the micro-batches', not the global batch's.
    const bool hybrid_sync = f.strategy == "hybrid" && f.sync_batch_norm == "on";
    if (f.sync_batch_norm == "on") {
        if (!model.has_sync_net)
            throw cli::usage_error("--sync-batch-norm on: --model " + f.model + " has no batch normalization to synchronize");
        if (!can_sync && !hybrid_sync)
            throw cli::usage_error("--sync-batch-norm on needs replicas that step together on shares of one global batch "
                                   "(mirrored, central_storage, multi_worker_mirrored, hybrid); --strategy " + f.strategy +
                                   (ps ? "'s workers step on their own" : f.strategy == "one_device" ? " has one replica" :
                                                                          " has one replica (hybrid has --replicas)"));
    }
    f.sync_bn = model.has_sync_net && ((can_sync && f.sync_batch_norm != "off") || hybrid_sync);
    if (f.tensor_parallel > 1) {
        // The split forms the program compiled (strata_train_tensor_parallel.cpp), in one process.
        std::string with;
        for (const ModelEntry& m : tool.models)
            if (m.tensor_parallel) with += (with.empty() ? "" : ", ") + std::string(m.name);
        if (!model.tensor_parallel)
            throw cli::usage_error("--tensor-parallel: --model " + f.model + " has no form split over devices (" + with + " has)");
        std::string counts;
        bool compiled = false;
        for (int n : model.tensor_parallel_shards) {
            counts += (counts.empty() ? "" : " or ") + std::to_string(n);
            compiled = compiled || n == f.tensor_parallel;
        }
        if (!compiled)
            throw cli::usage_error("--tensor-parallel " + std::to_string(f.tensor_parallel) + ": --model " + f.model +
                                   " is compiled split over " + counts + " devices");
        const bool launched = strata::distribute::launch_info().size > 1;
        const bool across = launched && (f.strategy == "multi_worker_mirrored" || f.strategy == "pipeline" || f.strategy == "hybrid");
        if (f.strategy != "one_device" && f.strategy != "mirrored" && !across)
            throw cli::usage_error("--tensor-parallel splits the layers over logical devices of one process: --strategy "
                                   "one_device, or mirrored for data x tensor parallelism (under mpirun: one_device, "
                                   "multi_worker_mirrored for replicas of the shards, or pipeline and hybrid for stages of the "
                                   "shards), not " + f.strategy);
        if (f.device == "gpu" || app.count("--logical-gpus") || app.count("--gpu-memory-mb"))
            throw cli::usage_error("--tensor-parallel: the split layers train on the CPU's logical devices in this program "
                                   "(use --device cpu or auto)");
    }
    if (app.count("--learning-rate") && !(f.learning_rate > 0))
        throw cli::usage_error("--learning-rate: expected a number > 0, found " + cli::detail::number_text(f.learning_rate));
    if (!(f.momentum < 1)) throw cli::usage_error("--momentum: expected a number in [0, 1), found " + cli::detail::number_text(f.momentum));
    if (f.optimizer == "adam" && app.count("--momentum"))
        throw cli::usage_error("--momentum means nothing for --optimizer adam (sgd and rmsprop take it)");
}

/// The optimizer the flags ask for: the one place they become a strata::optim::Optimizer
/// (mnist_cnn's: RMSprop(1e-3)). Another optimizer (adamw, say): its name in --optimizer's
/// choices (declare_flags), its case here, its knobs (--weight-decay, --global-clipnorm) as
/// flags beside --momentum, checked in check_flags.
strata::optim::Optimizer make_optimizer(const Flags& f, strata::optim::LearningRate learning_rate) {
    namespace so = strata::optim;
    const double clip = f.global_clipnorm;
    if (f.optimizer == "sgd") return so::SGD{.learning_rate = learning_rate, .momentum = f.momentum, .global_clipnorm = clip};
    if (f.optimizer == "adam") return so::Adam{.learning_rate = learning_rate, .global_clipnorm = clip};
    if (f.optimizer == "adamw")
        return so::AdamW{.learning_rate = learning_rate, .weight_decay = f.weight_decay, .global_clipnorm = clip};
    return so::RMSprop{.learning_rate = learning_rate, .momentum = f.momentum, .global_clipnorm = clip};
}

/// The learning rate the flags ask for: --learning-rate, or the optimizer's default (Keras's).
/// The place for a schedule (--lr-schedule cosine: a strata::optim schedule over `total_steps`,
/// the optimizer updates of the whole run; any callable double(step) is a LearningRate).
strata::optim::LearningRate make_learning_rate(const Flags& f, std::int64_t total_steps, std::int64_t steps_per_epoch) {
    const double peak = f.learning_rate > 0 ? f.learning_rate : f.optimizer == "sgd" ? 0.01 : 0.001;
    if (f.lr_schedule != "cosine") return peak;
    // Keras's CosineDecay(initial 0, warmup_target peak, warmup_steps, decay_steps: the rest).
    const auto warmup = std::int64_t(std::llround(f.warmup_epochs * double(steps_per_epoch)));
    const std::int64_t decay = std::max<std::int64_t>(total_steps - warmup, 1);
    return strata::optim::CosineDecay{.initial_learning_rate = 0.0, .decay_steps = decay, .alpha = 0.0,
                                      .warmup_target = warmup > 0 ? std::optional<double>(peak) : std::nullopt,
                                      .warmup_steps = warmup};
}

/// The optimizer's text for the backup's configuration and the report: mnist_cnn's
/// "RMSprop(learning_rate=0.001)" for its optimizer (so that its backups read as they did), else
/// every hyper-parameter (strata::optim::describe).
std::string optimizer_text(const Flags& f, const strata::optim::Optimizer& o) {
    if (f.optimizer == "rmsprop" && f.momentum == 0 && (f.learning_rate == 0 || f.learning_rate == 0.001))
        return "RMSprop(learning_rate=0.001)";
    return strata::optim::describe(o);
}

/// The dataset's four files from --data (every dataset has MNIST's format; the place for a
/// dataset's own loader, whose errors name its fetch script).
strata::data::Mnist load_dataset(const Dataset& dataset, const std::string& dir) {
    if (dataset.name == "fashion_mnist") return strata::data::load_fashion_mnist(dir);
    return strata::data::load_mnist(dir);
}

// A test hook (tests/check_multi_worker.py's slow start): MNIST_CNN_STOP_BEFORE_JOIN=R makes
// rank R stop itself (SIGSTOP) after MPI_Init and its data, just before its strategy joins the
// others, so that a test can hold a rank back at the one place a slow start delays (MPI_Init
// itself waits for every rank) and resume it once the others have waited past the step
// deadline. Unset in any real run; a value that is not a rank is refused, never half-read.
void stop_before_join_for_tests() {
    const char* v = std::getenv("MNIST_CNN_STOP_BEFORE_JOIN");
    if (v == nullptr || *v == '\0') return;
    long r = 0;
    const char* p = v;
    for (; *p >= '0' && *p <= '9' && r < 1'000'000; ++p) r = r * 10 + (*p - '0');
    if (*p != '\0') throw cli::usage_error(std::string("MNIST_CNN_STOP_BEFORE_JOIN='") + v + "': expected a rank in decimal digits");
    if (multi_worker_rank() == r) ::raise(SIGSTOP);
}

bool trains_on_gpu(const std::string& strategy) {
    // parameter_server across processes (under a launcher) runs on the host only.
    if (strategy == "parameter_server") return strata::distribute::launch_info().size <= 1;
    return strategy == "one_device" || strategy == "mirrored" || strategy == "central_storage";
}

/// --device auto|cpu|gpu resolved to the device this run trains on ("cpu" or "gpu"): a GPU-only
/// request on a machine or a build without one is an error that says which, never a silent
/// fallback; auto takes the GPU only where one is usable and the strategy trains there.
std::string resolve_device(const CLI::App& app, const Flags& f, const ModelEntry& model) {
    const bool gpu_flags = app.count("--logical-gpus") || app.count("--gpu-memory-mb");
    if (f.device == "cpu") return "cpu";
    const bool want_gpu = f.device == "gpu" || gpu_flags;
    if (f.tensor_parallel > 1 && !want_gpu) return "cpu";  // the split layers: the CPU's logical devices
    const std::string asked = f.device == "gpu" ? "--device gpu" : (app.count("--logical-gpus") ? "--logical-gpus" : "--gpu-memory-mb");
#ifndef STRATA_TRAIN_HAVE_CUDA
    // Built without CUDA (nvcc was not found when the program was configured; strata_train_gpu.cu
    // is the unit that trains on the GPU).
    if (!want_gpu) return "cpu";
    throw cli::usage_error(asked + ": this build of " + app.get_name() + " has no CUDA (nvcc was not found when it was configured; "
                           "install the CUDA toolkit and reconfigure with -Dcuda=enabled)");
#endif
    if (!model.gpu) {  // on_gpu() false: the model's layers have no CUDA kernels yet
        if (!want_gpu) return "cpu";
        throw cli::usage_error(asked + ": --model " + f.model + " does not train on the GPU in this program yet (use --device cpu)");
    }
    const auto gpus = strata::place::list_physical_devices(strata::place::DeviceKind::Gpu);
    if (gpus.empty()) {
        if (!want_gpu) return "cpu";
        throw cli::usage_error(asked + ": no usable GPU here (the CUDA runtime reports none: no GPU, no driver, or "
                               "CUDA_VISIBLE_DEVICES hides them); use --device cpu");
    }
    if (!trains_on_gpu(f.strategy)) {
        if (!want_gpu) return "cpu";
        throw cli::usage_error(asked + ": --strategy " + f.strategy + " does not train on the GPU in this program yet; "
                               "one_device, mirrored, central_storage and parameter_server do (or use --device cpu)");
    }
    return "gpu";
}

}  // namespace

int run(const Tool& tool, int argc, char** argv) {
    CLI::App app{description(tool), std::string(tool.name)};
    Flags flags;
    declare_flags(app, flags, tool);
    return cli::run(app, argc, argv, [&] {
        check_flags(app, flags, tool);
        const ModelEntry& model = model_named(tool, flags.model);
        const Dataset& dataset = dataset_named(flags.dataset);
        const std::string device = resolve_device(app, flags, model);
        const int threads = flags.threads;
        strata::set_num_threads(threads);

        // Under multi_worker_mirrored every process runs this program; rank 0 reports.
        // ... and under parameter_server started by a launcher (rank 0, the coordinator).
        // ... and under pipeline or hybrid started by a launcher (rank 0 runs stage 0).
        // ... and under --tensor-parallel N started by a launcher of N processes (rank 0, shard 0).
        const bool across = flags.strategy == "multi_worker_mirrored" ||
                            ((flags.strategy == "parameter_server" || flags.strategy == "pipeline" || flags.strategy == "hybrid" ||
                              flags.tensor_parallel > 1) &&
                             strata::distribute::launch_info().size > 1);
        const bool chief = !across || multi_worker_rank() == 0;
        const auto data = load_dataset(dataset, flags.data);
        // The optimizer updates of the whole run, for a learning-rate schedule.
        const std::int64_t batches = (std::int64_t(data.train.size()) + flags.batch_size - 1) / flags.batch_size;
        const std::int64_t total_steps = (flags.steps_per_epoch > 0 ? flags.steps_per_epoch : batches) * flags.epochs;
        auto optimizer = make_optimizer(flags, make_learning_rate(flags, total_steps, flags.steps_per_epoch > 0 ? flags.steps_per_epoch : batches));
        std::string optimizer_description = optimizer_text(flags, optimizer);
        const Job job{flags, model, dataset, data, std::move(optimizer), std::move(optimizer_description)};
        // Compared by every strategy's process group when the ranks join (strata_train.hpp).
        if (across) strata::distribute::set_job_settings(shared_settings(flags, data, job.optimizer_text));
        if (across) stop_before_join_for_tests();
        if (chief) {
            std::printf("%s", model.summary().c_str());
            std::printf("%s: %zu training and %zu test images from %s\n", std::string(dataset.title).c_str(), data.train.size(),
                        data.test.size(), flags.data.c_str());
        }

        Report rep;
        int used_replicas = 1;
        if (device == "gpu") {
            rep = model.gpu(job, used_replicas);
        } else if (flags.tensor_parallel > 1) {
            rep = model.tensor_parallel(job, used_replicas);
        } else if (flags.strategy == "one_device" || flags.strategy == "mirrored" || flags.strategy == "central_storage") {
            rep = model.in_process(job, used_replicas);
        } else if (flags.strategy == "multi_worker_mirrored") {
            if (!model.multi_worker) multi_worker_rank();  // the build has no MPI: says so
            rep = model.multi_worker(job, used_replicas);
        } else if (flags.strategy == "pipeline" || flags.strategy == "hybrid") {
            rep = model.pipeline(job, used_replicas);
        } else {
            rep = model.parameter_server(job, used_replicas);  // used_replicas: the workers
        }

        if (!chief) return rep.interrupted_by ? 128 + rep.interrupted_by : 0;
        if (rep.resumed_from)
            std::printf("resumed from the backup in %s at epoch %d, batch %lld\n", flags.backup_dir.c_str(),
                        rep.resumed_from->epoch + 1, (long long)rep.resumed_from->batches);
        if (rep.interrupted_by) {
            std::printf("\ninterrupted by %s after %d complete epoch(s): %s\n", rep.interrupted_by == SIGINT ? "SIGINT" : "SIGTERM",
                        rep.epochs_done,
                        flags.save.empty() ? "nothing saved (give --save FILE to keep the state)"
                                           : ("state saved to " + flags.save + " (continue with --load " + flags.save + ")").c_str());
            if (!flags.backup_dir.empty())
                std::printf("backup kept in %s: run again with the same flags to resume where it stopped\n", flags.backup_dir.c_str());
            if (rep.interrupted_by == SIGTERM && std::getenv("OMPI_COMM_WORLD_SIZE"))
                std::printf("(under Open MPI's mpirun: mpirun sends SIGTERM to every process when it gets SIGINT or SIGTERM, so "
                            "a Ctrl-C arrives here as SIGTERM; this process exits %d, and mpirun itself exits 1)\n", 128 + SIGTERM);
            return 128 + rep.interrupted_by;
        }
        const int used_threads = threads > 0 ? threads : strata::hardware_threads();
        // The device that trained: its kind and what it is (the GPU's name, or the CPU's model).
        std::string device_name;
        for (const auto& d : strata::place::list_physical_devices(device == "gpu" ? strata::place::DeviceKind::Gpu
                                                                                  : strata::place::DeviceKind::Cpu)) {
            device_name = d.description;
            break;
        }
        std::printf("\n%-28s %s (%s)\n", "device", device.c_str(), device_name.c_str());
        // The rate at step 0, or a cosine schedule's peak (the rate after its warm-up).
        const double learning_rate =
            flags.lr_schedule == "cosine" ? (flags.learning_rate > 0 ? flags.learning_rate : flags.optimizer == "sgd" ? 0.01 : 0.001)
                                          : std::visit([](const auto& o) { return o.learning_rate(0); }, job.optimizer);
        if (tool.choices) {
            std::printf("%-28s %s (%lld parameters)\n", "model", flags.model.c_str(), (long long)model.num_params);
            std::printf("%-28s %s\n", "dataset", flags.dataset.c_str());
            std::printf("%-28s %s, learning rate %g", "optimizer", flags.optimizer.c_str(), learning_rate);
            if (flags.optimizer == "sgd" || flags.optimizer == "rmsprop") std::printf(", momentum %g", flags.momentum);
            if (flags.optimizer == "adamw") std::printf(", weight decay %g", flags.weight_decay);
            if (flags.global_clipnorm > 0) std::printf(", global clipnorm %g", flags.global_clipnorm);
            std::printf("\n");
            if (flags.lr_schedule == "cosine")
                std::printf("%-28s cosine decay to 0, after %g epochs of linear warm-up\n", "learning-rate schedule", flags.warmup_epochs);
            if (model.has_sync_net)
                std::printf("%-28s %s\n", "batch normalization", flags.sync_bn ? "synchronized across replicas" : "per replica");
            if (flags.tensor_parallel > 1)
                std::printf("%-28s %d shards (%s)\n", "tensor parallel", flags.tensor_parallel,
                            strata::distribute::launch_info().size <= 1 ? "logical CPU devices, each replica"
                            : flags.strategy == "pipeline" || flags.strategy == "hybrid"
                                ? (flags.scatter_gather == "on" ? "MPI processes: rank q is shard q % N of stage group q / N; messages "
                                                                  "between stages in parts"
                                                                : "MPI processes: rank q is shard q % N of stage group q / N; messages "
                                                                  "between stages whole")
                                : "MPI processes: rank q is shard q % N of replica q / N");
            if (flags.augmenting)
                std::printf("%-28s pad %d and random crop%s\n", "augmentation", flags.augment_pad,
                            flags.dataset == "fashion_mnist" ? ", horizontal flip" : "");
        }
        std::printf("%-28s %s\n", "precision", strata::precision::name_of(rep.compute));
        const bool scaled = strata::precision::scales_loss(rep.compute);
        if (scaled)
            std::printf("%-28s %g (%lld steps skipped, %lld updates applied)\n", "loss scale", rep.loss_scale.scale,
                        (long long)rep.loss_scale.skipped_steps, (long long)rep.optimizer_iterations);
        std::printf("%-28s %s\n", "strategy", flags.strategy.c_str());
        std::printf("%-28s %d\n", "replicas", used_replicas);
        std::printf("%-28s %d\n", "threads", used_threads);
        std::printf("%-28s %d\n", "epochs", flags.epochs);
        std::printf("%-28s %lld\n", "batch size", (long long)flags.batch_size);
        std::printf("%-28s %.2f%%\n", "test accuracy", 100.0 * rep.test_accuracy);
        std::printf("%-28s %.4f\n", "test loss", rep.test_loss);
        std::printf("%-28s %.1f\n", "train images/s", rep.images_per_second);
        std::printf("%-28s %.1f\n", "test images/s (evaluate)", rep.test_images_per_second);
        std::printf("%-28s %.1f\n", "seconds", rep.seconds);
        if (rep.ps) {
            std::printf("%-28s %s (k %d, staleness bound %d), %d servers, straggler %s, %s clock\n", "parameter server",
                        flags.sync.c_str(), flags.k, flags.staleness, flags.servers, flags.straggler.c_str(), flags.clock.c_str());
            std::printf("%-28s %lld\n", "updates", (long long)rep.ps->updates);
            std::printf("%-28s %lld\n", "cancelled mini-batches", (long long)rep.ps->cancelled);
            std::printf("%-28s %lld\n", "dropped gradients", (long long)rep.ps->dropped);
            std::printf("%-28s max %lld, mean %.3f\n", "staleness", (long long)rep.ps->staleness_max, rep.ps->staleness_mean());
            std::printf("%-28s %.3f\n", (flags.clock + " clock seconds").c_str(), rep.ps->seconds);
            // A job that trained on without a worker says so here, not only in a warning.
            if (!rep.ps->lost_workers.empty()) {
                std::string lost;
                for (std::size_t i = 0; i < rep.ps->lost_workers.size(); ++i)
                    lost += (i ? ", worker " : "worker ") + std::to_string(rep.ps->lost_workers[i]) + " (rank " +
                            std::to_string(rep.ps->lost_ranks[i]) + ")";
                std::printf("%-28s %zu of %d: %s; training went on with %zu\n", "lost workers", rep.ps->lost_workers.size(),
                            flags.workers, lost.c_str(), std::size_t(flags.workers) - rep.ps->lost_workers.size());
            }
        }

        if (!flags.plot.empty()) {
            strata::train::plot_history(rep.history, flags.plot);
            std::printf("%-28s %s\n", "plot", flags.plot.c_str());
        }
        if (!flags.json.empty()) {
            cli::Json j;
            j["framework"] = "strata";
            if (tool.choices) {
                j["model"] = flags.model;
                j["model_params"] = model.num_params;
                j["dataset"] = flags.dataset;
                j["classes"] = std::vector<std::string>(dataset.classes.begin(), dataset.classes.end());
                j["optimizer"] = flags.optimizer;
                j["learning_rate"] = learning_rate;
                j["momentum"] = flags.momentum;
                j["optimizer_config"] = strata::optim::describe(job.optimizer);
                j["weight_decay"] = flags.optimizer == "adamw" ? flags.weight_decay : 0.0;
                j["global_clipnorm"] = flags.global_clipnorm;
                j["lr_schedule"] = flags.lr_schedule;
                j["warmup_epochs"] = flags.warmup_epochs;
                j["sync_batch_norm"] = flags.sync_bn;
                j["tensor_parallel"] = flags.tensor_parallel;
                j["tensor_parallel_across_processes"] = flags.tensor_parallel > 1 && strata::distribute::launch_info().size > 1;
                if (rep.tensor_parallel_sums > 0) {  // what the split layers' sums and gathers moved through rank 0, the whole run
                    j["tensor_parallel_sums"] = rep.tensor_parallel_sums;
                    j["tensor_parallel_bytes"] = rep.tensor_parallel_bytes;
                    j["tensor_parallel_gathers"] = rep.tensor_parallel_gathers;
                    j["tensor_parallel_gathered_bytes"] = rep.tensor_parallel_gathered_bytes;
                }
                j["augment"] = flags.augmenting;
                j["augment_pad"] = flags.augmenting ? flags.augment_pad : 0;
                j["non_trainable_params"] = model.num_non_trainable;
            }
            j["device"] = device;
            j["device_name"] = device_name;
            j["strategy"] = flags.strategy;
            j["precision"] = strata::precision::name_of(rep.compute);
            if (scaled) {  // mixed_float16: the dynamic loss scale after training
                j["loss_scale"] = rep.loss_scale.scale;
                j["skipped_steps"] = rep.loss_scale.skipped_steps;
                j["optimizer_iterations"] = rep.optimizer_iterations;
            }
            j["replicas"] = used_replicas;
            j["threads"] = used_threads;
            j["epochs"] = flags.epochs;
            j["batch_size"] = flags.batch_size;
            j["steps_per_epoch"] = flags.steps_per_epoch;
            j["seed"] = flags.seed;
            j["test_accuracy"] = rep.test_accuracy;
            j["test_loss"] = rep.test_loss;
            j["train_images_per_second"] = rep.images_per_second;
            j["test_images_per_second"] = rep.test_images_per_second;
            j["seconds"] = rep.ps ? rep.ps->seconds : rep.seconds;
            if (flags.strategy == "pipeline" || flags.strategy == "hybrid")
            {
                j["pipeline"] = {{"stages", flags.stages}, {"micro_batches", flags.micro_batches}, {"schedule", flags.schedule}};
                if (rep.pipeline_messages > 0) {  // across processes: what rank 0 sent its neighbour, the whole run
                    j["pipeline"]["messages_sent"] = rep.pipeline_messages;
                    j["pipeline"]["message_bytes_sent"] = rep.pipeline_message_bytes;
                    // pipeline × tensor: each shard sent its part of every message (--scatter-gather)
                    j["pipeline"]["scatter_gather"] = flags.tensor_parallel > 1 && flags.scatter_gather == "on";
                }
            }
            if (rep.ps) {
                j["wall_seconds"] = rep.seconds;
                j["workers"] = flags.workers;
                j["servers"] = flags.servers;
                j["sync"] = flags.sync;
                j["k"] = flags.k;
                j["staleness_bound"] = flags.staleness;
                j["straggler"] = flags.straggler;
                j["clock"] = flags.clock;
                j["updates"] = rep.ps->updates;
                j["cancelled"] = rep.ps->cancelled;
                j["dropped"] = rep.ps->dropped;
                j["staleness_max"] = rep.ps->staleness_max;
                j["staleness_mean"] = rep.ps->staleness_mean();
                j["staleness_histogram"] = rep.ps->histogram;
                j["lost_workers"] = std::vector<std::int64_t>(rep.ps->lost_workers.begin(), rep.ps->lost_workers.end());
                j["lost_worker_ranks"] = std::vector<std::int64_t>(rep.ps->lost_ranks.begin(), rep.ps->lost_ranks.end());
            }
            j["epoch_loss"] = rep.epoch_loss;
            j["epoch_accuracy"] = rep.epoch_accuracy;
            j["epoch_val_accuracy"] = rep.epoch_val_accuracy;
            j["epoch_train_seconds"] = rep.epoch_seconds;
            cli::write_json(flags.json, j);
        }
        // A job that lost a worker is done here (saved, reported), but the lost process may
        // never exit (stopped: SIGSTOP), and mpirun --enable-recovery waits for every process:
        // end the job, and say by its status that a rank was lost (3: trained on without it).
        if (rep.ps && !rep.ps->lost_workers.empty() && strata::distribute::launch_info().size > 1) {
            std::string lost;
            for (std::size_t i = 0; i < rep.ps->lost_workers.size(); ++i)
                lost += (i ? ", worker " : "worker ") + std::to_string(rep.ps->lost_workers[i]) + " (rank " +
                        std::to_string(rep.ps->lost_ranks[i]) + ")";
            return end_job_with_lost_ranks(app.get_name(), "training is done, but the job lost " + lost, 3);
        }
        return 0;
    });
}

}  // namespace strata_train
