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

#include <charconv>
#include <cerrno>
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

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

    explicit BackupAndRestore(std::filesystem::path dir, BackupOptions options = {})
        : dir_(std::move(dir)), o_(options) {
        STRATA_CHECK(!dir_.empty(), ValueError, "BackupAndRestore: the backup directory is empty");
        STRATA_CHECK(o_.save_every_steps >= 0, ValueError,
                     "BackupAndRestore: save_every_steps must be >= 0 (0: at every epoch end), got ", o_.save_every_steps);
    }

    BackupAndRestore(const BackupAndRestore&) = delete;
    BackupAndRestore& operator=(const BackupAndRestore&) = delete;
    ~BackupAndRestore() override { unlock(false); }

    /// `<dir>/backup.safetensors`.
    std::filesystem::path file() const { return dir_ / file_name; }
    /// `<dir>/lock`: held (flock) by the chief while a fit runs.
    std::filesystem::path lock_file() const { return dir_ / "lock"; }
    /// Where the last fit resumed, if it restored a backup.
    const std::optional<TrainingPosition>& restored() const noexcept { return restored_; }
    /// Backups written by this process since the last on_train_begin.
    int backups_written() const noexcept { return written_; }

    void on_train_begin(TrainingContext& ctx) override {
        restored_.reset();
        last_.reset();
        written_ = 0;
        batches_ = 0;
        if (ctx.is_chief()) {
            check_writable();
            lock();
        }
        try {
            restore(ctx);
        } catch (...) {
            unlock(false);  // fit does not start: the directory is free again
            throw;
        }
    }

    void on_train_batch_end(TrainingContext& ctx, std::int64_t, const Logs&) override {
        if (o_.save_every_steps > 0 && ++batches_ % o_.save_every_steps == 0) backup(ctx);
    }

    void on_epoch_end(TrainingContext& ctx, int, const Logs&) override {
        if (o_.save_every_steps == 0) backup(ctx);
    }

    void on_train_end(TrainingContext& ctx, const Logs&) override {
        if (!ctx.is_chief() && !ctx.gathers_state()) return;
        if (ctx.position.batches > 0) {
            backup(ctx);  // stopped inside an epoch: not done, keep where it stopped
            if (ctx.is_chief()) unlock(true);
            return;
        }
        if (!ctx.is_chief()) return;
        if (o_.delete_at_end) {
            std::error_code ec;
            std::filesystem::remove(file(), ec);
            if (ec) throw_error<IoError>("BackupAndRestore: cannot remove the backup ", io::in_quotes((file()).string()), ": ", ec.message());
        }
        unlock(true);
    }

    /// The position stored in the backup at `path`. Throws IoError when it cannot be read,
    /// CheckpointError naming the file when it is not a valid backup.
    static TrainingPosition read_position(const std::filesystem::path& path) { return read(path).position; }

    /// The configuration stored in the backup at `path` (BackupOptions::config of the run that
    /// wrote it). Throws as read_position.
    static std::map<std::string, std::string> read_config(const std::filesystem::path& path) { return read(path).config; }

