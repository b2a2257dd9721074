#pragma once
/// \file strata/io/svg_plot.hpp
/// Line plots as SVG, without dependencies: any figure that is a few named series of (x, y)
/// points (LinePlot), e.g. accuracy against time for several strategies, and several of them
/// side by side (Figure). A browser shows the file; hovering a point shows its value. Training
/// curves of a History are strata/train/plot.hpp's plot_history. Opt-in: strata/strata.hpp
/// does not include it.
///
/// \code
///   strata::io::LinePlot p{.title = "Accuracy against time", .x_label = "seconds", .y_label = "accuracy"};
///   p.add("mirrored", seconds_m, accuracy_m).add("parameter server", seconds_ps, accuracy_ps);
///   p.save("accuracy.svg");
/// \endcode

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "strata/config.hpp"

namespace strata::io {

/// How an axis maps values to positions. A Log axis shows only positive values: points with
/// x <= 0 are left out, as NaN points are.
enum class Scale { Linear, Log };

/// One named line of a LinePlot: points (x[i], y[i]), drawn in order. A point whose x or y is
/// not finite (NaN, infinity) is skipped and breaks the line there, as in matplotlib.
struct Series {
    std::string name;
    std::vector<double> x, y;
    /// An SVG color ("#1f77b4", "red"); empty: the next color of the palette.
    std::string color{};
    /// Drawn dashed (train/plot.hpp's plot_history uses it for validation figures).
    bool dashed = false;
};

/// Axis ticks at "nice" values (1, 2 or 5 times a power of ten) covering [lo, hi] with about
/// `target` intervals (Heckbert, "Nice numbers for graph labels", Graphics Gems, 1990). The first
/// tick is <= lo and the last >= hi, so the axis range is [front, back].
/// Requires: lo and hi finite, lo <= hi, target >= 1; lo == hi gets a range around the value.
STRATA_DECL std::vector<double> nice_ticks(double lo, double hi, int target = 5);

/// Ticks of a log axis over [lo, hi] (both > 0): the powers of ten around the range, with 2 and 5
/// times them added when the range spans less than two decades.
STRATA_DECL std::vector<double> log_ticks(double lo, double hi);

/// The `i`-th color (modulo 10) of the palette LinePlot draws series in: matplotlib's tab10
/// colors, distinct for most color-vision deficiencies.
STRATA_DECL const char* palette(std::size_t i);

/// A line plot of named series: title, axis labels, a legend, a linear or log x axis, ticks at
/// round numbers. svg() gives the SVG text; save() writes it atomically (a reader sees the old
/// file or the new one, never half of one).
///
/// Every point is drawn as a circle carrying its exact value (`data-x`, `data-y`) and a
/// tooltip (`<title>`); each series is a `<g class="series" data-name="...">`, so programs can
/// read the figures back from the file.
///
/// Requires: each series has as many x as y values (ShapeError otherwise).
struct LinePlot {
    std::string title{};
    std::string x_label{};
    std::string y_label{};
    Scale x_scale = Scale::Linear;
    /// Size of the whole picture, in pixels.
    int width = 640, height = 400;
    std::vector<Series> series{};

    /// Adds a series (`color` empty: the palette's next one); returns *this to chain.
    LinePlot& add(std::string name, std::vector<double> x, std::vector<double> y, std::string color = {},
                  bool dashed = false);

    /// The SVG document (XML, UTF-8).
    std::string svg() const;

    /// Writes svg() to `path` atomically. Throws IoError naming the path on failure.
    void save(const std::filesystem::path& path) const;

    /// The opening <svg> tag of a `w` x `h` picture (with a white background).
    static std::string header(int w, int h);

    /// The plot as an SVG group placed at (`left`, `top`) in a larger picture (Figure uses it).
    std::string group(double left, double top) const;
};

/// Several LinePlots side by side (`columns` per row), as one SVG picture.
struct Figure {
    std::vector<LinePlot> panels{};
    int columns = 2;

    /// The SVG document; each panel keeps its own width and height (rows as tall as the tallest).
    std::string svg() const;

    /// Writes svg() to `path` atomically (see LinePlot::save).
    void save(const std::filesystem::path& path) const;
};

}  // namespace strata::io

#if STRATA_DEFINITIONS
#include "strata/io/impl/svg_plot.ipp"
#endif
