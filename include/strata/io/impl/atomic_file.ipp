#pragma once
/// \file strata/io/impl/atomic_file.ipp
/// The definitions behind strata/io/atomic_file.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <atomic>
#include <climits>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/core/error.hpp"
#include "strata/io/atomic_file.hpp"
#include "strata/io/text.hpp"

namespace strata::io {

namespace detail {
// The temporary file's name keeps at most this much of the target's, so that it stays under
// NAME_MAX (255 on every Linux file system) with its ".tmp.<pid>.<n>" suffix.
inline constexpr std::size_t temp_base_max = 200;
// ".<base>.tmp.<pid>.<n>": the longest the suffix gets (pid and counter in decimal).
inline constexpr std::size_t temp_extra_max = 1 + 5 + 20 + 1 + 20;

// What a non-regular file is, in words, for messages ("a FIFO").
inline const char* kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "a file that is not a regular file";
}

// Throws unless the target is absent, a regular file or a symbolic link (what a rename may
// replace without touching anything that is not ours). `when`: what the writer was about to do.
inline void refuse_non_regular(const std::filesystem::path& target, const char* when) {
    struct stat st {};
    if (::lstat(target.c_str(), &st) != 0) return;  // absent, or unreadable: the write names the reason
    if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return;
    throw_error<IoError>("cannot write ", in_quotes(target.string()), ": expected a regular file or a new name, found ",
                         kind_of(st.st_mode), "; it is left as it is", when);
}
}  // namespace detail

STRATA_DECL void check_output_target(const std::filesystem::path& target) {
    STRATA_CHECK(!target.empty() && target.has_filename(), ValueError, "output path ", in_quotes(target.string()),
                 " names no file");
    detail::refuse_non_regular(target, "");
    std::filesystem::path dir = target.parent_path();
    if (dir.empty()) dir = ".";
    const std::size_t name = target.filename().native().size();
    // Asked of the directory, since file systems differ (and a name can only be too long for the
    // one it is created in); where the directory is missing the write says so itself.
    errno = 0;
    const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
    if (name_max > 0 && name > std::size_t(name_max))
        throw_error<IoError>("cannot write ", in_quotes(target.string()), ": expected a file name of at most ", name_max,
                             " bytes (NAME_MAX of the file system of ", in_quotes(dir.string()), "), found one of ", name, " bytes");
    long path_max = ::pathconf(dir.c_str(), _PC_PATH_MAX);
    if (path_max <= 0) path_max = PATH_MAX;
    const std::size_t temp = dir.native().size() + 1 + std::min(name, detail::temp_base_max) + detail::temp_extra_max;
    const std::size_t longest = std::max(target.native().size(), temp);
    if (longest >= std::size_t(path_max))
        throw_error<IoError>("cannot write ", in_quotes(target.string()), ": expected a path shorter than ", path_max,
                             " bytes (PATH_MAX), found ", target.native().size(), " bytes",
                             longest > target.native().size() ? " (and the temporary file beside it needs more)" : "");
}

STRATA_DECL AtomicFileWriter::AtomicFileWriter(std::filesystem::path target) : target_(std::move(target)) {
    STRATA_CHECK(!target_.empty() && target_.has_filename(), ValueError,
                 "AtomicFileWriter: target path ", in_quotes(target_.string()), " names no file");
    check_output_target(target_);  // before any byte is written: a device or a FIFO is not ours to replace
    std::filesystem::path dir = target_.parent_path();
    if (dir.empty()) dir = ".";
    base_ = target_.filename().string();
    if (base_.size() > detail::temp_base_max) base_.resize(detail::temp_base_max);
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

STRATA_DECL AtomicFileWriter::~AtomicFileWriter() { discard(); }

STRATA_DECL void AtomicFileWriter::write(const void* data, std::size_t n) {
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

STRATA_DECL void AtomicFileWriter::commit() {
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
    try {
        // Again: the target may have changed since the constructor (minutes of writing ago).
        detail::refuse_non_regular(target_, " (found just before the rename)");
    } catch (...) {
        remove_temp();
        throw;
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

STRATA_DECL void AtomicFileWriter::remove_stale_temps(const std::filesystem::path& dir) const noexcept {
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

STRATA_DECL void AtomicFileWriter::remove_temp() noexcept { ::unlink(temp_.c_str()); }

STRATA_DECL void AtomicFileWriter::discard() noexcept {
    if (committed_) return;
    if (fd_ >= 0) {
        ::close(fd_);
        fd_ = -1;
    }
    if (!temp_.empty()) remove_temp();
    temp_.clear();
}

[[noreturn]] STRATA_DECL void AtomicFileWriter::fail(const char* what) {
    const int err = errno;
    discard();
    throw_error<IoError>("cannot write ", in_quotes(target_.string()), ": ", what, ": ", std::strerror(err));
}

}  // namespace strata::io