private:
    void restore(TrainingContext& ctx) {
        std::error_code ec;
        const auto st = std::filesystem::symlink_status(file(), ec);
        if (ec && ec != std::errc::no_such_file_or_directory)
            throw_error<IoError>("BackupAndRestore: cannot look for the backup ", io::in_quotes((file()).string()), ": ", ec.message());
        if (!std::filesystem::exists(st)) return;
        // A dangling link is a backup that went missing, not a fresh start.
        std::error_code target_ec;
        if (std::filesystem::is_symlink(st) && !std::filesystem::exists(file(), target_ec)) {
            const auto target = std::filesystem::read_symlink(file(), ec);
            throw_error<CheckpointError>("BackupAndRestore: backup ", io::in_quotes((file()).string()), " is a symbolic link to ",
                                         ec ? std::string("a path that cannot be read") : io::in_quotes((target).string()), ", which ",
                                         target_ec ? "cannot be reached: " + target_ec.message() : std::string("does not exist"),
                                         " (restore what it points to, or remove the link to start over)");
        }
        const Stored stored = read(file());
        check_config(stored.config);
        ctx.load_state(file().string());  // validates the whole file before the model changes
        ctx.resume = stored.position;
        restored_ = stored.position;
        last_ = stored.position;
    }

    struct Stored {
        TrainingPosition position;
        std::map<std::string, std::string> config;
    };
    static constexpr std::string_view config_prefix = "backup_config.";

    static Stored read(const std::filesystem::path& path) {
        const std::string where = "BackupAndRestore: backup " + io::in_quotes((path).string()) + ": ";
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
        Stored out{at, {}};
        for (const auto& [key, value] : f.metadata())
            if (std::string_view(key).starts_with(config_prefix)) out.config[key.substr(config_prefix.size())] = value;
        return out;
    }

    // Refuses a backup of another configuration (or warns, with allow_config_change).
    void check_config(const std::map<std::string, std::string>& stored) const {
        std::string diff;
        auto text = [](const std::map<std::string, std::string>& m, const std::string& k) {
            const auto it = m.find(k);
            return it == m.end() ? std::string("(not set)") : it->second.empty() ? std::string("(none)") : it->second;
        };
        std::map<std::string, std::string> keys = stored;
        keys.insert(o_.config.begin(), o_.config.end());
        for (const auto& [k, unused] : keys)
            if (text(stored, k) != text(o_.config, k))
                diff += (diff.empty() ? "" : "; ") + k + ": the backup has " + text(stored, k) + ", this run " + text(o_.config, k);
        if (diff.empty()) return;
        if (o_.allow_config_change) {
            std::fprintf(stderr, "strata: warning: BackupAndRestore: resuming backup %s made under another configuration "
                                 "(allow_config_change): %s\n", io::in_quotes((file()).string()).c_str(), diff.c_str());
            return;
        }
        throw_error<CheckpointError>("BackupAndRestore: backup ", io::in_quotes((file()).string()), " was made by a run with another configuration: ",
                                     diff, " (run with the backup's configuration to resume it; remove it to start over; or "
                                     "allow the change: BackupOptions::allow_config_change, mnist_cnn --backup-force)");
    }

    // Takes <dir>/lock (flock, not waiting): a second live run on this directory is refused,
    // naming the process that holds it (the pid written in the file). A crashed run's lock
    // goes with its process; where the file system has no locks, a warning says so. After the lock is taken, the file must still be the one at the
    // path (another run may have removed it at its end and a third made a new one): else again.
    void lock() {
        if (lock_fd_ >= 0) return;
        const std::string path = lock_file().string();
        for (int attempt = 0; attempt < 100; ++attempt) {
            const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0)
                throw_error<IoError>("BackupAndRestore: cannot open the lock file ", io::in_quotes((lock_file()).string()), ": ", std::strerror(errno));
            if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
                const int err = errno;
                char buf[32] = {};
                const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
                ::close(fd);
                std::string pid(buf, n > 0 ? std::size_t(n) : 0);
                while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
                if (err == EWOULDBLOCK)
                    throw_error<IoError>("BackupAndRestore: the backup directory ", io::in_quotes((dir_).string()), " is in use by another run (process ",
                                         pid.empty() ? std::string("unknown") : pid, " holds ", io::in_quotes((lock_file()).string()),
                                         "); two runs on one backup directory would resume from each other's backups: wait for "
                                         "it to end, or give this run another directory");
                // A file system without locks (some network mounts): train, but say what is not guarded.
                std::fprintf(stderr, "strata: warning: BackupAndRestore: cannot lock %s (%s): a second run on this directory "
                                     "would not be refused\n", io::in_quotes((lock_file()).string()).c_str(), std::strerror(err));
                return;
            }
            struct stat held {}, now {};
            if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 && held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
                const std::string pid = std::to_string(::getpid()) + "\n";
                if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
                    // The pid is only for the message of a run that finds the lock held.
                }
                lock_fd_ = fd;
                return;
            }
            ::close(fd);
        }
        throw_error<IoError>("BackupAndRestore: cannot lock ", io::in_quotes((lock_file()).string()), ": it keeps being replaced");
    }

    // Releases the lock; `remove`: also removes the lock file (at the end of a fit).
    void unlock(bool remove) noexcept {
        if (lock_fd_ < 0) return;
        if (remove) ::unlink(lock_file().c_str());
        ::close(lock_fd_);
        lock_fd_ = -1;
    }

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
        // Every process holds the same state; one writes it (the others help gather it where
        // the model is split over them).
        if (!ctx.is_chief() && !ctx.gathers_state()) return;
        const TrainingPosition at = ctx.position;
        if (last_ && *last_ == at) return;  // already backed up at this very position
        std::map<std::string, std::string> meta{{"backup_format", "strata-backup"},
                                                {"backup_version", std::to_string(version)},
                                                {"backup_epoch", std::to_string(at.epoch)},
                                                {"backup_batches", std::to_string(at.batches)},
                                                {"backup_loss_sum", exact(at.loss_sum)},
                                                {"backup_correct", exact(at.correct)},
                                                {"backup_seen", std::to_string(at.seen)}};
        for (const auto& [k, v] : o_.config) meta[std::string(config_prefix) + k] = v;
        ctx.save_state(file().string(), meta);
        last_ = at;
        if (ctx.is_chief()) ++written_;
    }

    std::filesystem::path dir_;
    BackupOptions o_;
    std::optional<TrainingPosition> restored_, last_;
    std::int64_t batches_ = 0;
    int written_ = 0;
    int lock_fd_ = -1;  // <dir>/lock while this run holds it
};

}  // namespace strata::train
