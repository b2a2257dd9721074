#pragma once
/// \file strata/io/safetensors.hpp
/// The safetensors format: SafetensorsWriter and SafetensorsFile (checkpoints are such files).
///
/// A safetensors file (https://github.com/huggingface/safetensors) is:
///
/// | bytes            | content                                                                |
/// |------------------|------------------------------------------------------------------------|
/// | 0 .. 8           | N, the header length: unsigned 64-bit, little-endian                   |
/// | 8 .. 8+N         | the header: UTF-8 JSON, possibly padded with trailing spaces           |
/// | 8+N .. end       | the data buffer: every tensor's bytes, little-endian, row-major        |
///
/// The header is one JSON object. Each member but `__metadata__` describes a tensor:
/// `"name": {"dtype": "F32", "shape": [784, 64], "data_offsets": [begin, end]}`, with the
/// offsets relative to the start of the data buffer. `"__metadata__"` (optional) maps strings to
/// strings. The tensors tile the data buffer exactly: no gaps, no overlaps, nothing left over.
///
/// SafetensorsWriter writes such files (tensors sorted by element size, then name, so each is
/// aligned to its element size; the header padded to 8 bytes), atomically: see
/// strata/io/atomic_file.hpp. The header is read with strata/io/json.hpp.
/// SafetensorsFile reads one and validates all of the above, throwing CheckpointError (a
/// malformed file) or IoError (a file that cannot be read) with what was expected and found.
///
/// Written files open in Python with `safetensors.numpy.load_file(path)` or
/// `safetensors.torch.load_file(path)`; `tests/check_safetensors.py` is a standard-library-only
/// reader that documents the format by example.

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/io/text.hpp"

namespace strata::io {

namespace json {
class Reader;  // strata/io/json.hpp: the header parser, needed by the definitions only
}  // namespace json

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------

/// A safetensors element type. All of them can be read (as raw bytes); the ones with a C++
/// counterpart (see SafetensorsScalar) can also be written and copied out typed.
enum class Dtype : std::uint8_t {
    BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2,
};

/// The dtype's name in a safetensors header: "F32", "I64", "BOOL", ...
constexpr std::string_view dtype_name(Dtype d) noexcept {
    switch (d) {
        case Dtype::BOOL: return "BOOL";
        case Dtype::U8: return "U8";
        case Dtype::I8: return "I8";
        case Dtype::U16: return "U16";
        case Dtype::I16: return "I16";
        case Dtype::F16: return "F16";
        case Dtype::BF16: return "BF16";
        case Dtype::U32: return "U32";
        case Dtype::I32: return "I32";
        case Dtype::F32: return "F32";
        case Dtype::U64: return "U64";
        case Dtype::I64: return "I64";
        case Dtype::F64: return "F64";
        case Dtype::F8_E4M3: return "F8_E4M3";
        case Dtype::F8_E5M2: return "F8_E5M2";
    }
    return "?";
}

/// Bytes per element of a dtype.
constexpr std::size_t dtype_size(Dtype d) noexcept {
    switch (d) {
        case Dtype::BOOL:
        case Dtype::U8:
        case Dtype::I8:
        case Dtype::F8_E4M3:
        case Dtype::F8_E5M2: return 1;
        case Dtype::U16:
        case Dtype::I16:
        case Dtype::F16:
        case Dtype::BF16: return 2;
        case Dtype::U32:
        case Dtype::I32:
        case Dtype::F32: return 4;
        case Dtype::U64:
        case Dtype::I64:
        case Dtype::F64: return 8;
    }
    return 0;
}

/// The dtype named `name` in a header, or nullopt for a name this reader does not know.
constexpr std::optional<Dtype> parse_dtype(std::string_view name) noexcept {
    for (int i = 0; i <= static_cast<int>(Dtype::F8_E5M2); ++i)
        if (dtype_name(static_cast<Dtype>(i)) == name) return static_cast<Dtype>(i);
    return std::nullopt;
}

/// C++ element types that map one-to-one onto a safetensors dtype.
template <class T>
concept SafetensorsScalar =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int8_t> ||
    std::same_as<T, std::int16_t> || std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
    std::same_as<T, std::uint8_t> || std::same_as<T, std::uint16_t> || std::same_as<T, std::uint32_t> ||
    std::same_as<T, std::uint64_t>;

/// The dtype of T: `dtype_of<float> == Dtype::F32`, `dtype_of<std::int64_t> == Dtype::I64`.
template <SafetensorsScalar T>
inline constexpr Dtype dtype_of = std::same_as<T, float>           ? Dtype::F32
                                  : std::same_as<T, double>        ? Dtype::F64
                                  : std::same_as<T, std::int8_t>   ? Dtype::I8
                                  : std::same_as<T, std::int16_t>  ? Dtype::I16
                                  : std::same_as<T, std::int32_t>  ? Dtype::I32
                                  : std::same_as<T, std::int64_t>  ? Dtype::I64
                                  : std::same_as<T, std::uint8_t>  ? Dtype::U8
                                  : std::same_as<T, std::uint16_t> ? Dtype::U16
                                  : std::same_as<T, std::uint32_t> ? Dtype::U32
                                                                   : Dtype::U64;

namespace detail::st {

// Number of elements of `shape`, or nullopt when the product overflows 64 bits.
STRATA_DECL std::optional<std::uint64_t> checked_numel(std::span<const std::size_t> shape);

// Copies `count` elements of `size` bytes, reversing each element's bytes on big-endian hosts
// (the file is little-endian).
inline void copy_le(void* dst, const void* src, std::size_t count, std::size_t size) noexcept {
    if (count == 0) return;
    if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(dst, src, count * size);
    } else {
        auto* d = static_cast<unsigned char*>(dst);
        const auto* s = static_cast<const unsigned char*>(src);
        for (std::size_t i = 0; i < count; ++i)
            for (std::size_t b = 0; b < size; ++b) d[i * size + b] = s[i * size + size - 1 - b];
    }
}

}  // namespace detail::st

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

