#pragma once
/// \file strata/io/tensorboard.hpp
/// TensorBoard event files without TensorFlow or protobuf: the format and a writer of scalars
/// (EventFileWriter). The Keras callback built on it is strata/train/tensorboard.hpp. Opt-in:
/// strata/strata.hpp does not include it.
///
/// The file format, written by hand from TensorFlow's sources:
///   - a file is a sequence of TFRecords (tensorflow/core/lib/io/record_writer.cc):
///       uint64 length, uint32 masked_crc32c(length), byte data[length], uint32 masked_crc32c(data)
///     little-endian, where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 and
///     crc32c is CRC-32C (Castagnoli, polynomial 0x82f63b78 reflected);
///   - each record is an Event protobuf (tensorflow/core/util/event.proto): wall_time = 1
///     (double), step = 2 (int64), file_version = 3 (string, "brain.Event:2" in the first
///     event) or summary = 5 (Summary);
///   - a Summary (tensorflow/core/framework/summary.proto) is repeated Value value = 1, and a
///     scalar Value is tag = 1 (string), simple_value = 2 (float).
/// Files are named events.out.tfevents.<seconds since 1970, 10 digits>.<host name>, as
/// TensorFlow's EventsWriter names them, with ".<pid>.<n>" added so that two writers started in
/// the same second never share a file (TensorBoard reads every file whose name holds "tfevents").
///
/// \code
///   strata::io::tensorboard::EventFileWriter w("logs/study/mirrored");   // any scalars, any steps
///   w.add_scalar("accuracy_vs_seconds", 0.91, /*step=*/12);
/// \endcode

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "strata/core/error.hpp"
#include "strata/io/text.hpp"

namespace strata::io::tensorboard {

namespace detail {

/// The CRC-32C lookup table (reflected polynomial 0x82f63b78), built at compile time.
inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        t[i] = c;
    }
    return t;
}();

}  // namespace detail

