#pragma once
/// \file strata/io/impl/tensorboard.ipp
/// The definitions behind strata/io/tensorboard.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "strata/core/error.hpp"
#include "strata/io/tensorboard.hpp"
#include "strata/io/text.hpp"

namespace strata::io::tensorboard {

namespace detail {

// The CRC-32C lookup table (reflected polynomial 0x82f63b78), built at compile time.
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

STRATA_DECL std::uint32_t crc32c(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint32_t c = 0xffffffffu;
    for (std::size_t i = 0; i < n; ++i) c = detail::crc32c_table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

STRATA_DECL std::uint32_t masked_crc32c(const void* data, std::size_t n) {
    const std::uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace proto {

STRATA_DECL void varint(std::string& out, std::uint64_t v) {
    while (v >= 0x80) {
        out += char((v & 0x7f) | 0x80);
        v >>= 7;
    }
    out += char(v);
}
STRATA_DECL void key(std::string& out, int field, int wire) { varint(out, (std::uint64_t(field) << 3) | std::uint64_t(wire)); }
STRATA_DECL void little_endian(std::string& out, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out += char((v >> (8 * i)) & 0xff);
}
STRATA_DECL void field_double(std::string& out, int field, double v) {
    key(out, field, 1);
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    little_endian(out, bits, 8);
}
STRATA_DECL void field_float(std::string& out, int field, float v) {
    key(out, field, 5);
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    little_endian(out, bits, 4);
}
STRATA_DECL void field_int64(std::string& out, int field, std::int64_t v) {
    if (v == 0) return;
    key(out, field, 0);
    varint(out, std::uint64_t(v));  // negative int64 take ten bytes, as protobuf writes them
}
STRATA_DECL void field_bytes(std::string& out, int field, std::string_view bytes) {
    key(out, field, 2);
    varint(out, bytes.size());
    out.append(bytes);
}

}  // namespace proto

STRATA_DECL std::string scalar_event(double wall_time, std::int64_t step, const std::vector<Scalar>& scalars) {
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

STRATA_DECL std::string file_version_event(double wall_time) {
    std::string event;
    proto::field_double(event, 1, wall_time);
    proto::field_int64(event, 2, 0);
    proto::field_bytes(event, 3, "brain.Event:2");
    return event;
}

STRATA_DECL std::string tf_record(std::string_view data) {
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

STRATA_DECL double wall_time_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

STRATA_DECL EventFileWriter::EventFileWriter(const std::filesystem::path& directory) {
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
    // Created exclusively: a name of this process and second, so anything already there (a FIFO,
    // a link someone put in the directory) is not ours to write into or through.
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        file_ = ::fdopen(fd, "wb");
        if (!file_) ::close(fd);
    }
    if (!file_)
        throw_error<IoError>("TensorBoard: cannot create the event file ", in_quotes(path_.string()), ": ", std::strerror(errno));
    append(file_version_event(now));
}

STRATA_DECL EventFileWriter::~EventFileWriter() {
    if (file_) std::fclose(file_);
}

STRATA_DECL void EventFileWriter::add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time) {
    add_scalars({{std::string(tag), value}}, step, wall_time);
}

STRATA_DECL void EventFileWriter::add_scalars(const std::vector<Scalar>& scalars, std::int64_t step, double wall_time) {
    append(scalar_event(wall_time, step, scalars));
}

STRATA_DECL void EventFileWriter::append(const std::string& event) {
    const std::string record = tf_record(event);
    if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
        throw_error<IoError>("TensorBoard: cannot write the event file ", in_quotes(path_.string()), ": ", std::strerror(errno));
}

}  // namespace strata::io::tensorboard
