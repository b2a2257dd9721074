#pragma once
/// \file strata/io/impl/svg_plot.ipp
/// The definitions behind strata/io/svg_plot.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string_view>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/io/atomic_file.hpp"
#include "strata/io/svg_plot.hpp"
#include "strata/io/text.hpp"

namespace strata::io {

namespace detail::svg {

// `s` with XML's five special characters escaped (titles and names are user text).
inline std::string escape(std::string_view s) {
    std::string out;
    for (char c : s) switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default:
                // XML 1.0 allows no control characters but tab and newline.
                if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') out += ' ';
                else out += c;
        }
    return out;
}

// A coordinate in pixels, two decimals (enough for any screen, short files).
inline std::string px(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", v);
    return b;
}

// A data value, exactly enough to read it back (17 significant digits).
inline std::string exact(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    return b;
}

// A tick label: as few digits as the spacing of the ticks needs.
inline std::string tick_label(double v, double step) {
    char b[32];
    const double a = std::abs(v);
    if (v != 0 && (a >= 1e6 || a < 1e-4)) std::snprintf(b, sizeof b, "%g", v);
    else {
        const int decimals = step > 0 ? std::clamp(int(std::ceil(-std::log10(step) - 1e-9)), 0, 8) : 0;
        std::snprintf(b, sizeof b, "%.*f", decimals, v);
    }
    return b;
}

}  // namespace detail::svg

STRATA_DECL std::vector<double> nice_ticks(double lo, double hi, int target) {
    STRATA_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && target >= 1, ValueError,
                 "nice_ticks: expected finite lo <= hi and target >= 1, found lo = ", lo, ", hi = ", hi, ", target = ",
                 target);
    // A range too narrow for doubles to step through (or none) gets one around its middle.
    if (hi - lo <= std::max(std::abs(lo), std::abs(hi)) * 1e-12) {
        lo = hi = lo + (hi - lo) / 2;
        const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
        lo -= pad;
        hi += pad;
    }
    auto nice = [](double v, bool round) {
        const double e = std::floor(std::log10(v)), f = v / std::pow(10.0, e);
        const double n = round ? (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) : (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10);
        return n * std::pow(10.0, e);
    };
    const double step = nice(nice(hi - lo, false) / target, true);
    const double first = std::floor(lo / step) * step, last = std::ceil(hi / step) * step;
    std::vector<double> ticks;
    for (int i = 0;; ++i) {
        double t = first + i * step;
        if (std::abs(t) < step * 1e-9) t = 0;  // -0.0 and 1e-17 print as 0
        ticks.push_back(t);
        if (t >= last - step * 1e-9 || i > 10 * target + 10) break;
    }
    return ticks;
}

STRATA_DECL std::vector<double> log_ticks(double lo, double hi) {
    STRATA_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo > 0 && lo <= hi, ValueError,
                 "log_ticks: expected 0 < lo <= hi, finite; found lo = ", lo, ", hi = ", hi);
    const int e0 = int(std::floor(std::log10(lo) + 1e-12)), e1 = int(std::ceil(std::log10(hi) - 1e-12));
    std::vector<double> ticks;
    const bool fine = std::log10(hi / lo) < 2;
    for (int e = e0; e <= std::max(e1, e0 + 1); ++e) {
        const double p = std::pow(10.0, e);
        ticks.push_back(p);
        if (fine && e < std::max(e1, e0 + 1)) {
            ticks.push_back(2 * p);
            ticks.push_back(5 * p);
        }
    }
    // Trim to the ticks just around [lo, hi].
    while (ticks.size() > 2 && ticks[1] <= lo) ticks.erase(ticks.begin());
    while (ticks.size() > 2 && ticks[ticks.size() - 2] >= hi) ticks.pop_back();
    return ticks;
}

STRATA_DECL const char* palette(std::size_t i) {
    static const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    return colors[i % 10];
}

STRATA_DECL LinePlot& LinePlot::add(std::string name, std::vector<double> x, std::vector<double> y, std::string color, bool dashed) {
    STRATA_CHECK(x.size() == y.size(), ShapeError, "LinePlot::add: series ", in_quotes(name), " has ", x.size(),
                 " x values and ", y.size(), " y values; expected as many of each");
    series.push_back({std::move(name), std::move(x), std::move(y), std::move(color), dashed});
    return *this;
}