/// CRC-32C (Castagnoli) of `n` bytes, the checksum TFRecords use. crc32c("123456789") is
/// 0xe3069283 (the check value of the CRC catalogue).
inline std::uint32_t crc32c(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint32_t c = 0xffffffffu;
    for (std::size_t i = 0; i < n; ++i) c = detail::crc32c_table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

/// TFRecord's masked CRC: a CRC stored next to the data it covers is masked so that a CRC of
/// data that itself holds CRCs stays well distributed (tensorflow/core/lib/hash/crc32c.h).
inline std::uint32_t masked_crc32c(const void* data, std::size_t n) {
    const std::uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/// Protobuf wire-format encoding, just what Event and Summary need.
namespace proto {

/// Appends `v` as a base-128 varint.
inline void varint(std::string& out, std::uint64_t v) {
    while (v >= 0x80) {
        out += char((v & 0x7f) | 0x80);
        v >>= 7;
    }
    out += char(v);
}
/// Appends the key of field `field` with wire type `wire` (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
inline void key(std::string& out, int field, int wire) { varint(out, (std::uint64_t(field) << 3) | std::uint64_t(wire)); }
/// Appends `n` bytes little-endian, the byte order of protobuf's fixed-width fields.
inline void little_endian(std::string& out, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out += char((v >> (8 * i)) & 0xff);
}
inline void field_double(std::string& out, int field, double v) {
    key(out, field, 1);
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    little_endian(out, bits, 8);
}
inline void field_float(std::string& out, int field, float v) {
    key(out, field, 5);
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    little_endian(out, bits, 4);
}
/// An int64 field; like every proto3 scalar outside a oneof, a zero is not written at all (so the
/// bytes are the ones protobuf itself would write).
inline void field_int64(std::string& out, int field, std::int64_t v) {
    if (v == 0) return;
    key(out, field, 0);
    varint(out, std::uint64_t(v));  // negative int64 take ten bytes, as protobuf writes them
}
inline void field_bytes(std::string& out, int field, std::string_view bytes) {
    key(out, field, 2);
    varint(out, bytes.size());
    out.append(bytes);
}

}  // namespace proto

/// One scalar of a Summary: a tag and its value.
struct Scalar {
    std::string tag;
    double value;
};

/// The Event protobuf holding `scalars` (as Summary.Value simple_value) at `step`.
inline std::string scalar_event(double wall_time, std::int64_t step, const std::vector<Scalar>& scalars) {
    std::string summary;
    for (const auto& s : scalars) {
        STRATA_CHECK(!s.tag.empty(), ValueError, "TensorBoard: a scalar needs a tag (a name), found an empty one");
        std::string value;
        proto::field_bytes(value, 1, s.tag);
        proto::field_float(value, 2, float(s.value));
        proto::field_bytes(summary, 1, value);
    }
    std::string event;
    proto::field_double(event, 1, wall_time);
    proto::field_int64(event, 2, step);
    proto::field_bytes(event, 5, summary);
    return event;
}

/// The first Event of every file: it names the format version.
inline std::string file_version_event(double wall_time) {
    std::string event;
    proto::field_double(event, 1, wall_time);
    proto::field_int64(event, 2, 0);
    proto::field_bytes(event, 3, "brain.Event:2");
    return event;
}

/// `data` framed as one TFRecord: length, its masked CRC, the data, its masked CRC.
inline std::string tf_record(std::string_view data) {
    std::string out;
    const std::uint64_t n = data.size();
    std::string length;
    proto::little_endian(length, n, 8);
    out += length;
    proto::little_endian(out, masked_crc32c(length.data(), 8), 4);
    out.append(data);
    proto::little_endian(out, masked_crc32c(data.data(), data.size()), 4);
    return out;
}

/// Seconds since 1970 on the system clock, with sub-second digits (Event.wall_time).
inline double wall_time_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Writes one TensorBoard event file in `directory` (created if missing): the file-version
/// event first, then the scalars given. Each add_scalar/add_scalars appends one record and
/// flushes it, so a running TensorBoard shows the figures as they come.
///
/// Requires: a directory that can be created and written; throws IoError naming it otherwise.
/// Not thread-safe: one writer per thread (or a lock around it).
class EventFileWriter {
public:
    explicit EventFileWriter(const std::filesystem::path& directory) {
        std::error_code ec;
        std::filesystem::create_directories(directory, ec);
        if (ec)
            throw_error<IoError>("TensorBoard: cannot create the log directory ", in_quotes(directory.string()), ": ", ec.message());
        const double now = wall_time_now();
        char host[256] = "localhost";
        if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
        host[sizeof host - 1] = '\0';
        static std::atomic<int> counter{0};  // distinct files for writers of one process started in the same second
        char name[400];
        std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%ld.%d", static_cast<long long>(now), host,
                      static_cast<long>(::getpid()), counter.fetch_add(1));
        path_ = directory / name;
        file_ = std::fopen(path_.c_str(), "wb");
        if (!file_)
            throw_error<IoError>("TensorBoard: cannot create the event file ", in_quotes(path_.string()), ": ", std::strerror(errno));
        append(file_version_event(now));
    }
    EventFileWriter(const EventFileWriter&) = delete;
    EventFileWriter& operator=(const EventFileWriter&) = delete;
    ~EventFileWriter() {
        if (file_) std::fclose(file_);
    }

    /// Appends one event holding `tag` = `value` at `step` (TensorBoard's x axis). The value is
    /// stored as a float, as TensorBoard's scalars are.
    void add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time = wall_time_now()) {
        add_scalars({{std::string(tag), value}}, step, wall_time);
    }
    /// Appends one event holding all `scalars` at `step`.
    void add_scalars(const std::vector<Scalar>& scalars, std::int64_t step, double wall_time = wall_time_now()) {
        append(scalar_event(wall_time, step, scalars));
    }

    /// The file being written.
    const std::filesystem::path& path() const noexcept { return path_; }

private:
    void append(const std::string& event) {
        const std::string record = tf_record(event);
        if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
            throw_error<IoError>("TensorBoard: cannot write the event file ", in_quotes(path_.string()), ": ", std::strerror(errno));
    }

    std::filesystem::path path_;
    std::FILE* file_ = nullptr;
};

}  // namespace strata::io::tensorboard
