#pragma once
/// \file strata/train/backup.hpp
/// `BackupAndRestore`: Keras's fault-tolerance callback. It backs the whole training state up
/// into one file at the end of every epoch (or every N batches); a job that dies and is started
/// again with the same callback resumes from the backup and runs only the remaining work, and
/// ends with the weights an uninterrupted run would have had, bit for bit.
///
/// \code
/// auto backup = std::make_shared<strata::train::BackupAndRestore>("run1/backup");
/// model.fit(train, {.epochs = 10, .callbacks = {backup}});   // killed in epoch 4? run it again
/// \endcode
///
/// The backup (`<dir>/backup.safetensors`) is a strata checkpoint (see train/checkpoint.hpp:
/// weights, optimizer slots and iterations, learning rate, epochs done, the model's step
/// counter that dropout's random streams depend on) written atomically by Model::save, with
/// the position inside the epoch added to its metadata:
///
/// | metadata                          | what                                                   |
/// |-----------------------------------|--------------------------------------------------------|
/// | `backup_format` = `strata-backup` | marks a backup; `backup_version` = `1`                 |
/// | `backup_epoch`, `backup_batches`  | the epoch fit was in (from 0) and its batches done     |
/// | `backup_loss_sum`, `backup_correct`, `backup_counted`, `backup_seen` | the epoch's running sums (exact decimal; a backup without `backup_counted` counts `backup_seen`) |
/// | `backup_config.KEY`               | the run's configuration (BackupOptions::config)        |
///
/// A backup belongs to its run: one made under another configuration (batch size, seed, ...:
/// whatever BackupOptions::config holds) is refused unless BackupOptions::allow_config_change,
/// and while a fit runs its chief holds `<dir>/lock` (flock), so that a second run on the same
/// directory is refused instead of resuming from the first one's live backups.
///
/// The data pipeline needs no state of its own: `Dataset::iterate(epoch)` is a pure function of
/// the epoch (shuffles included), so fit re-creates the epoch's pass and skips the batches
/// already done, without training on them.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/io/atomic_file.hpp"
#include "strata/io/safetensors.hpp"
#include "strata/io/text.hpp"

namespace strata::train {

/// Options of BackupAndRestore (Keras's save_freq and delete_checkpoint).
struct BackupOptions {
    /// 0: back up at the end of every epoch (Keras's `save_freq="epoch"`); N > 0: after every
    /// N batches, counted across epochs (Keras's `save_freq=N`), and not at epoch ends.
    std::int64_t save_every_steps = 0;
    /// Remove the backup when fit ends normally (Keras's `delete_checkpoint`).
    bool delete_at_end = true;
    /// The run's configuration that changes its trajectory, as key = value (batch size, seed,
    /// model, optimizer and its hyper-parameters, strategy and replicas, dataset size: what the
    /// caller knows). Stored in every backup; a backup whose configuration differs is refused
    /// (CheckpointError naming each key that differs, the backup's value and this run's).
    std::map<std::string, std::string> config{};
    /// Resume a backup even when its configuration differs from `config` (a warning names the
    /// differences on stderr); the backups written from then on carry the new configuration.
    bool allow_config_change = false;
};

/// Backs up the training state into `dir` during fit, and restores it when fit starts again
/// (Keras's `tf.keras.callbacks.BackupAndRestore`).
///
/// - on_train_begin: checks that `dir` can be written (created if missing); if a backup is
///   there, restores it into the model (every process of a multi-process job does) and makes
///   fit continue at the backup's epoch and batch, whatever `initial_epoch` says. With the same
///   model, compile and fit arguments, the resumed run ends bitwise equal to an uninterrupted
///   one, and its epoch figures are the same.
/// - at every epoch end (or every `save_every_steps` batches): the chief (rank 0) writes the
///   backup atomically (a crash mid-write leaves the previous backup whole).
/// - on_train_end: if fit stopped part-way through an epoch (StopOnSignal on SIGTERM, a
///   callback's stop_training), the chief backs up that very position and keeps it, so the
///   job resumes where it stopped; otherwise training is over and the backup is removed
///   (unless `delete_at_end = false`).
///
/// Requires: the model of the resumed run has the same parameters and optimizer as the one
/// that wrote the backup; schedules set by callbacks depend on the epoch only (a resumed epoch
/// calls on_epoch_begin again); under ParameterServer, back up at epoch ends only (its updates
/// do not follow the data's order, so there is no batch to resume at).
/// Throws (from on_train_begin, so from fit, before any training):
///   IoError naming `dir` when it cannot be created or written, or when another live run holds
///   its lock (naming that process); CheckpointError naming the file and what is wrong when the
///   backup is unreadable, corrupt, a dangling symbolic link, not a backup, of another model
///   (other parameter names or shapes, another optimizer) or of another configuration. A bad
///   backup is never ignored: remove it to start over.
class BackupAndRestore : public Callback {
public:
    /// The backup's file name inside `dir`.
    static constexpr std::string_view file_name = "backup.safetensors";
    static constexpr int version = 1;

