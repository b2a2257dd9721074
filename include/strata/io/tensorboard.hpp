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

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "strata/config.hpp"

namespace strata::io::tensorboard {

/// CRC-32C (Castagnoli) of `n` bytes, the checksum TFRecords use. crc32c("123456789") is
/// 0xe3069283 (the check value of the CRC catalogue).
STRATA_DECL std::uint32_t crc32c(const void* data, std::size_t n);

/// TFRecord's masked CRC: a CRC stored next to the data it covers is masked so that a CRC of
/// data that itself holds CRCs stays well distributed (tensorflow/core/lib/hash/crc32c.h).
STRATA_DECL std::uint32_t masked_crc32c(const void* data, std::size_t n);

/// Protobuf wire-format encoding, just what Event and Summary need.
namespace proto {

/// Appends `v` as a base-128 varint.
STRATA_DECL void varint(std::string& out, std::uint64_t v);
/// Appends the key of field `field` with wire type `wire` (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
STRATA_DECL void key(std::string& out, int field, int wire);
/// Appends `n` bytes little-endian, the byte order of protobuf's fixed-width fields.
STRATA_DECL void little_endian(std::string& out, std::uint64_t v, int n);
STRATA_DECL void field_double(std::string& out, int field, double v);
STRATA_DECL void field_float(std::string& out, int field, float v);
/// An int64 field; like every proto3 scalar outside a oneof, a zero is not written at all (so the
/// bytes are the ones protobuf itself would write).
STRATA_DECL void field_int64(std::string& out, int field, std::int64_t v);
STRATA_DECL void field_bytes(std::string& out, int field, std::string_view bytes);

}  // namespace proto

/// One scalar of a Summary: a tag and its value.
struct Scalar {
    std::string tag;
    double value;
};

/// The Event protobuf holding `scalars` (as Summary.Value simple_value) at `step`.
STRATA_DECL std::string scalar_event(double wall_time, std::int64_t step, const std::vector<Scalar>& scalars);

/// The first Event of every file: it names the format version.
STRATA_DECL std::string file_version_event(double wall_time);

/// `data` framed as one TFRecord: length, its masked CRC, the data, its masked CRC.
STRATA_DECL std::string tf_record(std::string_view data);

/// Seconds since 1970 on the system clock, with sub-second digits (Event.wall_time).
STRATA_DECL double wall_time_now();

/// Writes one TensorBoard event file in `directory` (created if missing): the file-version
/// event first, then the scalars given. Each add_scalar/add_scalars appends one record and
/// flushes it, so a running TensorBoard shows the figures as they come.
///
/// Requires: a directory that can be created and written; throws IoError naming it otherwise.
/// Not thread-safe: one writer per thread (or a lock around it).
class EventFileWriter {
public:
    explicit EventFileWriter(const std::filesystem::path& directory);
    EventFileWriter(const EventFileWriter&) = delete;
    EventFileWriter& operator=(const EventFileWriter&) = delete;
    ~EventFileWriter();

    /// Appends one event holding `tag` = `value` at `step` (TensorBoard's x axis). The value is
    /// stored as a float, as TensorBoard's scalars are.
    void add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time = wall_time_now());
    /// Appends one event holding all `scalars` at `step`.
    void add_scalars(const std::vector<Scalar>& scalars, std::int64_t step, double wall_time = wall_time_now());

    /// The file being written.
    const std::filesystem::path& path() const noexcept { return path_; }

private:
    void append(const std::string& event);

    std::filesystem::path path_;
    std::FILE* file_ = nullptr;
};

}  // namespace strata::io::tensorboard

#if STRATA_DEFINITIONS
#include "strata/io/impl/tensorboard.ipp"
#endif
