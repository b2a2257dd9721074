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

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "strata/config.hpp"

namespace strata::io {

/// The default bound of in_quotes(): a whole path (PATH_MAX is 4096 on Linux), and still a bound on
/// text read from a hostile file.
inline constexpr std::size_t max_in_quotes = 4096;

/// `text` cut to `max` bytes for a message, with the full length said when it was cut:
/// `clipped("abcdef", 3)` is "abc... (6 bytes)".
STRATA_DECL std::string clipped(std::string_view text, std::size_t max = 64);

/// `text` in single quotes, cut to `max` bytes as clipped() does: `in_quotes("w")` is "'w'".
/// Pass a smaller `max` for text that comes from a file (names, values) rather than from the user.
/// (Not called `quoted`: with a std::string argument, argument-dependent lookup would pick
/// std::quoted over it.)
STRATA_DECL std::string in_quotes(std::string_view text, std::size_t max = max_in_quotes);

/// "[784, 64]" (or "[]" for a scalar): how messages print a shape, the extents outermost first.
STRATA_DECL std::string shape_text(std::span<const std::size_t> dims);
/// shape_text() of signed extents (core::Shape's, a partitioner's): "[-1, 3]" shows a bad one.
STRATA_DECL std::string shape_text(std::span<const std::int64_t> dims);

/// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
STRATA_DECL bool valid_utf8(std::string_view s) noexcept;

}  // namespace strata::io

#if STRATA_DEFINITIONS
#include "strata/io/impl/text.ipp"
#endif
