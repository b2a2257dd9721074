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
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/io/atomic_file.hpp"
#include "strata/io/json.hpp"
#include "strata/io/text.hpp"

namespace strata::io {

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
inline std::optional<std::uint64_t> checked_numel(std::span<const std::size_t> shape) {
    std::uint64_t n = 1;
    for (auto d : shape) {
        if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
        n *= d;
    }
    return n;
}

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
    void add_bytes(std::string name, Dtype dtype, std::vector<std::size_t> shape, std::span<const std::byte> bytes) {
        const std::size_t es = dtype_size(dtype);
        STRATA_CHECK(bytes.size() % es == 0, ShapeError, "SafetensorsWriter: tensor ", in_quotes(name), ": ",
                     bytes.size(), " bytes is not a whole number of ", dtype_name(dtype), " elements (", es, " bytes each)");
        check_new(name, shape, bytes.size() / es);
        entries_.push_back(Entry{std::move(name), dtype, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end())});
    }

    /// Sets metadata `key` to `value` (replacing an earlier value). Both must be valid UTF-8.
    void set_metadata(std::string key, std::string value) {
        STRATA_CHECK(valid_utf8(key) && valid_utf8(value), ValueError,
                     "SafetensorsWriter: metadata key and value must be valid UTF-8 (key ", in_quotes(key), ")");
        metadata_[std::move(key)] = std::move(value);
    }

    /// Number of tensors added so far.
    std::size_t size() const noexcept { return entries_.size(); }

    /// The header JSON, padded with spaces to a multiple of 8 bytes (without the length prefix).
    std::string header() const {
        std::string h = "{";
        bool first = true;
        if (!metadata_.empty()) {
            h += "\"__metadata__\":{";
            bool first_member = true;
            for (const auto& [k, v] : metadata_) {
                if (!first_member) h += ',';
                first_member = false;
                json::append_string(h, k);
                h += ':';
                json::append_string(h, v);
            }
            h += '}';
            first = false;
        }
        std::uint64_t offset = 0;
        for (const Entry* e : ordered()) {
            if (!first) h += ',';
            first = false;
            json::append_string(h, e->name);
            h += ":{\"dtype\":\"";
            h += dtype_name(e->dtype);
            h += "\",\"shape\":[";
            for (std::size_t i = 0; i < e->shape.size(); ++i) {
                if (i) h += ',';
                h += std::to_string(e->shape[i]);
            }
            h += "],\"data_offsets\":[" + std::to_string(offset) + ',';
            offset += e->bytes.size();
            h += std::to_string(offset) + "]}";
        }
        h += '}';
        h.append((8 - h.size() % 8) % 8, ' ');
        return h;
    }

    /// The complete file in memory: length prefix, header, data.
    std::vector<std::byte> serialize() const {
        const std::string h = header();
        std::vector<std::byte> out(8 + h.size());
        write_u64_le(out.data(), h.size());
        std::memcpy(out.data() + 8, h.data(), h.size());
        for (const Entry* e : ordered()) out.insert(out.end(), e->bytes.begin(), e->bytes.end());
        return out;
    }

    /// Writes the file at `path` atomically (AtomicFileWriter): after a failure or a crash the
    /// path holds its previous content, or nothing if it did not exist. Throws IoError.
    void save(const std::filesystem::path& path) const {
        const std::string h = header();
        std::byte prefix[8];
        write_u64_le(prefix, h.size());
        AtomicFileWriter out(path);
        out.write(prefix, 8);
        out.write(h.data(), h.size());
        for (const Entry* e : ordered()) out.write(e->bytes.data(), e->bytes.size());
        out.commit();
    }

