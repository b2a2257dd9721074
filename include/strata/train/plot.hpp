#pragma once
/// \file strata/train/plot.hpp
/// Training curves of a History as SVG (plot_history, history_figure), drawn with
/// strata/io/svg_plot.hpp. Opt-in: strata/strata.hpp does not include it.
///
/// \code
///   auto history = model.fit(train, {.epochs = 10, .validation_data = test});
///   strata::train::plot_history(history, "curves.svg");
/// \endcode

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/io/svg_plot.hpp"
#include "strata/train/callbacks.hpp"

namespace strata::train {

/// The training curves of `history` as a Figure: loss (left) and accuracy (right) per epoch
/// (numbered from 1, as the progress bar does), training solid and validation dashed in the
/// same color. A panel shows only the figures the history has (no accuracy without the metric).
/// Further figures (e.g. a learning rate) are not drawn; use io::LinePlot for those.
inline io::Figure history_figure(const History& history, const std::string& title_prefix = {}) {
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

/// Writes the training curves of `history` (see history_figure) as an SVG file at `path`,
/// atomically. Throws ValueError for a history with nothing to draw, IoError if the file cannot
/// be written.
///   strata::train::plot_history(model.fit(train, {.epochs = 5}), "curves.svg");
inline void plot_history(const History& history, const std::filesystem::path& path) {
    history_figure(history).save(path);
}

}  // namespace strata::train