    STRATA_DECL explicit BackupAndRestore(std::filesystem::path dir, BackupOptions options = {});

    BackupAndRestore(const BackupAndRestore&) = delete;
    BackupAndRestore& operator=(const BackupAndRestore&) = delete;
    STRATA_DECL ~BackupAndRestore() override;

    /// `<dir>/backup.safetensors`.
    std::filesystem::path file() const { return dir_ / file_name; }
    /// `<dir>/lock`: held (flock) by the chief while a fit runs.
    std::filesystem::path lock_file() const { return dir_ / "lock"; }
    /// Where the last fit resumed, if it restored a backup.
    const std::optional<TrainingPosition>& restored() const noexcept { return restored_; }
    /// Backups written by this process since the last on_train_begin.
    int backups_written() const noexcept { return written_; }

    STRATA_DECL void on_train_begin(TrainingContext& ctx) override;

    void on_train_batch_end(TrainingContext& ctx, std::int64_t, const Logs&) override {
        if (o_.save_every_steps > 0 && ++batches_ % o_.save_every_steps == 0) backup(ctx);
    }

    void on_epoch_end(TrainingContext& ctx, int, const Logs&) override {
        if (o_.save_every_steps == 0) backup(ctx);
    }

    STRATA_DECL void on_train_end(TrainingContext& ctx, const Logs&) override;

    /// The position stored in the backup at `path`. Throws IoError when it cannot be read,
    /// CheckpointError naming the file when it is not a valid backup.
    static TrainingPosition read_position(const std::filesystem::path& path) { return read(path).position; }

    /// The configuration stored in the backup at `path` (BackupOptions::config of the run that
    /// wrote it). Throws as read_position.
    static std::map<std::string, std::string> read_config(const std::filesystem::path& path) { return read(path).config; }

private:
    STRATA_DECL void restore(TrainingContext& ctx);

    struct Stored {
        TrainingPosition position;
        std::map<std::string, std::string> config;
    };
    static constexpr std::string_view config_prefix = "backup_config.";

    STRATA_DECL static Stored read(const std::filesystem::path& path);

    // Refuses a backup of another configuration (or warns, with allow_config_change).
    STRATA_DECL void check_config(const std::map<std::string, std::string>& stored) const;

    // Takes <dir>/lock (flock, not waiting): a second live run on this directory is refused,
    // naming the process that holds it (the pid written in the file). A crashed run's lock
    // goes with its process; where the file system has no locks, a warning says so. After the lock is taken, the file must still be the one at the
    // path (another run may have removed it at its end and a third made a new one): else again.
    STRATA_DECL void lock();

    // Releases the lock; `remove`: also removes the lock file (at the end of a fit).
    STRATA_DECL void unlock(bool remove) noexcept;

    STRATA_DECL static double parse_double(const std::string& where, std::string_view key, const std::string& text);

    // %.17g reads back as the same double: the resumed epoch's sums are the interrupted ones.
    STRATA_DECL static std::string exact(double v);

    // Checked when training starts, not at the first backup an hour later. The probe is an
    // AtomicFileWriter never committed: it creates its temporary file and removes it.
    STRATA_DECL void check_writable() const;

    STRATA_DECL void backup(TrainingContext& ctx);

    std::filesystem::path dir_;
    BackupOptions o_;
    std::optional<TrainingPosition> restored_, last_;
    std::int64_t batches_ = 0;
    int written_ = 0;
    int lock_fd_ = -1;  // <dir>/lock while this run holds it
};

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/backup.ipp"
#endif
