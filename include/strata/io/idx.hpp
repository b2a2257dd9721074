#pragma once
/// \file strata/io/idx.hpp
/// The IDX file format (the one MNIST ships in): read_idx, write_idx, read_idx_header. The
/// MNIST loaders built on it are strata/data/mnist.hpp.
///
/// An IDX file, as specified on Yann LeCun's MNIST page, is:
///
/// | bytes          | content                                                              |
/// |----------------|----------------------------------------------------------------------|
/// | 0, 1           | zero                                                                 |
/// | 2              | element type: 0x08 ubyte, 0x09 sbyte, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 |
/// | 3              | rank r (number of dimensions)                                        |
/// | 4 .. 4+4r      | r dimensions, each a big-endian unsigned 32-bit integer              |
/// | 4+4r ..        | the elements, row-major (last index fastest), each big-endian        |
///
/// Every malformed file is refused with a strata::IoError saying what was expected and what was
/// found. gzip-compressed files (`*.gz`, as LeCun's site served them) are *not* read: the error
/// says so and how to decompress them (`gzip -dk FILE.gz`), and `scripts/fetch-mnist DIR` puts the
/// four uncompressed MNIST files in place.

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
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/io/text.hpp"

namespace strata::io {

/// The element type stored in an IDX file, with the numeric value of its type byte.
enum class IdxType : std::uint8_t {
    UInt8 = 0x08,    ///< unsigned byte
    Int8 = 0x09,     ///< signed byte
    Int16 = 0x0B,    ///< big-endian 16-bit signed integer
    Int32 = 0x0C,    ///< big-endian 32-bit signed integer
    Float32 = 0x0D,  ///< big-endian IEEE-754 single
    Float64 = 0x0E,  ///< big-endian IEEE-754 double
};

/// The name of an IDX type as LeCun's spec spells it ("ubyte", "sbyte", "short", "int", "float",
/// "double"); "unknown" for a value outside the enum.
constexpr const char* idx_type_name(IdxType t) noexcept {
    switch (t) {
        case IdxType::UInt8: return "ubyte";
        case IdxType::Int8: return "sbyte";
        case IdxType::Int16: return "short";
        case IdxType::Int32: return "int";
        case IdxType::Float32: return "float";
        case IdxType::Float64: return "double";
    }
    return "unknown";
}

/// Bytes per element of an IDX type (1, 1, 2, 4, 4 or 8); 0 for a value outside the enum.
constexpr std::size_t idx_type_size(IdxType t) noexcept {
    switch (t) {
        case IdxType::UInt8:
        case IdxType::Int8: return 1;
        case IdxType::Int16: return 2;
        case IdxType::Int32:
        case IdxType::Float32: return 4;
        case IdxType::Float64: return 8;
    }
    return 0;
}

/// The C++ types an IDX file can store, one per IdxType.
template <class T>
concept IdxElement = std::same_as<T, std::uint8_t> || std::same_as<T, std::int8_t> ||
                     std::same_as<T, std::int16_t> || std::same_as<T, std::int32_t> ||
                     std::same_as<T, float> || std::same_as<T, double>;

/// The IdxType that stores T: `idx_type_of<float> == IdxType::Float32`.
template <IdxElement T>
inline constexpr IdxType idx_type_of = std::same_as<T, std::uint8_t>  ? IdxType::UInt8
                                       : std::same_as<T, std::int8_t> ? IdxType::Int8
                                       : std::same_as<T, std::int16_t> ? IdxType::Int16
                                       : std::same_as<T, std::int32_t> ? IdxType::Int32
                                       : std::same_as<T, float>        ? IdxType::Float32
                                                                       : IdxType::Float64;

/// What the header of an IDX file says: the stored element type and the dimensions.
///
/// Ensures (when returned by read_idx_header): the file's size is exactly `data_offset +
/// element_count() * idx_type_size(type)`.
struct IdxHeader {
    IdxType type = IdxType::UInt8;      ///< element type stored in the file
    std::vector<std::size_t> dims;      ///< dimensions, outermost first (MNIST images: N, 28, 28)
    std::size_t data_offset = 0;        ///< byte offset of the first element (4 + 4 * rank)

