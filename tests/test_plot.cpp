// SVG line plots (strata/io/svg_plot.hpp, and strata/train/plot.hpp's plot_history): ticks,
// the document's content, errors, atomic files.
// The SVG's structure is checked by an independent XML parser in tests/check_plot.py.
#include <doctest/doctest.h>

#include <strata/io/svg_plot.hpp>
#include <strata/train/plot.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "test_util.hpp"

namespace fs = std::filesystem;
using strata_test::TempDir;
using strata_test::error_of;
using strata_test::has;

namespace {

std::string read_text(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();

// The sample tests/check_plot.py compares the files with (its SAMPLE must match).
strata::io::LinePlot sample_plot() {
    strata::io::LinePlot p{.title = "Accuracy <vs> time & \"modes\"", .x_label = "seconds", .y_label = "accuracy"};
    p.add("mirrored", {1, 2, 3, 4}, {0.5, 0.7, 0.8, 0.85});
    p.add("parameter server", {1.5, 2.5, 3.5, 4.5, 5.5}, {0.4, not_a_number, 0.75, 0.8, 0.9}, "", true);
    return p;
}

strata::train::History sample_history() {
    strata::train::History h;
    const double loss[] = {0.9, 0.5, 0.3}, acc[] = {0.7, 0.85, 0.9}, vloss[] = {0.6, 0.45, 0.4}, vacc[] = {0.8, 0.86, 0.88};
    for (int e = 0; e < 3; ++e) {
        strata::train::Logs logs;
        logs.set("loss", loss[e]);
        logs.set("accuracy", acc[e]);
        logs.set("val_loss", vloss[e]);
        logs.set("val_accuracy", vacc[e]);
        h.record(e, logs);
    }
    return h;
}

}  // namespace

TEST_CASE("nice_ticks: round steps that cover the range") {
    using strata::io::nice_ticks;
    auto t = nice_ticks(0.13, 0.92, 5);
    REQUIRE(t.size() >= 3);
    CHECK(t.front() <= 0.13);
    CHECK(t.back() >= 0.92);
    const double step = t[1] - t[0];
    CHECK(step == doctest::Approx(0.2));
    for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i] - t[i - 1] == doctest::Approx(step));
    t = nice_ticks(-3, 7, 5);
    CHECK(t.front() == -4);
    CHECK(t.back() == 8);
    CHECK(std::find(t.begin(), t.end(), 0.0) != t.end());  // zero is a tick, not 1e-17
    t = nice_ticks(5, 5);  // one value: a range around it
    CHECK(t.front() < 5);
    CHECK(t.back() > 5);
    t = nice_ticks(1e15, 1e15 + 0.1);  // too narrow for doubles: still terminates
    CHECK(t.size() >= 2);
    CHECK(has(error_of<strata::ValueError>([] { nice_ticks(2, 1); }), "lo = 2, hi = 1"));
    CHECK(has(error_of<strata::ValueError>([] { nice_ticks(0, not_a_number); }), "expected finite lo <= hi"));
}

TEST_CASE("log_ticks: decades, with 2 and 5 on a short range") {
    using strata::io::log_ticks;
    auto t = log_ticks(1e-5, 1e-1);
    CHECK(t.front() == doctest::Approx(1e-5));
    CHECK(t.back() == doctest::Approx(1e-1));
    CHECK(t.size() == 5);
    t = log_ticks(3, 40);
    CHECK(t.front() <= 3);
    CHECK(t.back() >= 40);
    CHECK(std::find_if(t.begin(), t.end(), [](double v) { return std::abs(v - 5) < 1e-12; }) != t.end());
    CHECK(has(error_of<strata::ValueError>([] { log_ticks(0, 1); }), "0 < lo <= hi"));
}

TEST_CASE("LinePlot: every drawable point is in the SVG, NaN points are skipped and break the line") {
    const auto p = sample_plot();
    const std::string svg = p.svg();
    CHECK(svg.rfind("<?xml", 0) == 0);
    CHECK(count(svg, "<circle") == 4 + 4);  // the NaN point is not drawn
    CHECK(count(svg, "<polyline") == 1 + 2);  // the NaN breaks the second series in two
    CHECK(has(svg, "data-name=\"parameter server\""));
    CHECK(has(svg, "Accuracy &lt;vs&gt; time &amp; &quot;modes&quot;"));  // escaped
    CHECK(has(svg, "stroke-dasharray"));
    CHECK_FALSE(has(svg, "nan"));
}

TEST_CASE("LinePlot: a log x axis leaves out x <= 0; mismatched series are ShapeErrors") {
    strata::io::LinePlot p{.title = "lr", .x_label = "learning rate", .y_label = "loss", .x_scale = strata::io::Scale::Log};
    p.add("loss", {0, 1e-4, 1e-3, 1e-2}, {9, 1.0, 0.5, 0.7});
    const std::string svg = p.svg();
    CHECK(count(svg, "<circle") == 3);
    CHECK(has(svg, ">0.0001<"));  // a decade tick
    const auto msg = error_of<strata::ShapeError>([&] { p.add("bad", {1, 2}, {1}); });
    CHECK(has(msg, "series 'bad' has 2 x values and 1 y values"));
    strata::io::LinePlot empty{.title = "nothing yet"};
    CHECK(has(empty.svg(), "nothing yet"));  // an empty frame, not an error
}

TEST_CASE("plot_history: loss and accuracy, train and validation, written atomically") {
    TempDir dir;
    const auto path = dir / "curves.svg";
    {
        std::ofstream(path) << "old";
    }
    strata::train::plot_history(sample_history(), path);
    const std::string svg = read_text(path);
    CHECK(has(svg, "data-name=\"train loss\""));
    CHECK(has(svg, "data-name=\"validation loss\""));
    CHECK(has(svg, "data-name=\"train accuracy\""));
    CHECK(has(svg, "data-name=\"validation accuracy\""));
    CHECK(count(svg, "<circle") == 12);
    CHECK(dir.entries() == std::vector<std::string>{"curves.svg"});  // no temporary file left
    strata::train::History none;
    CHECK(has(error_of<strata::ValueError>([&] { strata::train::plot_history(none, dir / "x.svg"); }), "neither loss nor accuracy"));
    const auto msg = error_of<strata::IoError>([&] { strata::train::plot_history(sample_history(), dir / "no" / "dir.svg"); });
    CHECK(has(msg, "dir.svg"));
}

// Written for tests/check_plot.py (`--writer`), which parses the files with Python's XML parser
// and compares the points with its SAMPLE; without STRATA_PLOT_SAMPLE it only writes them.
TEST_CASE("plot: python sample") {
    TempDir dir;
    const char* env = std::getenv("STRATA_PLOT_SAMPLE");
    const fs::path out = env ? fs::path(env) : dir.path;
    sample_plot().save(out / "lineplot.svg");
    strata::train::plot_history(sample_history(), out / "history.svg");
    strata::io::LinePlot log{.title = "log", .x_label = "lr", .y_label = "loss", .x_scale = strata::io::Scale::Log};
    log.add("loss", {1e-5, 1e-4, 1e-3, 1e-2, 1e-1}, {2.0, 1.0, 0.5, 0.6, 3.0});
    log.save(out / "log.svg");
    CHECK(fs::exists(out / "lineplot.svg"));
}