/// Collects named tensors and string metadata, then writes them as one safetensors file.
///
/// Tensors are copied when added (the caller's buffers may change afterwards). In the file they
/// are ordered by element size (largest first), then by name, which aligns every tensor to its
/// element size; the header lists them in the same order after `__metadata__`.
///
/// \code
///   strata::io::SafetensorsWriter w;
///   w.add("dense/kernel", {784, 64}, kernel);            // std::vector<float> of 50176
///   w.add("dense/bias", {64}, bias);
///   w.add<std::int64_t>("optimizer/step", {}, std::span(&step, 1));
///   w.set_metadata("format", "strata-1");
///   w.save("model.safetensors");                          // atomic
/// \endcode
class SafetensorsWriter {
public:
    /// Adds tensor `name` of T's dtype with `shape` (row-major, `{}` for a scalar).
    /// Requires: `name` non-empty, valid UTF-8, not `__metadata__`, not added before (ValueError);
    ///   `data.size()` == product of `shape` (ShapeError naming the tensor, shape and size).
    template <SafetensorsScalar T>
    void add(std::string name, std::vector<std::size_t> shape, std::span<const T> data) {
        const std::size_t n = check_new(name, shape, data.size());
        Entry e{std::move(name), dtype_of<T>, std::move(shape), std::vector<std::byte>(n * sizeof(T))};
        detail::st::copy_le(e.bytes.data(), data.data(), n, sizeof(T));
        entries_.push_back(std::move(e));
    }

    /// add() for a std::vector (so T is deduced): `w.add("bias", {64}, bias)`.
    template <SafetensorsScalar T>
    void add(std::string name, std::vector<std::size_t> shape, const std::vector<T>& data) {
        add<T>(std::move(name), std::move(shape), std::span<const T>(data));
    }

