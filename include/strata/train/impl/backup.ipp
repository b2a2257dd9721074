#pragma once
/// \file strata/train/impl/backup.ipp
/// The definitions behind strata/train/backup.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <cerrno>
#include <charconv>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/core/stop_signal.hpp"
#include "strata/train/backup.hpp"

namespace strata::train {

STRATA_DECL BackupAndRestore::BackupAndRestore(std::filesystem::path dir, BackupOptions options)
    : dir_(std::move(dir)), o_(options) {
    STRATA_CHECK(!dir_.empty(), ValueError, "BackupAndRestore: the backup directory is empty");
    STRATA_CHECK(o_.save_every_steps >= 0, ValueError,
                 "BackupAndRestore: save_every_steps must be >= 0 (0: at every epoch end), got ", o_.save_every_steps);
}

STRATA_DECL BackupAndRestore::~BackupAndRestore() { unlock(false); }

STRATA_DECL void BackupAndRestore::on_train_begin(TrainingContext& ctx) {
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

STRATA_DECL void BackupAndRestore::on_train_end(TrainingContext& ctx, const Logs&) {
    if (!ctx.is_chief() && !ctx.gathers_state()) return;
    // Stopped inside an epoch, or by a signal at an epoch's end with epochs left (issue 41:
    // under mpirun the stop-time backup is what a relaunch resumes from): keep where it stopped.
    if (ctx.position.batches > 0 || stop_signal().load() != 0) {
        backup(ctx);
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

STRATA_DECL void BackupAndRestore::restore(TrainingContext& ctx) {
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

STRATA_DECL BackupAndRestore::Stored BackupAndRestore::read(const std::filesystem::path& path) {
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
        // What the accuracy is out of (the tokens that count, with a token mask at the output);
        // a backup written before it was kept counted examples.
        at.counted = f.metadata().contains("backup_counted") ? parse_double(where, "backup_counted", f.metadata("backup_counted"))
                                                             : double(at.seen);
        if (at.counted < 0)
            throw_error<CheckpointError>(where, "metadata 'backup_counted': expected a count of 0 or more, found ",
                                         f.metadata("backup_counted"));
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

STRATA_DECL void BackupAndRestore::check_config(const std::map<std::string, std::string>& stored) const {
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

STRATA_DECL void BackupAndRestore::lock() {
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

STRATA_DECL void BackupAndRestore::unlock(bool remove) noexcept {
    if (lock_fd_ < 0) return;
    if (remove) ::unlink(lock_file().c_str());
    ::close(lock_fd_);
    lock_fd_ = -1;
}

STRATA_DECL double BackupAndRestore::parse_double(const std::string& where, std::string_view key, const std::string& text) {
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(v))
        throw_error<CheckpointError>(where, "metadata '", key, "': expected a finite decimal number, found ",
                                     io::in_quotes(text, 64));
    return v;
}

STRATA_DECL std::string BackupAndRestore::exact(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

STRATA_DECL void BackupAndRestore::check_writable() const {
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

STRATA_DECL void BackupAndRestore::backup(TrainingContext& ctx) {
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
                                            {"backup_counted", exact(at.counted)},
                                            {"backup_seen", std::to_string(at.seen)}};
    for (const auto& [k, v] : o_.config) meta[std::string(config_prefix) + k] = v;
    ctx.save_state(file().string(), meta);
    last_ = at;
    if (ctx.is_chief()) ++written_;
}

}  // namespace strata::train
