#pragma once
/// \file strata/io/atomic_file.hpp
/// AtomicFileWriter: a file replaced all at once or not at all (checkpoints, backups, plots).

#include <cstddef>
#include <filesystem>
#include <string>

#include "strata/config.hpp"

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
/// Only a regular file, a symbolic link or a new name is ever replaced: a directory, a device
/// node, a FIFO or a socket at the target is refused (check_output_target(), in the
/// constructor and again just before the rename), so that `--json /dev/null` run as root can
/// never replace the machine's /dev/null. The second check narrows the window, it cannot close
/// it: POSIX has no rename that refuses a non-regular target, so a node created at the target
/// by another process between that check and the rename would still be replaced.
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
    /// Refuses, in the constructor, a target check_output_target() refuses.
    explicit AtomicFileWriter(std::filesystem::path target);

    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    /// Removes the temporary file unless commit() succeeded.
    ~AtomicFileWriter();

    /// Appends `n` bytes. Throws IoError (after removing the temporary file) on failure, e.g.
    /// "No space left on device".
    void write(const void* data, std::size_t n);

    /// Makes the new content durable and visible at the target path (see the class comment).
    /// Ensures: the target holds exactly the bytes written; no temporary file remains.
    void commit();

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
    void remove_stale_temps(const std::filesystem::path& dir) const noexcept;

    void remove_temp() noexcept;

    void discard() noexcept;

    [[noreturn]] void fail(const char* what);
};

/// Throws IoError unless `target` is a name AtomicFileWriter may replace: a regular file, a
/// symbolic link (replaced, not followed) or a name that does not exist yet, whose file name
/// fits the file system's NAME_MAX (pathconf of its directory) and whose path, and that of the
/// writer's temporary file beside it, fit PATH_MAX. The message names the path, what was
/// expected and what was found ("found a FIFO", "found a character device", "a file name of
/// 300 bytes, the file system in 'runs' allows 255"). ValueError for a path that names no file.
/// Whether the directory exists and can be written is left to the write itself (its error
/// names the OS's reason); a program that wants every check before hours of work calls this
/// and also checks the directory.
///
/// \code
///   strata::io::check_output_target("/dev/null");   // IoError: ... found a character device
/// \endcode
STRATA_DECL void check_output_target(const std::filesystem::path& target);

}  // namespace strata::io

#if STRATA_DEFINITIONS
#include "strata/io/impl/atomic_file.ipp"
#endif
