#pragma once
/// \file strata/nn/impl/sequential.ipp
/// The definitions behind strata/nn/sequential.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/nn/sequential.hpp"

namespace strata::nn::detail {

STRATA_DECL std::string shape_text(std::int64_t batch_dim, std::span<const std::int64_t> dims) {
    std::string s = "(";
    s += batch_dim < 0 ? "None" : std::to_string(batch_dim);
    for (auto d : dims) s += ", " + std::to_string(d);
    return s + ")";
}

}  // namespace strata::nn::detail