    /// Adds a tensor of any dtype from its little-endian bytes (e.g. F16 or BF16 data).
    /// Requires: `bytes.size()` == product of `shape` × dtype_size(dtype) (ShapeError otherwise),
    /// and the name rules of add().
    void add_bytes(std::string name, Dtype dtype, std::vector<std::size_t> shape, std::span<const std::byte> bytes);

    /// Sets metadata `key` to `value` (replacing an earlier value). Both must be valid UTF-8.
    void set_metadata(std::string key, std::string value);

    /// Number of tensors added so far.
    std::size_t size() const noexcept { return entries_.size(); }

    /// The header JSON, padded with spaces to a multiple of 8 bytes (without the length prefix).
    std::string header() const;

    /// The complete file in memory: length prefix, header, data.
    std::vector<std::byte> serialize() const;

    /// Writes the file at `path` atomically (AtomicFileWriter): after a failure or a crash the
    /// path holds its previous content, or nothing if it did not exist. Throws IoError.
    void save(const std::filesystem::path& path) const;

private:
    struct Entry {
        std::string name;
        Dtype dtype;
        std::vector<std::size_t> shape;
        std::vector<std::byte> bytes;  // little-endian
    };
    std::vector<Entry> entries_;
    std::map<std::string, std::string, std::less<>> metadata_;

    static void write_u64_le(std::byte* dst, std::uint64_t v) noexcept;

    std::size_t check_new(const std::string& name, const std::vector<std::size_t>& shape, std::size_t count) const;

    std::vector<const Entry*> ordered() const;
};

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

/// One tensor's entry in a safetensors header.
struct TensorInfo {
    std::string name;                ///< the tensor's name (a header key)
    Dtype dtype = Dtype::F32;        ///< element type
    std::vector<std::size_t> shape;  ///< extents, row-major; empty for a scalar
    std::uint64_t begin = 0;         ///< first byte in the data buffer
    std::uint64_t end = 0;           ///< one past the last byte in the data buffer

    /// Number of elements (product of shape; 1 for a scalar).
    std::size_t numel() const noexcept {
        std::size_t n = 1;
        for (auto d : shape) n *= d;
        return n;
    }
    /// Number of bytes (end - begin).
    std::size_t byte_size() const noexcept { return static_cast<std::size_t>(end - begin); }
};

/// A safetensors file read into memory and validated.
///
/// Ensures after load()/parse(): the header length fits the file; the header is UTF-8 JSON of
/// the documented form; every dtype is known; every tensor's byte range has exactly
/// dtype_size × numel bytes; the ranges tile the data buffer with no gap, overlap or excess.
/// Anything else throws CheckpointError with the tensor's name and expected vs found values.
///
/// \code
///   auto ckpt = strata::io::SafetensorsFile::load("model.safetensors");
///   std::vector<float> kernel = ckpt.get<float>("dense/kernel", {784, 64});
///   std::string epoch = ckpt.metadata("epoch");
/// \endcode
class SafetensorsFile {
public:
    /// Upper bound on the header length, as in the reference implementation (100 MB): a larger
    /// value means a corrupt or hostile file.
    static constexpr std::uint64_t max_header_size = 100'000'000;

    /// Reads and validates the file at `path`. Throws IoError when it cannot be read,
    /// CheckpointError when it is not a valid safetensors file.
    static SafetensorsFile load(const std::filesystem::path& path);

    /// Validates an in-memory file (the bytes SafetensorsWriter::serialize() returns); `source`
    /// names it in messages.
    static SafetensorsFile parse(std::vector<std::byte> file, std::string source = "<memory>");

    /// Where the file came from (its path, or the name given to parse()).
    const std::string& source() const noexcept { return source_; }
    /// Number of tensors.
    std::size_t size() const noexcept { return tensors_.size(); }
    /// Every tensor, in data-buffer order.
    const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
    /// The tensor names, in data-buffer order.
    std::vector<std::string> names() const;
    /// Whether a tensor is called `name`.
    bool contains(std::string_view name) const;

