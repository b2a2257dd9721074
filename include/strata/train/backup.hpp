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
/// | `backup_loss_sum`, `backup_correct`, `backup_seen` | the epoch's running sums (exact decimal) |
///
/// The data pipeline needs no state of its own: `Dataset::iterate(epoch)` is a pure function of
/// the epoch (shuffles included), so fit re-creates the epoch's pass and skips the batches
/// already done, without training on them.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
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
///   IoError naming `dir` when it cannot be created or written; CheckpointError naming the
///   file and what is wrong when the backup is unreadable, corrupt, not a backup, or of another
///   model (other parameter names or shapes, another optimizer). A bad backup is never
///   ignored: remove it to start over.
class BackupAndRestore : public Callback {
public:
    /// The backup's file name inside `dir`.
    static constexpr std::string_view file_name = "backup.safetensors";
    static constexpr int version = 1;

    explicit BackupAndRestore(std::filesystem::path dir, BackupOptions options = {})
        : dir_(std::move(dir)), o_(options) {
        STRATA_CHECK(!dir_.empty(), ValueError, "BackupAndRestore: the backup directory is empty");
        STRATA_CHECK(o_.save_every_steps >= 0, ValueError,
                     "BackupAndRestore: save_every_steps must be >= 0 (0: at every epoch end), got ", o_.save_every_steps);
    }

    /// `<dir>/backup.safetensors`.
    std::filesystem::path file() const { return dir_ / file_name; }
    /// Where the last fit resumed, if it restored a backup.
    const std::optional<TrainingPosition>& restored() const noexcept { return restored_; }
    /// Backups written by this process since the last on_train_begin.
    int backups_written() const noexcept { return written_; }

    void on_train_begin(TrainingContext& ctx) override {
        restored_.reset();
        last_.reset();
        written_ = 0;
        batches_ = 0;
        if (ctx.is_chief()) check_writable();
        std::error_code ec;
        const bool present = std::filesystem::exists(file(), ec);
        if (ec)
            throw_error<IoError>("BackupAndRestore: cannot look for the backup ", io::in_quotes(file().string()), ": ", ec.message());
        if (!present) return;
        const TrainingPosition at = read_position(file());
        ctx.load_state(file().string());  // validates the whole file before the model changes
        ctx.resume = at;
        restored_ = at;
        last_ = at;
    }

    void on_train_batch_end(TrainingContext& ctx, std::int64_t, const Logs&) override {
        if (o_.save_every_steps > 0 && ++batches_ % o_.save_every_steps == 0) backup(ctx);
    }

    void on_epoch_end(TrainingContext& ctx, int, const Logs&) override {
        if (o_.save_every_steps == 0) backup(ctx);
    }

    void on_train_end(TrainingContext& ctx, const Logs&) override {
        if (!ctx.is_chief()) return;
        if (ctx.position.batches > 0) {
            backup(ctx);  // stopped inside an epoch: not done, keep where it stopped
            return;
        }
        if (!o_.delete_at_end) return;
        std::error_code ec;
        std::filesystem::remove(file(), ec);
        if (ec) throw_error<IoError>("BackupAndRestore: cannot remove the backup ", io::in_quotes(file().string()), ": ", ec.message());
    }

    /// The position stored in the backup at `path`. Throws IoError when it cannot be read,
    /// CheckpointError naming the file when it is not a valid backup.
    static TrainingPosition read_position(const std::filesystem::path& path) {
        const std::string where = "BackupAndRestore: backup " + io::in_quotes(path.string()) + ": ";
        io::SafetensorsFile f = [&] {
            try {
                return io::SafetensorsFile::load(path);
            } catch (const CheckpointError& e) {
                throw CheckpointError(where + "corrupt (remove it to start over): " + e.what());
            } catch (const IoError& e) {
                throw IoError(where + "unreadable: " + e.what());
            }
        }();
        auto meta = [&](std::string_view key) -> const std::string& {
            if (!f.has_metadata(key))
                throw_error<CheckpointError>(where, "not a backup written by BackupAndRestore: metadata '", key,
                                             "' is missing (remove the file to start over)");
            return f.metadata(key);
        };
        if (meta("backup_format") != "strata-backup")
            throw_error<CheckpointError>(where, "metadata backup_format: expected 'strata-backup', found ",
                                         io::in_quotes(f.metadata("backup_format"), 64));
        TrainingPosition at;
        try {
            if (parse_metadata_int("backup_version", meta("backup_version"), 0, std::numeric_limits<int>::max()) != version)
                throw_error<CheckpointError>(where, "backup version ", f.metadata("backup_version"), "; this strata reads version ",
                                             version);
            constexpr auto i64_max = std::numeric_limits<std::int64_t>::max();
            at.epoch = int(parse_metadata_int("backup_epoch", meta("backup_epoch"), 0, std::numeric_limits<int>::max()));
            at.batches = parse_metadata_int("backup_batches", meta("backup_batches"), 0, i64_max);
            at.seen = parse_metadata_int("backup_seen", meta("backup_seen"), 0, i64_max);
            at.loss_sum = parse_double(where, "backup_loss_sum", meta("backup_loss_sum"));
            at.correct = parse_double(where, "backup_correct", meta("backup_correct"));
        } catch (const CheckpointError& e) {
            const std::string_view what = e.what();
            if (what.starts_with(where)) throw;
            throw CheckpointError(where + std::string(what));
        }
        return at;
    }

private:
    static double parse_double(const std::string& where, std::string_view key, const std::string& text) {
        double v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
        if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(v))
            throw_error<CheckpointError>(where, "metadata '", key, "': expected a finite decimal number, found ",
                                         io::in_quotes(text, 64));
        return v;
    }

    // %.17g reads back as the same double: the resumed epoch's sums are the interrupted ones.
    static std::string exact(double v) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        return buf;
    }

    // Checked when training starts, not at the first backup an hour later. The probe is an
    // AtomicFileWriter never committed: it creates its temporary file and removes it.
    void check_writable() const {
        std::error_code ec;
        std::filesystem::create_directories(dir_, ec);
        if (ec || !std::filesystem::is_directory(dir_))
            throw_error<IoError>("BackupAndRestore: cannot create the backup directory ", io::in_quotes(dir_.string()), ": ",
                                 ec ? ec.message() : std::string("a file of that name is in the way"));
        try {
            io::AtomicFileWriter probe(dir_ / ".write-probe");
        } catch (const IoError& e) {
            throw IoError("BackupAndRestore: the backup directory " + io::in_quotes(dir_.string()) + " is not writable: " + e.what());
        }
    }

    void backup(TrainingContext& ctx) {
        if (!ctx.is_chief()) return;  // every process holds the same state; one writes it
        const TrainingPosition at = ctx.position;
        if (last_ && *last_ == at) return;  // already backed up at this very position
        ctx.save_state(file().string(), {{"backup_format", "strata-backup"},
                                         {"backup_version", std::to_string(version)},
                                         {"backup_epoch", std::to_string(at.epoch)},
                                         {"backup_batches", std::to_string(at.batches)},
                                         {"backup_loss_sum", exact(at.loss_sum)},
                                         {"backup_correct", exact(at.correct)},
                                         {"backup_seen", std::to_string(at.seen)}});
        last_ = at;
        ++written_;
    }

    std::filesystem::path dir_;
    BackupOptions o_;
    std::optional<TrainingPosition> restored_, last_;
    std::int64_t batches_ = 0;
    int written_ = 0;
};

}  // namespace strata::train