STRATA_DECL std::string LinePlot::svg() const {
    std::string out = header(width, height);
    out += group(0, 0);
    return out + "</svg>\n";
}

STRATA_DECL void LinePlot::save(const std::filesystem::path& path) const {
    const std::string text = svg();
    AtomicFileWriter out(path);
    out.write(text.data(), text.size());
    out.commit();
}

STRATA_DECL std::string LinePlot::header(int w, int h) {
    using detail::svg::px;
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
           std::to_string(w) + "\" height=\"" + std::to_string(h) + "\" viewBox=\"0 0 " + std::to_string(w) + " " +
           std::to_string(h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"" + std::to_string(w) +
           "\" height=\"" + std::to_string(h) + "\" fill=\"white\"/>\n";
}

namespace detail::svg {

// A point is drawn when both values are finite (and x > 0 on a log x axis).
inline bool usable(double x, double y, bool log_x) { return std::isfinite(x) && std::isfinite(y) && (!log_x || x > 0); }

// The tick values of both axes over the points that are drawn.
struct Ticks {
    std::vector<double> x, y;
};
inline Ticks plot_ticks(const std::vector<Series>& series, bool log_x, int width, int height) {
    // The data's range over the points that are drawn.
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& s : series) {
        STRATA_CHECK(s.x.size() == s.y.size(), ShapeError, "LinePlot: series ", in_quotes(s.name), " has ", s.x.size(),
                     " x values and ", s.y.size(), " y values; expected as many of each");
        for (std::size_t i = 0; i < s.x.size(); ++i)
            if (usable(s.x[i], s.y[i], log_x)) {
                x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
                y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
            }
    }
    if (!(x0 <= x1)) x0 = log_x ? 1 : 0, x1 = log_x ? 10 : 1, y0 = 0, y1 = 1;  // nothing to draw: an empty frame
    // A margin of 5% above and below (matplotlib's), so no point sits on the frame.
    const double ym = (y1 - y0) * 0.05;
    Ticks t{log_x ? log_ticks(x0, x1) : nice_ticks(x0, x1, std::max(2, width / 110)), nice_ticks(y0 - ym, y1 + ym, std::max(2, height / 70))};
    // Whole-number x values (epochs, steps) get whole-number ticks, not 1.5.
    bool whole_x = !log_x;
    for (const auto& s : series)
        for (std::size_t i = 0; i < s.x.size() && whole_x; ++i)
            if (usable(s.x[i], s.y[i], log_x) && s.x[i] != std::floor(s.x[i])) whole_x = false;
    if (whole_x && t.x.size() > 1 && t.x[1] - t.x[0] < 1) {
        t.x.clear();
        for (double v = std::floor(x0); v <= std::ceil(x1) || t.x.size() < 2; v += 1) t.x.push_back(v);
    }
    return t;
}

// Where the data lands: the frame's edges in pixels and the axes' ranges (their outer ticks).
struct Frame {
    double pl, pr, pt, pb;
    double xa, xb, ya, yb;
    bool log_x;
    double fx(double x) const {
        const double u = log_x ? (std::log10(x) - std::log10(xa)) / (std::log10(xb) - std::log10(xa)) : (x - xa) / (xb - xa);
        return pl + u * (pr - pl);
    }
    double fy(double y) const { return pb - (y - ya) / (yb - ya) * (pb - pt); }
};

// The title, the grid, the tick labels, the frame and the axis labels.
inline std::string axes_svg(const LinePlot& p, const Frame& f, const Ticks& t, double left, double top) {
    std::string o;
    if (!p.title.empty())
        o += "<text x=\"" + px((f.pl + f.pr) / 2) + "\" y=\"" + px(top + 22) + "\" class=\"title\" text-anchor=\"middle\" font-size=\"15\">" +
             escape(p.title) + "</text>\n";
    o += "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
    for (double v : t.x) o += "<line x1=\"" + px(f.fx(v)) + "\" y1=\"" + px(f.pt) + "\" x2=\"" + px(f.fx(v)) + "\" y2=\"" + px(f.pb) + "\"/>\n";
    for (double v : t.y) o += "<line x1=\"" + px(f.pl) + "\" y1=\"" + px(f.fy(v)) + "\" x2=\"" + px(f.pr) + "\" y2=\"" + px(f.fy(v)) + "\"/>\n";
    o += "</g>\n<g class=\"ticks\" fill=\"#333\">\n";
    const double xstep = t.x.size() > 1 ? t.x[1] - t.x[0] : 1, ystep = t.y.size() > 1 ? t.y[1] - t.y[0] : 1;
    for (double v : t.x)
        o += "<text x=\"" + px(f.fx(v)) + "\" y=\"" + px(f.pb + 16) + "\" text-anchor=\"middle\">" +
             escape(f.log_x ? tick_label(v, v) : tick_label(v, xstep)) + "</text>\n";
    for (double v : t.y)
        o += "<text x=\"" + px(f.pl - 6) + "\" y=\"" + px(f.fy(v) + 4) + "\" text-anchor=\"end\">" + escape(tick_label(v, ystep)) +
             "</text>\n";
    o += "</g>\n<rect x=\"" + px(f.pl) + "\" y=\"" + px(f.pt) + "\" width=\"" + px(f.pr - f.pl) + "\" height=\"" + px(f.pb - f.pt) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
    if (!p.x_label.empty())
        o += "<text x=\"" + px((f.pl + f.pr) / 2) + "\" y=\"" + px(f.pb + 36) + "\" text-anchor=\"middle\">" + escape(p.x_label) +
             "</text>\n";
    if (!p.y_label.empty())
        o += "<text transform=\"translate(" + px(left + 16) + " " + px((f.pt + f.pb) / 2) +
             ") rotate(-90)\" text-anchor=\"middle\">" + escape(p.y_label) + "</text>\n";
    return o;
}

// Series s in `color`: one polyline per unbroken run of drawable points, and a circle per point.
inline std::string series_svg(const LinePlot& p, const Series& s, const std::string& color, const Frame& f) {
    const std::string dash = s.dashed ? " stroke-dasharray=\"6 4\"" : "";
    std::string o = "<g class=\"series\" data-name=\"" + escape(s.name) + "\" stroke=\"" + escape(color) + "\" fill=\"" +
                    escape(color) + "\">\n";
    std::string run;
    auto flush = [&] {
        if (!run.empty()) o += "<polyline fill=\"none\" stroke-width=\"2\"" + dash + " points=\"" + run + "\"/>\n";
        run.clear();
    };
    for (std::size_t i = 0; i < s.x.size(); ++i) {
        if (!usable(s.x[i], s.y[i], f.log_x)) {
            flush();
            continue;
        }
        // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on "literal" + string.
        if (!run.empty()) run += ' ';
        run += px(f.fx(s.x[i]));
        run += ',';
        run += px(f.fy(s.y[i]));
    }
    flush();
    for (std::size_t i = 0; i < s.x.size(); ++i)
        if (usable(s.x[i], s.y[i], f.log_x))
            o += "<circle cx=\"" + px(f.fx(s.x[i])) + "\" cy=\"" + px(f.fy(s.y[i])) + "\" r=\"2.5\" data-x=\"" + exact(s.x[i]) +
                 "\" data-y=\"" + exact(s.y[i]) + "\"><title>" + escape(s.name) + ": " + escape(p.x_label.empty() ? "x" : p.x_label) +
                 " " + exact(s.x[i]) + ", " + exact(s.y[i]) + "</title></circle>\n";
    return o + "</g>\n";
}

// The legend, in the corner of the frame that hides the fewest points (matplotlib's "best"),
// the top right one on a tie.
inline std::string legend_svg(const LinePlot& p, const std::vector<std::string>& colors, const Frame& f) {
    const auto& series = p.series;
    std::size_t longest = 0;
    for (const auto& s : series) longest = std::max(longest, s.name.size());
    const double lw = 40 + 7.0 * double(longest), lh = 8 + 18.0 * double(series.size());
    double lx = f.pr - lw - 8, ly = f.pt + 8;
    std::size_t fewest = std::numeric_limits<std::size_t>::max();
    for (const auto& [cx, cy] : {std::pair{f.pr - lw - 8, f.pt + 8}, std::pair{f.pl + 8, f.pt + 8},
                                 std::pair{f.pr - lw - 8, f.pb - lh - 8}, std::pair{f.pl + 8, f.pb - lh - 8}}) {
        std::size_t hidden = 0;
        for (const auto& s : series)
            for (std::size_t i = 0; i < s.x.size(); ++i)
                if (usable(s.x[i], s.y[i], f.log_x)) {
                    const double X = f.fx(s.x[i]), Y = f.fy(s.y[i]);
                    hidden += X >= cx - 4 && X <= cx + lw + 4 && Y >= cy - 4 && Y <= cy + lh + 4;
                }
        if (hidden < fewest) fewest = hidden, lx = cx, ly = cy;
    }
    std::string o = "<g class=\"legend\">\n<rect x=\"" + px(lx) + "\" y=\"" + px(ly) + "\" width=\"" + px(lw) + "\" height=\"" +
                    px(lh) + "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n";
    for (std::size_t k = 0; k < series.size(); ++k) {
        const double yy = ly + 14 + 18.0 * double(k);
        o += "<line x1=\"" + px(lx + 6) + "\" y1=\"" + px(yy - 4) + "\" x2=\"" + px(lx + 30) + "\" y2=\"" + px(yy - 4) +
             "\" stroke=\"" + escape(colors[k]) + "\" stroke-width=\"2\"" + (series[k].dashed ? " stroke-dasharray=\"6 4\"" : "") +
             "/>\n<text x=\"" + px(lx + 36) + "\" y=\"" + px(yy) + "\">" + escape(series[k].name) + "</text>\n";
    }
    return o + "</g>\n";
}

}  // namespace detail::svg

