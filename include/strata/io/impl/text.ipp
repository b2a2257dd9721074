#pragma once
/// \file strata/io/impl/text.ipp
/// The definitions behind strata/io/text.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <concepts>

#include "strata/io/text.hpp"

namespace strata::io {

STRATA_DECL std::string clipped(std::string_view text, std::size_t max) {
    if (text.size() <= max) return std::string(text);
    std::string s(text.substr(0, max));
    s += "... (";
    s += std::to_string(text.size());
    s += " bytes)";
    return s;
}

STRATA_DECL std::string in_quotes(std::string_view text, std::size_t max) {
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

STRATA_DECL std::string shape_text(std::span<const std::size_t> dims) { return detail::join_extents(dims); }
STRATA_DECL std::string shape_text(std::span<const std::int64_t> dims) { return detail::join_extents(dims); }

STRATA_DECL bool valid_utf8(std::string_view s) noexcept {
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