private:
    struct Entry {
        std::string name;
        Dtype dtype;
        std::vector<std::size_t> shape;
        std::vector<std::byte> bytes;  // little-endian
    };
    std::vector<Entry> entries_;
    std::map<std::string, std::string, std::less<>> metadata_;

    static void write_u64_le(std::byte* dst, std::uint64_t v) noexcept {
        for (int i = 0; i < 8; ++i) dst[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
    }

    std::size_t check_new(const std::string& name, const std::vector<std::size_t>& shape, std::size_t count) const {
        STRATA_CHECK(!name.empty(), ValueError, "SafetensorsWriter: a tensor name must not be empty");
        STRATA_CHECK(name != "__metadata__", ValueError, "SafetensorsWriter: '__metadata__' is reserved and cannot name a tensor");
        STRATA_CHECK(valid_utf8(name), ValueError, "SafetensorsWriter: tensor name ", in_quotes(name),
                     " is not valid UTF-8");
        for (const auto& e : entries_)
            STRATA_CHECK(e.name != name, ValueError, "SafetensorsWriter: tensor ", in_quotes(name), " was already added");
        const auto n = detail::st::checked_numel(shape);
        STRATA_CHECK(n && *n == count, ShapeError, "SafetensorsWriter: tensor ", in_quotes(name), ": shape ",
                     shape_text(shape), " holds ", n ? std::to_string(*n) : std::string("too many"),
                     " elements, but the data has ", count);
        return count;
    }

    std::vector<const Entry*> ordered() const {
        std::vector<const Entry*> v;
        v.reserve(entries_.size());
        for (const auto& e : entries_) v.push_back(&e);
        std::sort(v.begin(), v.end(), [](const Entry* a, const Entry* b) {
            const auto sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
            return sa != sb ? sa > sb : a->name < b->name;
        });
        return v;
    }
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
    static SafetensorsFile load(const std::filesystem::path& path) {
        const std::string where = in_quotes(path.string());
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec))
            throw_error<IoError>("safetensors: cannot read ", where, ": it is a directory");
        std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
        if (!f) throw_error<IoError>("safetensors: cannot open ", where, ": ", std::strerror(errno));
        if (std::fseek(f.get(), 0, SEEK_END) != 0) throw_error<IoError>("safetensors: cannot seek in ", where, ": ", std::strerror(errno));
        const long size = std::ftell(f.get());
        if (size < 0 || std::fseek(f.get(), 0, SEEK_SET) != 0)
            throw_error<IoError>("safetensors: cannot tell the size of ", where, ": ", std::strerror(errno));
        std::vector<std::byte> bytes(static_cast<std::size_t>(size));
        if (!bytes.empty() && std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
            throw_error<IoError>("safetensors: cannot read ", where, ": ",
                                 std::ferror(f.get()) ? std::strerror(errno) : "the file shrank while being read");
        return parse(std::move(bytes), path.string());
    }

    /// Validates an in-memory file (the bytes SafetensorsWriter::serialize() returns); `source`
    /// names it in messages.
    static SafetensorsFile parse(std::vector<std::byte> file, std::string source = "<memory>") {
        SafetensorsFile r;
        r.source_ = std::move(source);
        r.parse_all(std::move(file));
        return r;
    }

    /// Where the file came from (its path, or the name given to parse()).
    const std::string& source() const noexcept { return source_; }
    /// Number of tensors.
    std::size_t size() const noexcept { return tensors_.size(); }
    /// Every tensor, in data-buffer order.
    const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
    /// The tensor names, in data-buffer order.
    std::vector<std::string> names() const {
        std::vector<std::string> v;
        v.reserve(tensors_.size());
        for (const auto& t : tensors_) v.push_back(t.name);
        return v;
    }
    /// Whether a tensor is called `name`.
    bool contains(std::string_view name) const { return index_.find(name) != index_.end(); }

    /// The header entry of `name`. Throws CheckpointError listing the file's tensors if absent.
    const TensorInfo& info(std::string_view name) const {
        const auto it = index_.find(name);
        if (it == index_.end()) {
            std::string known;
            for (std::size_t i = 0; i < tensors_.size() && i < 20; ++i) known += (i ? ", " : "") + tensors_[i].name;
            if (tensors_.size() > 20) known += ", ... (" + std::to_string(tensors_.size()) + " in all)";
            if (tensors_.empty()) known = "none";
            throw_error<CheckpointError>("safetensors: ", in_quotes(source_), " has no tensor ",
                                         in_quotes(name), "; its tensors are: ", known);
        }
        return tensors_[it->second];
    }
    /// The dtype of `name`.
    Dtype dtype(std::string_view name) const { return info(name).dtype; }
    /// The shape of `name`.
    const std::vector<std::size_t>& shape(std::string_view name) const { return info(name).shape; }
    /// The raw little-endian bytes of `name` (valid as long as this object).
    std::span<const std::byte> bytes(std::string_view name) const {
        const auto& t = info(name);
        return std::span<const std::byte>(data_).subspan(static_cast<std::size_t>(t.begin), t.byte_size());
    }

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
    bool has_metadata(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }
    /// Metadata value of `key`. Throws CheckpointError naming the key and the file if absent.
    const std::string& metadata(std::string_view key) const {
        const auto it = metadata_.find(key);
        if (it == metadata_.end())
            throw_error<CheckpointError>("safetensors: ", in_quotes(source_), " has no metadata key ",
                                         in_quotes(key));
        return it->second;
    }

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

    const TensorInfo& checked(std::string_view name, Dtype want) const {
        const auto& t = info(name);
        if (t.dtype != want)
            fail("tensor ", in_quotes(name), ": expected dtype ", dtype_name(want), ", found ", dtype_name(t.dtype));
        return t;
    }

    void parse_all(std::vector<std::byte> file) {
        const std::uint64_t size = file.size();
        if (size < 8)
            fail("file is ", size, " bytes long; a safetensors file starts with an 8-byte header length");
        std::uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file[static_cast<std::size_t>(i)]);
        if (n > size - 8)
            fail("header length ", n, " exceeds the file: only ", size - 8, " bytes follow the 8-byte length (truncated file?)");
        if (n > max_header_size) fail("header length ", n, " exceeds the limit of ", max_header_size, " bytes (corrupt file?)");
        if (n < 2) fail("header length ", n, " is too small for a JSON object");
        const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n));
        if (!valid_utf8(text)) fail("header is not valid UTF-8");
        if (text.front() != '{') fail("header must start with '{', found '", text.front(), "'");

        json::Reader reader(text, "safetensors: " + in_quotes(source_) + ": header");
        reader.validate();
        reader.enter();
        for (std::string key; reader.next_member(key);) {
            if (key == "__metadata__") parse_metadata(reader);
            else tensors_.push_back(parse_tensor(key, reader));
        }

        const std::uint64_t buffer = size - 8 - n;
        std::vector<std::size_t> order(tensors_.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            const auto& ta = tensors_[a];
            const auto& tb = tensors_[b];
            return ta.begin != tb.begin ? ta.begin < tb.begin : ta.end < tb.end;
        });
        std::uint64_t at = 0;
        const TensorInfo* prev = nullptr;
        for (std::size_t i : order) {
            const auto& t = tensors_[i];
            if (t.begin != at) {
                if (!prev)
                    fail("tensor ", in_quotes(t.name), " begins at byte ", t.begin,
                         " of the data buffer; expected the first tensor to begin at byte 0");
                fail("tensor ", in_quotes(t.name), " begins at byte ", t.begin, " but tensor ", in_quotes(prev->name),
                     " ends at byte ", at, ": tensors must be packed without ", t.begin > at ? "gaps" : "overlaps");
            }
            if (t.end > buffer)
                fail("tensor ", in_quotes(t.name), " ends at byte ", t.end, " of the data buffer, but the buffer has only ",
                     buffer, " bytes (truncated file?)");
            at = t.end;
            prev = &t;
        }
        if (at != buffer)
            fail("the tensors cover ", at, " bytes, but the data buffer has ", buffer,
                 " bytes: expected no bytes after the last tensor");

        std::vector<TensorInfo> sorted;
        sorted.reserve(tensors_.size());
        for (std::size_t i : order) sorted.push_back(std::move(tensors_[i]));
        tensors_ = std::move(sorted);
        for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);

        file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(8 + n));
        data_ = std::move(file);
    }

    // The metadata object at the cursor, into metadata_ (keys are distinct: checked in pass 1).
    void parse_metadata(json::Reader& reader) {
        using json::Kind;
        const Kind k = reader.kind();
        if (k != Kind::Object) fail("__metadata__ is ", json::kind_name(k), ", expected an object of strings");
        reader.enter();
        for (std::string key; reader.next_member(key);) {
            const Kind vk = reader.kind();
            if (vk != Kind::String)
                fail("__metadata__ value of ", in_quotes(key, 200), " is ", json::kind_name(vk), ", expected a string");
            metadata_.emplace(std::move(key), reader.read_string());
        }
    }

    // The tensor entry at the cursor; leaves the cursor after it.
    TensorInfo parse_tensor(const std::string& name, json::Reader& reader) const {
        using json::Kind;
        using json::kind_name;
        const std::string who = "tensor " + in_quotes(name, 200);
        // SafetensorsWriter refuses an empty name, so a file with one was not written by strata.
        if (name.empty()) fail("a tensor has an empty name; expected a non-empty name like \"dense/kernel\"");
        if (reader.kind() != Kind::Object)
            fail(who, " is ", kind_name(reader.kind()), ", expected an object with dtype, shape and data_offsets");
        // The fields are located first and read afterwards, so that an unknown or missing field is
        // reported before a bad value whatever the order of the fields.
        constexpr std::size_t absent = std::numeric_limits<std::size_t>::max();
        std::size_t dtype_at = absent, shape_at = absent, offsets_at = absent;
        reader.enter();
        for (std::string k; reader.next_member(k);) {
            if (k == "dtype") dtype_at = reader.pos();
            else if (k == "shape") shape_at = reader.pos();
            else if (k == "data_offsets") offsets_at = reader.pos();
            else fail(who, " has an unknown field ", in_quotes(k, 64), "; expected only dtype, shape and data_offsets");
            reader.skip_value();
        }
        const std::size_t after = reader.pos();
        if (dtype_at == absent || shape_at == absent || offsets_at == absent)
            fail(who, " lacks the field ", dtype_at == absent ? "dtype" : shape_at == absent ? "shape" : "data_offsets");

        TensorInfo t;
        t.name = name;
        reader.seek(dtype_at);
        if (reader.kind() != Kind::String) fail(who, ": dtype is ", kind_name(reader.kind()), ", expected a string");
        const std::string dtype = reader.read_string();
        const auto d = parse_dtype(dtype);
        if (!d)
            fail(who, ": unknown dtype ", in_quotes(dtype, 64),
                 "; expected one of BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2");
        t.dtype = *d;

        reader.seek(shape_at);
        if (reader.kind() != Kind::Array) fail(who, ": shape is ", kind_name(reader.kind()), ", expected an array of integers");
        reader.enter();
        while (reader.next_item()) {
            const Kind k = reader.kind();
            if (k != Kind::Number) fail(who, ": shape entry ", kind_name(k), " is not a non-negative integer");
            const std::string_view literal = reader.read_number();
            const auto x = json::parse_u64(literal);
            if (!x || *x > std::numeric_limits<std::size_t>::max())
                fail(who, ": shape entry ", clipped(literal), " is not a non-negative integer");
            t.shape.push_back(static_cast<std::size_t>(*x));
        }

        reader.seek(offsets_at);
        std::optional<std::uint64_t> bounds[2];
        std::size_t count = 0;
        if (reader.kind() == Kind::Array) {
            reader.enter();
            for (; reader.next_item(); ++count) {
                if (count < 2 && reader.kind() == Kind::Number) bounds[count] = json::parse_u64(reader.read_number());
                else reader.skip_value();
            }
        }
        if (count != 2) fail(who, ": data_offsets must be an array of two integers [begin, end]");
        if (!bounds[0] || !bounds[1]) fail(who, ": data_offsets must hold two non-negative integers");
        const std::uint64_t b = *bounds[0], e = *bounds[1];
        if (b > e) fail(who, ": data_offsets [", b, ", ", e, "] end before they begin");
        t.begin = b;
        t.end = e;
        reader.seek(after);

        const auto numel = detail::st::checked_numel(t.shape);
        const std::uint64_t es = dtype_size(t.dtype);
        if (!numel || *numel > std::numeric_limits<std::uint64_t>::max() / es)
            fail(who, ": shape ", shape_text(t.shape), " describes more bytes than any file can hold");
        if (*numel * es != t.end - t.begin)
            fail(who, ": dtype ", dtype_name(t.dtype), " and shape ", shape_text(t.shape), " need ", *numel * es,
                 " bytes, but data_offsets [", t.begin, ", ", t.end, "] cover ", t.end - t.begin);
        return t;
    }
};

}  // namespace strata::io
