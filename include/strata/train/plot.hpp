#pragma once
/// \file strata/train/plot.hpp
/// Training curves of a History as SVG (plot_history, history_figure), drawn with
/// strata/io/svg_plot.hpp. Opt-in: strata/strata.hpp does not include it.
///
/// \code
///   auto history = model.fit(train, {.epochs = 10, .validation_data = test});
///   strata::train::plot_history(history, "curves.svg");
/// \endcode

#include <filesystem>
#include <string>

#include "strata/config.hpp"
#include "strata/io/svg_plot.hpp"
#include "strata/train/callbacks.hpp"

namespace strata::train {

/// The training curves of `history` as a Figure: loss (left) and accuracy (right) per epoch
/// (numbered from 1, as the progress bar does), training solid and validation dashed in the
/// same color. A panel shows only the figures the history has (no accuracy without the metric).
/// Further figures (e.g. a learning rate) are not drawn; use io::LinePlot for those.
STRATA_DECL io::Figure history_figure(const History& history, const std::string& title_prefix = {});

/// Writes the training curves of `history` (see history_figure) as an SVG file at `path`,
/// atomically. Throws ValueError for a history with nothing to draw, IoError if the file cannot
/// be written.
///   strata::train::plot_history(model.fit(train, {.epochs = 5}), "curves.svg");
STRATA_DECL void plot_history(const History& history, const std::filesystem::path& path);

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/plot.ipp"
#endif
