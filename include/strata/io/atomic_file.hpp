#pragma once
/// \file strata/io/atomic_file.hpp
/// AtomicFileWriter: a file replaced all at once or not at all (checkpoints, backups, plots).

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/core/error.hpp"
#include "strata/io/text.hpp"

namespace strata::io {

/// Writes a file so that readers see either the old content at the target path or the complete
/// new one, never a half-written file, even when the process crashes or the disk fills up.
///
/// How: the bytes go to a fresh temporary file in the target's directory (named
/// `.<target name>.tmp.<pid>.<n>`, created exclusively); commit() flushes it to disk (fsync),
/// renames it over the target (atomic within one file system under POSIX) and fsyncs the
/// directory so the rename itself survives a power cut. A writer destroyed without commit()
/// (an exception unwinding through it) removes its temporary file and leaves the target alone.
/// A process killed while saving cannot: the next successful commit() to the same target
/// removes such stale temporary files of processes that no longer exist (never those of a
/// live process).
/// A symbolic link at the target is replaced by the new file, not followed.
///
/// Requires: a POSIX system. Throws IoError naming the path and the OS's reason on any failure
/// (the temporary file is removed first).
///
/// \code
///   strata::io::AtomicFileWriter out("ckpt/model.safetensors");
///   out.write(header.data(), header.size());
///   out.write(payload.data(), payload.size());
///   out.commit();   // before this line, ckpt/model.safetensors is untouched
/// \endcode
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(std::filesystem::path target) : target_(std::move(target)) {
        STRATA_CHECK(!target_.empty() && target_.has_filename(), ValueError,
                     "AtomicFileWriter: target path ", in_quotes(target_.string()), " names no file");
        std::filesystem::path dir = target_.parent_path();
        if (dir.empty()) dir = ".";
        base_ = target_.filename().string();
        if (base_.size() > 200) base_.resize(200);  // keep the temporary name under NAME_MAX
        static std::atomic<std::uint64_t> counter{0};  // a process-local tie-breaker; O_EXCL settles the rest
        for (int attempt = 0;; ++attempt) {
            const std::uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
            temp_ = dir / ("." + base_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n));
            fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd_ >= 0) break;
            if (errno != EEXIST || attempt >= 100)
                throw_error<IoError>("cannot write ", in_quotes(target_.string()),
                                     ": cannot create the temporary file ", in_quotes(temp_.string()), ": ",
                                     std::strerror(errno));
        }
    }

    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    /// Removes the temporary file unless commit() succeeded.
    ~AtomicFileWriter() { discard(); }

    /// Appends `n` bytes. Throws IoError (after removing the temporary file) on failure, e.g.
    /// "No space left on device".
    void write(const void* data, std::size_t n) {
        STRATA_CHECK(fd_ >= 0, ValueError, "AtomicFileWriter: write after commit or failure");
        const auto* p = static_cast<const char*>(data);
        while (n > 0) {
            const ::ssize_t w = ::write(fd_, p, n);
            if (w < 0) {
                if (errno == EINTR) continue;
                fail("cannot write the temporary file");
            }
            p += w;
            n -= static_cast<std::size_t>(w);
        }
    }

    /// Makes the new content durable and visible at the target path (see the class comment).
    /// Ensures: the target holds exactly the bytes written; no temporary file remains.
    void commit() {
        STRATA_CHECK(fd_ >= 0, ValueError, "AtomicFileWriter: commit twice or after a failure");
        if (::fsync(fd_) != 0) fail("cannot flush the temporary file to disk (fsync)");
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) {
            const int err = errno;
            remove_temp();
            throw_error<IoError>("cannot write ", in_quotes(target_.string()), ": cannot close the temporary file: ",
                                 std::strerror(err));
        }
        if (std::rename(temp_.c_str(), target_.c_str()) != 0) {
            const int err = errno;
            remove_temp();
            throw_error<IoError>("cannot write ", in_quotes(target_.string()), ": cannot rename ",
                                 in_quotes(temp_.string()), " over it: ", std::strerror(err));
        }
        committed_ = true;
        // Durability of the rename; best effort, since some file systems cannot fsync a directory.
        std::filesystem::path dir = target_.parent_path();
        if (dir.empty()) dir = ".";
        const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)::fsync(dfd);
            ::close(dfd);
        }
        remove_stale_temps(dir);
    }

    /// The temporary file's path (for tests and messages).
    const std::filesystem::path& temp_path() const noexcept { return temp_; }
    /// The target path.
    const std::filesystem::path& target_path() const noexcept { return target_; }

private:
    std::filesystem::path target_;
    std::filesystem::path temp_;
    std::string base_;  // the target's file name as the temporary names carry it
    int fd_ = -1;
    bool committed_ = false;

    // Removes `.<base>.tmp.<pid>.<n>` files of this target left by processes that no longer
    // exist: a save killed by a signal cannot remove its own, and nothing else would. Only
    // ESRCH proves the writer gone, so a live process's file stays, also when its pid was
    // reused by an unrelated process, and so does every file of this process (other threads
    // may be writing). A pid names a process of this machine only: machines that share a
    // file system must not save to the same path. Best effort: a failure here is no failure of
    // the save, which has already succeeded.
    void remove_stale_temps(const std::filesystem::path& dir) const noexcept {
        try {
            const std::string prefix = "." + base_ + ".tmp.";
            const auto self = static_cast<long long>(::getpid());
            std::error_code ec;
            for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
                const std::string name = it->path().filename().string();
                if (!name.starts_with(prefix)) continue;
                // The rest must be exactly "<pid>.<n>", both decimal.
                const char* p = name.data() + prefix.size();
                const char* last = name.data() + name.size();
                long long pid = 0;
                std::uint64_t n = 0;
                auto r = std::from_chars(p, last, pid);
                if (r.ec != std::errc{} || r.ptr == last || *r.ptr != '.' || pid <= 0 || pid == self ||
                    pid > std::numeric_limits<::pid_t>::max())
                    continue;
                r = std::from_chars(r.ptr + 1, last, n);
                if (r.ec != std::errc{} || r.ptr != last) continue;
                if (::kill(static_cast<::pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
                ::unlink(it->path().c_str());
            }
        } catch (...) {
        }
    }

    void remove_temp() noexcept { ::unlink(temp_.c_str()); }

    void discard() noexcept {
        if (committed_) return;
        if (fd_ >= 0) {
            ::close(fd_);
            fd_ = -1;
        }
        if (!temp_.empty()) remove_temp();
        temp_.clear();
    }

    [[noreturn]] void fail(const char* what) {
        const int err = errno;
        discard();
        throw_error<IoError>("cannot write ", in_quotes(target_.string()), ": ", what, ": ", std::strerror(err));
    }
};

}  // namespace strata::io
