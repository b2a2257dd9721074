#pragma once
/// \file strata/io/impl/atomic_file.ipp
/// The definitions behind strata/io/atomic_file.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <atomic>
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

STRATA_DECL AtomicFileWriter::AtomicFileWriter(std::filesystem::path target) : target_(std::move(target)) {
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
