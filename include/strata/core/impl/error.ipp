#pragma once
/// \file strata/core/impl/error.ipp
/// The definitions behind strata/core/error.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/core/error.hpp"

namespace strata::detail {

STRATA_DECL MessagePiece::MessagePiece(long long v) noexcept { set(std::to_chars(buf_, buf_ + sizeof buf_, v).ptr); }
STRATA_DECL MessagePiece::MessagePiece(unsigned long long v) noexcept { set(std::to_chars(buf_, buf_ + sizeof buf_, v).ptr); }
STRATA_DECL MessagePiece::MessagePiece(double v) noexcept { set_size(std::snprintf(buf_, sizeof buf_, "%g", v)); }
STRATA_DECL MessagePiece::MessagePiece(long double v) noexcept { set_size(std::snprintf(buf_, sizeof buf_, "%Lg", v)); }

[[gnu::cold]] STRATA_DECL std::string join_message(std::initializer_list<MessagePiece> pieces) {
    std::size_t size = 0;
    for (const auto& p : pieces) size += p.view().size();
    std::string out;
    out.reserve(size);
    for (const auto& p : pieces) out += p.view();
    return out;
}

}  // namespace strata::detail