    /// The header entry of `name`. Throws CheckpointError listing the file's tensors if absent.
    const TensorInfo& info(std::string_view name) const;
    /// The dtype of `name`.
    Dtype dtype(std::string_view name) const;
    /// The shape of `name`.
    const std::vector<std::size_t>& shape(std::string_view name) const;
    /// The raw little-endian bytes of `name` (valid as long as this object).
    std::span<const std::byte> bytes(std::string_view name) const;

    /// Copies tensor `name` into `out`, checking that its dtype is T's and its shape is
    /// `expected_shape`. Throws CheckpointError naming the tensor and both dtypes or both shapes
    /// on a mismatch, ShapeError when `out.size()` differs from the element count.
    template <SafetensorsScalar T>
    void copy_to(std::string_view name, std::span<T> out, std::span<const std::size_t> expected_shape) const {
        const auto& t = checked(name, dtype_of<T>);
        if (!std::equal(t.shape.begin(), t.shape.end(), expected_shape.begin(), expected_shape.end()))
            throw_error<CheckpointError>("safetensors: ", in_quotes(source_), ": tensor ",
                                         in_quotes(name), ": expected shape ", shape_text(expected_shape),
                                         ", found ", shape_text(t.shape));
        STRATA_CHECK(out.size() == t.numel(), ShapeError, "safetensors: copying tensor ", in_quotes(name),
                     " (", t.numel(), " elements, shape ", shape_text(t.shape), ") into a buffer of ", out.size(),
                     " elements");
        detail::st::copy_le(out.data(), data_.data() + t.begin, out.size(), sizeof(T));
    }

    /// copy_to() with the shape given as a braced list or vector: `copy_to<float>("b", out, {64})`.
    template <SafetensorsScalar T>
    void copy_to(std::string_view name, std::span<T> out, const std::vector<std::size_t>& expected_shape) const {
        copy_to<T>(name, out, std::span<const std::size_t>(expected_shape));
    }

    /// Returns tensor `name` as a vector, checking dtype and shape as copy_to() does.
    template <SafetensorsScalar T>
    std::vector<T> get(std::string_view name, const std::vector<std::size_t>& expected_shape) const {
        std::vector<T> v(checked(name, dtype_of<T>).numel());
        copy_to<T>(name, std::span<T>(v), std::span<const std::size_t>(expected_shape));
        return v;
    }

    /// Returns tensor `name` as a vector of any shape (see shape(name)); the dtype is checked.
    template <SafetensorsScalar T>
    std::vector<T> get(std::string_view name) const {
        const auto& t = checked(name, dtype_of<T>);
        std::vector<T> v(t.numel());
        detail::st::copy_le(v.data(), data_.data() + t.begin, v.size(), sizeof(T));
        return v;
    }

    /// All metadata (`__metadata__`), sorted by key; empty when the file has none.
    const std::map<std::string, std::string, std::less<>>& metadata() const noexcept { return metadata_; }
    /// Whether metadata `key` is present.
    bool has_metadata(std::string_view key) const;
    /// Metadata value of `key`. Throws CheckpointError naming the key and the file if absent.
    const std::string& metadata(std::string_view key) const;

private:
    std::string source_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, std::size_t, std::less<>> index_;
    std::map<std::string, std::string, std::less<>> metadata_;
    std::vector<std::byte> data_;  // the data buffer only (the header is dropped once parsed)

    template <class... Args>
    [[noreturn]] void fail(Args&&... args) const {
        throw_error<CheckpointError>("safetensors: ", in_quotes(source_), ": ", std::forward<Args>(args)...);
    }

    const TensorInfo& checked(std::string_view name, Dtype want) const;

    void parse_all(std::vector<std::byte> file);

    // The metadata object at the cursor, into metadata_ (keys are distinct: checked in pass 1).
    void parse_metadata(json::Reader& reader);

    // The tensor entry at the cursor; leaves the cursor after it.
    TensorInfo parse_tensor(const std::string& name, json::Reader& reader) const;
};

}  // namespace strata::io

#if STRATA_DEFINITIONS
#include "strata/io/impl/safetensors.ipp"
#endif