STRATA_DECL std::string LinePlot::group(double left, double top) const {
    using namespace detail::svg;
    STRATA_CHECK(width >= 120 && height >= 100, ValueError, "LinePlot: expected a size of at least 120 x 100 pixels, found ",
                 width, " x ", height);
    const bool log_x = x_scale == Scale::Log;
    const Ticks t = plot_ticks(series, log_x, width, height);
    // The frame: room on the left for the y labels, below for the x labels, above for the title.
    const Frame f{left + 64, left + width - 16, top + (title.empty() ? 16 : 36), top + height - (x_label.empty() ? 30 : 48),
                  t.x.front(), t.x.back(), t.y.front(), t.y.back(), log_x};
    std::string o = "<g class=\"plot\">\n" + axes_svg(*this, f, t, left, top);
    std::vector<std::string> colors;
    for (std::size_t k = 0; k < series.size(); ++k) {
        colors.push_back(series[k].color.empty() ? palette(k) : series[k].color);
        o += series_svg(*this, series[k], colors[k], f);
    }
    if (!series.empty()) o += legend_svg(*this, colors, f);
    return o + "</g>\n";
}

STRATA_DECL std::string Figure::svg() const {
    STRATA_CHECK(columns >= 1, ValueError, "Figure: expected columns >= 1, found ", columns);
    std::vector<int> col_w(std::size_t(columns), 0), row_h((panels.size() + std::size_t(columns) - 1) / std::size_t(columns), 0);
    for (std::size_t i = 0; i < panels.size(); ++i) {
        col_w[i % std::size_t(columns)] = std::max(col_w[i % std::size_t(columns)], panels[i].width);
        row_h[i / std::size_t(columns)] = std::max(row_h[i / std::size_t(columns)], panels[i].height);
    }
    int w = 0, h = 0;
    for (int c : col_w) w += c;
    for (int r : row_h) h += r;
    std::string out = LinePlot::header(std::max(w, 1), std::max(h, 1));
    for (std::size_t i = 0; i < panels.size(); ++i) {
        int x = 0, y = 0;
        for (std::size_t c = 0; c < i % std::size_t(columns); ++c) x += col_w[c];
        for (std::size_t r = 0; r < i / std::size_t(columns); ++r) y += row_h[r];
        out += panels[i].group(x, y);
    }
    return out + "</svg>\n";
}

STRATA_DECL void Figure::save(const std::filesystem::path& path) const {
    const std::string text = svg();
    AtomicFileWriter out(path);
    out.write(text.data(), text.size());
    out.commit();
}

}  // namespace strata::io
