#pragma once
/// \file strata/io/text.hpp
/// Text for messages, shared by every file format and every error strata throws: a quoting
/// helper that bounds what it quotes (a hostile file's 50 MB name must not become a 50 MB
/// message), one way to print a shape, and a UTF-8 check.
///
/// \code
///   strata::io::in_quotes("dense/kernel")          // 'dense/kernel'
///   strata::io::in_quotes(name_from_a_file, 200)   // at most 200 bytes of it, then "... (N bytes)"
///   strata::io::shape_text(std::vector<std::size_t>{3, 3, 1, 8})   // [3, 3, 1, 8]
/// \endcode

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace strata::io {

/// The default bound of in_quotes(): a whole path (PATH_MAX is 4096 on Linux), and still a bound on
/// text read from a hostile file.
inline constexpr std::size_t max_in_quotes = 4096;

/// `text` cut to `max` bytes for a message, with the full length said when it was cut:
/// `clipped("abcdef", 3)` is "abc... (6 bytes)".
inline std::string clipped(std::string_view text, std::size_t max = 64) {
    if (text.size() <= max) return std::string(text);
    std::string s(text.substr(0, max));
    s += "... (";
    s += std::to_string(text.size());
    s += " bytes)";
    return s;
}

/// `text` in single quotes, cut to `max` bytes as clipped() does: `in_quotes("w")` is "'w'".
/// Pass a smaller `max` for text that comes from a file (names, values) rather than from the user.
/// (Not called `quoted`: with a std::string argument, argument-dependent lookup would pick
/// std::quoted over it.)
inline std::string in_quotes(std::string_view text, std::size_t max = max_in_quotes) {
    // Built by appending: g++ 12 warns falsely (-Wrestrict) on "'" + std::string.
    std::string out(1, '\'');
    out += clipped(text, max);
    out += '\'';
    return out;
}

namespace detail {
template <std::integral I>
std::string join_extents(std::span<const I> dims) {
    std::string s = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(dims[i]);
    }
    return s + "]";
}
}  // namespace detail

/// "[784, 64]" (or "[]" for a scalar): how messages print a shape, the extents outermost first.
inline std::string shape_text(std::span<const std::size_t> dims) { return detail::join_extents(dims); }
/// shape_text() of signed extents (core::Shape's, a partitioner's): "[-1, 3]" shows a bad one.
inline std::string shape_text(std::span<const std::int64_t> dims) { return detail::join_extents(dims); }

/// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
inline bool valid_utf8(std::string_view s) noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const std::size_t n = s.size();
    std::size_t i = 0;
    while (i < n) {
        const unsigned c = p[i];
        if (c < 0x80) { ++i; continue; }
        std::size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return false;
        if (i + len > n) return false;
        if (p[i + 1] < lo || p[i + 1] > hi) return false;
        for (std::size_t k = 2; k < len; ++k)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

}  // namespace strata::io