    /// Product of the dimensions (1 for rank 0).
    std::size_t element_count() const noexcept {
        std::size_t n = 1;
        for (auto d : dims) n *= d;
        return n;
    }
};

/// An array read from (or to be written to) an IDX file: dimensions plus row-major elements.
///
/// Invariant kept by read_idx and required by write_idx: `data.size()` is the product of `dims`.
///
/// \code
///   auto labels = strata::io::read_idx<std::int32_t>("train-labels-idx1-ubyte");
///   // labels.dims == {60000}, labels.stored_type == IdxType::UInt8, labels.data[0] == 5
/// \endcode
template <class T>
struct IdxArray {
    std::vector<std::size_t> dims;             ///< dimensions, outermost first
    std::vector<T> data;                       ///< elements, last index fastest
    IdxType stored_type = idx_type_of<std::conditional_t<IdxElement<T>, T, double>>;  ///< type in the file

    /// Number of dimensions.
    std::size_t rank() const noexcept { return dims.size(); }
    /// Extent of the first dimension (the number of examples for MNIST files); 1 for rank 0.
    std::size_t count() const noexcept { return dims.empty() ? 1 : dims.front(); }
    /// Elements per entry of the first dimension (784 for MNIST images); 1 for rank <= 1.
    std::size_t row_size() const noexcept {
        std::size_t n = 1;
        for (std::size_t i = 1; i < dims.size(); ++i) n *= dims[i];
        return n;
    }
};

namespace detail::idx {

struct FileCloser {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Opens for reading, with an error that says why and hints at a sibling .gz file.
STRATA_DECL File open_for_reading(const std::filesystem::path& path, const char* who);

STRATA_DECL void read_exact(std::FILE* f, void* dst, std::size_t n, const std::filesystem::path& path,
                            std::uint64_t at, const char* who);

// Parses and validates the header; leaves `f` positioned at the first element.
STRATA_DECL IdxHeader parse_header(std::FILE* f, const std::filesystem::path& path, const char* who);

template <class S>
S decode_be(const unsigned char* b) noexcept {
    if constexpr (sizeof(S) == 1) {
        return std::bit_cast<S>(b[0]);
    } else {
        using U = std::conditional_t<sizeof(S) == 2, std::uint16_t,
                                     std::conditional_t<sizeof(S) == 4, std::uint32_t, std::uint64_t>>;
        U u = 0;
        for (std::size_t i = 0; i < sizeof(S); ++i) u = U(U(u << 8) | U(b[i]));
        return std::bit_cast<S>(u);
    }
}

template <class S>
void encode_be(S v, unsigned char* b) noexcept {
    if constexpr (sizeof(S) == 1) {
        b[0] = std::bit_cast<unsigned char>(v);
    } else {
        using U = std::conditional_t<sizeof(S) == 2, std::uint16_t,
                                     std::conditional_t<sizeof(S) == 4, std::uint32_t, std::uint64_t>>;
        U u = std::bit_cast<U>(v);
        for (std::size_t i = sizeof(S); i-- > 0;) {
            b[i] = static_cast<unsigned char>(u & 0xFF);
            u = U(u >> 8);
        }
    }
}

// Streams the elements (stored type S) into `out` converted to T, in chunks, so a 47 MB file
// never needs a second 47 MB staging buffer.
template <class S, class T>
void read_elements(std::FILE* f, const IdxHeader& h, std::vector<T>& out, const std::filesystem::path& path,
                   const char* who) {
    const std::size_t n = h.element_count();
    out.resize(n);
    constexpr std::size_t chunk = (std::size_t(1) << 20) / sizeof(S);
    std::vector<unsigned char> buf(std::min(n, chunk) * sizeof(S));
    std::size_t done = 0;
    while (done < n) {
        const std::size_t m = std::min(chunk, n - done);
        read_exact(f, buf.data(), m * sizeof(S), path, h.data_offset + done * sizeof(S), who);
        for (std::size_t i = 0; i < m; ++i) {
            const S v = decode_be<S>(buf.data() + i * sizeof(S));
            if constexpr (std::is_integral_v<T> && !std::same_as<S, T>) {
                if (!std::in_range<T>(v))
                    throw_error<ValueError>(who, ": ", in_quotes(path.string()), ": element ", done + i, " = ", +v,
                                            " does not fit the requested integer type (range ",
                                            +std::numeric_limits<T>::min(), " .. ", +std::numeric_limits<T>::max(), ")");
            }
            out[done + i] = static_cast<T>(v);
        }
        done += m;
    }
}

}  // namespace detail::idx

/// Reads and validates the header of an IDX file without reading its elements.
///
/// Ensures: the file exists, has a valid magic number and type code, and its size matches the
/// dimensions exactly. Throws IoError otherwise, naming the file and expected vs found values.
STRATA_DECL IdxHeader read_idx_header(const std::filesystem::path& path);

/// Reads a whole IDX file, converting its elements to T.
///
/// Requires: T is a floating-point type or a signed/unsigned integer type (not bool or a
///   character type). Integer T can be read from integer files only (every value
///   is checked to fit T; ValueError otherwise); floating-point T can be read from any file
///   (f64 -> float rounds).
/// Ensures: `dims` as in the header, `data.size() == product(dims)`, `stored_type` as in the file.
/// Throws IoError for a missing, truncated or malformed file (see read_idx_header).
///
/// \code
///   auto a = strata::io::read_idx<float>("t10k-images-idx3-ubyte");   // dims {10000, 28, 28}
/// \endcode
template <class T>
    requires std::floating_point<T> || (std::integral<T> && !std::same_as<T, bool> && !std::same_as<T, char> &&
                                        !std::same_as<T, wchar_t> && !std::same_as<T, char8_t> &&
                                        !std::same_as<T, char16_t> && !std::same_as<T, char32_t>)
IdxArray<T> read_idx(const std::filesystem::path& path) {
    constexpr const char* who = "read_idx";
    auto f = detail::idx::open_for_reading(path, who);
    const IdxHeader h = detail::idx::parse_header(f.get(), path, who);
    IdxArray<T> a;
    a.dims = h.dims;
    a.stored_type = h.type;
    using namespace detail::idx;
    if constexpr (std::is_integral_v<T>) {
        if (h.type == IdxType::Float32 || h.type == IdxType::Float64)
            throw_error<IoError>(who, ": ", in_quotes(path.string()), " stores ", idx_type_name(h.type),
                                 " elements, which cannot be read as an integer type; read it as float or double");
    }
    switch (h.type) {
        case IdxType::UInt8: read_elements<std::uint8_t>(f.get(), h, a.data, path, who); break;
        case IdxType::Int8: read_elements<std::int8_t>(f.get(), h, a.data, path, who); break;
        case IdxType::Int16: read_elements<std::int16_t>(f.get(), h, a.data, path, who); break;
        case IdxType::Int32: read_elements<std::int32_t>(f.get(), h, a.data, path, who); break;
        case IdxType::Float32:
            if constexpr (std::is_floating_point_v<T>) read_elements<float>(f.get(), h, a.data, path, who);
            break;
        case IdxType::Float64:
            if constexpr (std::is_floating_point_v<T>) read_elements<double>(f.get(), h, a.data, path, who);
            break;
    }
    return a;
}

#if STRATA_INSTANCES
// The element types the MNIST loaders read, compiled once in the compiled part.
STRATA_TEMPLATE IdxArray<float> read_idx<float>(const std::filesystem::path&);
STRATA_TEMPLATE IdxArray<std::int32_t> read_idx<std::int32_t>(const std::filesystem::path&);
STRATA_TEMPLATE IdxArray<std::uint8_t> read_idx<std::uint8_t>(const std::filesystem::path&);
#endif

/// Writes `data` with dimensions `dims` as an IDX file of T's type (big-endian), replacing `path`.
///
/// Requires: `data.size()` == product of `dims` (ShapeError otherwise), at most 255 dimensions and
///   each < 2^32 (ValueError otherwise).
/// Ensures: read_idx<T>(path) returns the same dims and data. Throws IoError (with the OS's
///   reason) when the file cannot be written; a partly written file is removed.
///
/// \code
///   std::vector<std::uint8_t> labels{3, 1, 4};
///   strata::io::write_idx<std::uint8_t>("labels-idx1-ubyte", {3}, labels);
/// \endcode
template <IdxElement T>
void write_idx(const std::filesystem::path& path, const std::vector<std::size_t>& dims, std::span<const T> data) {
    using namespace detail::idx;
    STRATA_CHECK(dims.size() <= 255, ValueError, "write_idx: ", in_quotes(path.string()),
                 ": IDX files hold at most 255 dimensions, got ", dims.size());
    std::size_t count = 1;
    for (auto d : dims) {
        STRATA_CHECK(d <= 0xFFFFFFFFull, ValueError, "write_idx: ", in_quotes(path.string()), ": dimension ", d,
                     " does not fit the 32-bit size field of an IDX file");
        count *= d;
    }
    STRATA_CHECK(count == data.size(), ShapeError, "write_idx: ", in_quotes(path.string()), ": dims ", shape_text(dims),
                 " hold ", count, " elements, but the data has ", data.size());

    File f(std::fopen(path.c_str(), "wb"));
    if (!f) throw_error<IoError>("write_idx: cannot create ", in_quotes(path.string()), ": ", std::strerror(errno));
    auto fail = [&](const char* what) {
        const int err = errno;
        f.reset();
        std::error_code ec;
        std::filesystem::remove(path, ec);
        throw_error<IoError>("write_idx: ", what, " ", in_quotes(path.string()), ": ", std::strerror(err));
    };
    std::vector<unsigned char> buf;
    buf.reserve(4 + 4 * dims.size());
    buf.insert(buf.end(), {0, 0, static_cast<unsigned char>(idx_type_of<T>), static_cast<unsigned char>(dims.size())});
    for (auto d : dims) {
        unsigned char b[4];
        encode_be<std::uint32_t>(static_cast<std::uint32_t>(d), b);
        buf.insert(buf.end(), b, b + 4);
    }
    if (std::fwrite(buf.data(), 1, buf.size(), f.get()) != buf.size()) fail("cannot write");
    constexpr std::size_t chunk = (std::size_t(1) << 20) / sizeof(T);
    buf.resize(std::min(data.size(), chunk) * sizeof(T));
    for (std::size_t done = 0; done < data.size();) {
        const std::size_t m = std::min(chunk, data.size() - done);
        for (std::size_t i = 0; i < m; ++i) encode_be<T>(data[done + i], buf.data() + i * sizeof(T));
        if (std::fwrite(buf.data(), 1, m * sizeof(T), f.get()) != m * sizeof(T)) fail("cannot write");
        done += m;
    }
    if (std::fflush(f.get()) != 0) fail("cannot write");
    if (std::fclose(f.release()) != 0) {
        const int err = errno;
        std::error_code ec;
        std::filesystem::remove(path, ec);
        throw_error<IoError>("write_idx: cannot close ", in_quotes(path.string()), ": ", std::strerror(err));
    }
}

/// write_idx for a std::vector (so T is deduced): `write_idx(p, {2, 2}, std::vector<float>{...})`.
template <IdxElement T>
void write_idx(const std::filesystem::path& path, const std::vector<std::size_t>& dims, const std::vector<T>& data) {
    write_idx<T>(path, dims, std::span<const T>(data));
}

/// write_idx for an IdxArray (its `stored_type` is ignored: T decides the file's type).
template <IdxElement T>
void write_idx(const std::filesystem::path& path, const IdxArray<T>& a) {
    write_idx<T>(path, a.dims, std::span<const T>(a.data));
}

}  // namespace strata::io

#if STRATA_DEFINITIONS
#include "strata/io/impl/idx.ipp"
#endif
