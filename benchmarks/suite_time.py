#!/usr/bin/env python3
"""Where the test suite's minutes went: a table of every test of a build folder's last
`meson test` run (its meson-logs/testlog.json) by duration, and of the build's slowest outputs
(its .ninja_log), as markdown (docs/benchmarks.md, "The test suite's time") or JSON.

  benchmarks/suite_time.py BUILD_DIR [--top N] [--json FILE]

scripts/test prints the short form of the same (the ten slowest tests, the build's wall time
and its five slowest outputs) at the end of every run. Standard library only.
"""
import argparse
import json
import os
import sys


def tests_of(build):
    path = os.path.join(build, "meson-logs", "testlog.json")
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        sys.exit(f"suite_time.py: no test log in {build} ({e.strerror}): run meson test or scripts/test there first")
    # scripts/test runs the suite 'alone' in a lane of its own, logged apart (alone.json). A later
    # plain `meson test` of everything logs those tests in testlog.json too: the lane's log is
    # then an older run's, and left out.
    lane = os.path.join(build, "meson-logs", "alone.json")
    if os.path.exists(lane):
        lane_lines = open(lane).read().splitlines()
        names = {json.loads(l).get("name") for l in lines if l.strip()}
        if not any(json.loads(l).get("name") in names for l in lane_lines if l.strip()):
            lines += lane_lines
    # Whether a test runs beside others is the build's (meson-info), not the log's.
    parallel = {}
    try:
        for t in json.load(open(os.path.join(build, "meson-info", "intro-tests.json"))):
            # "lane": the suite 'alone', which scripts/test runs one at a time beside the rest
            lane = any(s.split(":")[-1] == "alone" for s in t.get("suite", []))
            parallel[t["name"]] = "lane" if lane else bool(t.get("is_parallel", True))
    except (OSError, ValueError):
        pass
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            t = json.loads(line)
            rows.append({"name": t["name"], "result": t["result"], "seconds": float(t.get("duration") or 0.0),
                         "parallel": parallel.get(t["name"].split(" / ")[-1], True)})
        except (ValueError, KeyError) as e:
            sys.exit(f"suite_time.py: {path}:{n}: not a meson test record ({e})")
    return rows


def outputs_of(build):
    """{output: seconds} of the latest build of each output in .ninja_log (absent: {})."""
    out = {}
    try:
        for line in open(os.path.join(build, ".ninja_log")):
            if line.startswith("#"):
                continue
            f = line.rstrip("\n").split("\t")
            if len(f) == 5:
                out[f[3]] = (int(f[1]) - int(f[0])) / 1000
    except OSError:
        pass
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--top", type=int, default=15, help="rows of each table (default 15; 0: all)")
    p.add_argument("--json", default="", help="also write the figures as JSON to this file")
    a = p.parse_args()
    if a.top < 0:
        p.error("--top must be >= 0")
    tests = sorted(tests_of(a.build), key=lambda t: -t["seconds"])
    outs = sorted(outputs_of(a.build).items(), key=lambda kv: -kv[1])
    top = (lambda xs: xs[:a.top]) if a.top else (lambda xs: xs)
    print(f"| test | seconds | result | runs beside others |\n|---|---:|---|---|")
    for t in top(tests):
        beside = {"lane": "in its own lane", True: "yes", False: "no"}[t["parallel"]]
        print(f"| `{t['name'].split(' / ')[-1]}` | {t['seconds']:.1f} | {t['result']} | {beside} |")
    alone = sum(t["seconds"] for t in tests if t["parallel"] is False)
    lane = sum(t["seconds"] for t in tests if t["parallel"] == "lane")
    print(f"\n{len(tests)} tests, {sum(t['seconds'] for t in tests):.0f} s one after the other; "
          f"{alone:.0f} s of it in other tests that run alone (is_parallel: false), {lane:.0f} s in the suite 'alone' "
          "(scripts/test: one at a time, beside the rest).\n")
    if outs:
        print(f"| build output | compiler seconds |\n|---|---:|")
        for o, s in top(outs):
            print(f"| `{o}` | {s:.1f} |")
        print(f"\n{len(outs)} outputs, {sum(s for _, s in outs):.0f} s of compiler time.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tests": tests, "outputs": [{"output": o, "seconds": s} for o, s in outs]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
