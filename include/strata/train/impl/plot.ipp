#pragma once
/// \file strata/train/impl/plot.ipp
/// The definitions behind strata/train/plot.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/train/plot.hpp"

namespace strata::train {

STRATA_DECL io::Figure history_figure(const History& history, const std::string& title_prefix) {
    std::vector<double> epochs;
    for (int e : history.epoch) epochs.push_back(double(e + 1));
    auto figure_of = [&](const std::string& key) -> const std::vector<double>* {
        const auto it = history.history.find(key);
        return it == history.history.end() ? nullptr : &it->second;
    };
    // A figure recorded on fewer epochs than the history has (none is today) takes the first ones.
    auto epochs_for = [&](const std::vector<double>& v) {
        return std::vector<double>(epochs.begin(), epochs.begin() + std::ptrdiff_t(std::min(v.size(), epochs.size())));
    };
    auto values_for = [&](const std::vector<double>& v) {
        return std::vector<double>(v.begin(), v.begin() + std::ptrdiff_t(std::min(v.size(), epochs.size())));
    };
    io::Figure f;
    for (const char* metric : {"loss", "accuracy"}) {
        io::LinePlot p{.title = title_prefix + metric, .x_label = "epoch", .y_label = metric};
        const std::string val = std::string("val_") + metric;
        if (const auto* v = figure_of(metric))
            p.add(std::string("train ") + metric, epochs_for(*v), values_for(*v), io::palette(0));
        if (const auto* v = figure_of(val))
            p.add("validation " + std::string(metric), epochs_for(*v), values_for(*v), io::palette(1), true);
        if (!p.series.empty()) f.panels.push_back(std::move(p));
    }
    STRATA_CHECK(!f.panels.empty(), ValueError,
                 "plot_history: the history has neither loss nor accuracy to draw (it has ", history.history.size(), " figures)");
    f.columns = int(f.panels.size());
    return f;
}

STRATA_DECL void plot_history(const History& history, const std::filesystem::path& path) {
    history_figure(history).save(path);
}

}  // namespace strata::train
