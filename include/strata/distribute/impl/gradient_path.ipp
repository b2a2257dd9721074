#pragma once
/// \file strata/distribute/impl/gradient_path.ipp
/// The non-template definitions behind strata/distribute/gradient_path.hpp: included by it in the
/// header-only mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/distribute/gradient_path.hpp"

namespace strata::distribute::detail {

STRATA_DECL void log_variable_copies(std::vector<nn::ParamInfo> (*parameters)(), const std::vector<place::LogicalDevice>& devices,
                                     int copies) {
    if (!place::get_log_device_placement()) return;
    for (const auto& p : parameters())
        for (int r = 0; r < copies; ++r)
            place::log_placement("variable " + p.name + " " + p.shape.str() +
                                     (copies > 1 ? " (copy " + std::to_string(r) + ")" : std::string()),
                                 devices[std::size_t(r)]);
}

}  // namespace strata::distribute::detail
