#pragma once
/// \file strata/nn/impl/sequential.ipp
/// The definitions behind strata/nn/sequential.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <cstring>
#include <string_view>

#include "strata/nn/sequential.hpp"

namespace strata::nn::detail {

STRATA_DECL std::string shape_text(std::int64_t batch_dim, std::span<const std::int64_t> dims) {
    std::string s = "(";
    s += batch_dim < 0 ? "None" : std::to_string(batch_dim);
    for (auto d : dims) s += ", " + std::to_string(d);
    return s + ")";
}

STRATA_DECL std::vector<std::string> keras_layer_names(std::span<const char* const> kinds) {
    std::vector<std::string> names;
    names.reserve(kinds.size());
    for (std::size_t i = 0; i < kinds.size(); ++i) {
        int before = 0;  // earlier layers of the same kind
        for (std::size_t j = 0; j < i; ++j) before += std::string_view(kinds[j]) == kinds[i];
        names.push_back(before ? std::string(kinds[i]) + "_" + std::to_string(before) : std::string(kinds[i]));
    }
    return names;
}

STRATA_DECL void append_layer_params(std::vector<ParamInfo>& all, const std::string& layer, std::int64_t offset,
                                     std::vector<ParamInfo> params) {
    for (auto& p : params) {
        p.name = layer + "/" + p.name;
        p.offset += offset;
        all.push_back(std::move(p));
    }
}

// 121930 -> "121,930"
inline std::string group_digits(std::int64_t v) {
    const std::string s = std::to_string(v);
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

STRATA_DECL std::vector<MovingAverageSpan> moving_average_spans(const std::vector<ParamInfo>& params) {
    std::vector<MovingAverageSpan> out;
    for (const auto& p : params) {
        if (p.trainable) continue;
        const std::int64_t n = p.shape.size();
        if (!out.empty() && out.back().first + out.back().count == p.offset && out.back().momentum == p.momentum)
            out.back().count += n;
        else
            out.push_back({p.offset, n, p.momentum});
    }
    return out;
}

STRATA_DECL std::vector<std::pair<std::int64_t, std::int64_t>> compute_rounded_spans(const std::vector<ParamInfo>& params) {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (const auto& p : params) {
        if (!p.trainable || p.float32) continue;
        const std::int64_t n = p.shape.size();
        if (!out.empty() && out.back().first + out.back().second == p.offset) out.back().second += n;
        else out.emplace_back(p.offset, n);
    }
    return out;
}

STRATA_DECL std::string summary_table(std::span<const char* const> kinds, std::span<const char* const> types,
                                      std::span<const std::string> shapes, std::span<const std::int64_t> offsets,
                                      std::int64_t non_trainable) {
    const auto names = keras_layer_names(kinds);
    // The first column is 34 wide, as Keras', or as wide as the longest label.
    std::size_t width = 34;
    for (std::size_t i = 0; i < names.size(); ++i) width = std::max(width, names[i].size() + std::strlen(types[i]) + 3);
    const std::size_t total_width = width + 38;
    std::string out;
    char line[400];
    const std::string rule(total_width, '-');
    out += "Model: \"sequential\"\n" + rule + "\n";
    std::snprintf(line, sizeof line, "%-*s %-24s %12s\n", int(width), "Layer (type)", "Output Shape", "Param #");
    out += line + std::string(total_width, '=') + "\n";
    for (std::size_t i = 0; i < names.size(); ++i) {
        const std::string label = names[i] + " (" + types[i] + ")";
        std::snprintf(line, sizeof line, "%-*s %-24s %12s\n", int(width), label.c_str(), shapes[i].c_str(),
                      group_digits(offsets[i + 1] - offsets[i]).c_str());
        out += line;
    }
    const std::int64_t all = offsets[names.size()];
    out += std::string(total_width, '=') + "\n";
    out += "Total params: " + group_digits(all) + "\nTrainable params: " + group_digits(all - non_trainable) +
           "\nNon-trainable params: " + group_digits(non_trainable) + "\n" + rule + "\n";
    return out;
}

}  // namespace strata::nn::detail
