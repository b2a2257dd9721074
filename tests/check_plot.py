#!/usr/bin/env python3
"""Independent check of strata's SVG plots (strata/io/svg_plot.hpp) with Python's XML parser.

  check_plot.py FILE.svg...      parse each file and print its series and points
  check_plot.py --writer EXE     run the doctest binary EXE's test case "plot: python sample"
                                 with STRATA_PLOT_SAMPLE set to a directory, then check the three
                                 files it wrote against SAMPLE below
  check_plot.py --series NAME... FILE.svg
                                 check that FILE.svg is an SVG holding a series of each NAME,
                                 each with at least one point (used on mnist_cnn --plot)

What is checked: the file is well-formed XML whose root is an SVG element; each series group
holds exactly the finite points of the sample (NaN ones left out), in order, with their exact
values; the pixel positions are an increasing affine map of the values (log10 of x on a log axis)
shared by all series of a plot, with y growing upwards; the legend names every series; the title
is there, unescaped. Exit status 0 when all checks pass, 1 with a message otherwise.
"""
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
NAN = float("nan")

# What the C++ test case "plot: python sample" writes (tests/test_plot.cpp).
SAMPLE = {
    "lineplot.svg": [{
        "title": 'Accuracy <vs> time & "modes"', "log_x": False,
        "series": {"mirrored": ([1, 2, 3, 4], [0.5, 0.7, 0.8, 0.85]),
                   "parameter server": ([1.5, 2.5, 3.5, 4.5, 5.5], [0.4, NAN, 0.75, 0.8, 0.9])},
    }],
    "history.svg": [
        {"title": "loss", "log_x": False,
         "series": {"train loss": ([1, 2, 3], [0.9, 0.5, 0.3]), "validation loss": ([1, 2, 3], [0.6, 0.45, 0.4])}},
        {"title": "accuracy", "log_x": False,
         "series": {"train accuracy": ([1, 2, 3], [0.7, 0.85, 0.9]),
                    "validation accuracy": ([1, 2, 3], [0.8, 0.86, 0.88])}},
    ],
    "log.svg": [{
        "title": "log", "log_x": True,
        "series": {"loss": ([1e-5, 1e-4, 1e-3, 1e-2, 1e-1], [2.0, 1.0, 0.5, 0.6, 3.0])},
    }],
}


class PlotError(Exception):
    pass


def read_plots(path):
    """[(title, {series name: [(x, y, cx, cy), ...]}, legend names)] for each plot in the file."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise PlotError(f"{path}: not well-formed XML: {e}")
    if root.tag != SVG + "svg":
        raise PlotError(f"{path}: the root element is {root.tag}, expected an SVG <svg>")
    plots = []
    for g in root.iter(SVG + "g"):
        if g.get("class") != "plot":
            continue
        title = None
        for t in g.findall(SVG + "text"):
            if t.get("class") == "title":
                title = t.text
        series = {}
        for s in g.findall(SVG + "g"):
            if s.get("class") != "series":
                continue
            points = []
            for c in s.findall(SVG + "circle"):
                points.append((float(c.get("data-x")), float(c.get("data-y")), float(c.get("cx")), float(c.get("cy"))))
            series[s.get("data-name")] = points
        legend = []
        for lg in g.findall(SVG + "g"):
            if lg.get("class") == "legend":
                legend = [t.text for t in lg.findall(SVG + "text")]
        plots.append((title, series, legend))
    if not plots:
        raise PlotError(f"{path}: no <g class=\"plot\"> in the SVG")
    return plots


def check_affine(path, points, log_x):
    """Pixels must be one increasing affine map of the values, for every series of a plot."""
    if len(points) < 2:
        return
    def fit(pairs, what):
        (v0, p0), (v1, p1) = min(pairs), max(pairs)
        if v1 == v0:
            return
        slope = (p1 - p0) / (v1 - v0)
        if what == "x" and slope <= 0:
            raise PlotError(f"{path}: x pixels do not grow with x")
        if what == "y" and slope >= 0:
            raise PlotError(f"{path}: y pixels do not go up as y grows")
        for v, p in pairs:
            want = p0 + slope * (v - v0)
            if abs(p - want) > 0.02 + 1e-9 * abs(want):  # pixels are written with two decimals
                raise PlotError(f"{path}: point {what} = {v} at pixel {p}, expected {want:.2f} (not one affine map)")
    fit([((math.log10(x) if log_x else x), cx) for x, y, cx, cy in points], "x")
    fit([(y, cy) for x, y, cx, cy in points], "y")


def check_sample(directory):
    for name, expected_plots in SAMPLE.items():
        path = os.path.join(directory, name)
        plots = read_plots(path)
        if len(plots) != len(expected_plots):
            raise PlotError(f"{path}: {len(plots)} plots, expected {len(expected_plots)}")
        for (title, series, legend), want in zip(plots, expected_plots):
            if title != want["title"]:
                raise PlotError(f"{path}: title {title!r}, expected {want['title']!r}")
            if sorted(series) != sorted(want["series"]):
                raise PlotError(f"{path}: series {sorted(series)}, expected {sorted(want['series'])}")
            if sorted(legend) != sorted(want["series"]):
                raise PlotError(f"{path}: legend {legend}, expected the series' names")
            every = []
            for sname, (xs, ys) in want["series"].items():
                finite = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
                got = [(x, y) for x, y, _, _ in series[sname]]
                if got != finite:
                    raise PlotError(f"{path}: series {sname!r} holds {got}, expected {finite}")
                every += series[sname]
            check_affine(path, every, want["log_x"])
        print(f"{path}: {len(plots)} plot(s) as expected")


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "--writer":
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, STRATA_PLOT_SAMPLE=d)
                run = subprocess.run([argv[2], "--test-case=plot: python sample"], env=env, capture_output=True, text=True)
                if run.returncode != 0:
                    raise PlotError(f"{argv[2]} did not write the sample (exit status {run.returncode})\n{run.stdout}")
                check_sample(d)
            return 0
        if len(argv) >= 4 and argv[1] == "--series":
            path, names = argv[-1], argv[2:-1]
            series = {}
            for _, s, _ in read_plots(path):
                series.update(s)
            for n in names:
                if not series.get(n):
                    raise PlotError(f"{path}: no points for series {n!r} (has {sorted(series)})")
            print(f"{path}: series {', '.join(names)} present")
            return 0
        if len(argv) < 2 or argv[1].startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        for path in argv[1:]:
            for title, series, _ in read_plots(path):
                print(f"{path}: {title}")
                for n, pts in series.items():
                    print(f"  {n}: {[(x, y) for x, y, _, _ in pts]}")
        return 0
    except PlotError as e:
        print(f"check_plot: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
