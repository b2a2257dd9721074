#!/usr/bin/env python3
"""Where a unit's compile time goes, from clang's -ftime-trace: the front end's parsing split by
header (each header's own time, without the headers it includes), strata's against the system's,
and the functions that took longest to optimise. Used in docs/benchmarks.md to show that no one
header or function is the lever.

  clang++ $FLAGS -ftime-trace -ftime-trace-granularity=5 -c unit.cpp -o unit.o   # writes unit.json
  benchmarks/time_trace_summary.py unit.json [--top 10] [--json FILE]
"""
import argparse
import collections
import json
import sys


def header_name(path):
    """The path from its include root: strata/..., c++/12/..., or the file name."""
    for root in ("include/", "/cccl/"):  # "include/" also matches a relative -Iinclude
        if path.startswith(root) or "/" + root.lstrip("/") in path:
            return path.rsplit(root, 1)[1]
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="the .json clang's -ftime-trace wrote beside the object")
    ap.add_argument("--top", type=int, default=10, help="how many headers and functions to list")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    try:
        events = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X"]
        for e in events:  # the fields read below
            float(e["ts"]), float(e["dur"]), str(e["name"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        sys.exit(f"time_trace_summary.py: {a.trace} is not a clang -ftime-trace file: {e}")
    totals = {e["name"]: e["dur"] / 1e6 for e in events if e["name"].startswith("Total ")}
    # Each header's own parsing time: its Source event less the Source events nested in it.
    sources = sorted((e for e in events if e["name"] == "Source"), key=lambda e: (e["ts"], -e["dur"]))
    own, stack = collections.Counter(), []
    for e in sources:
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        name = header_name(e.get("args", {}).get("detail", "?"))
        own[name] += e["dur"] / 1e6
        if stack:
            own[header_name(stack[-1].get("args", {}).get("detail", "?"))] -= e["dur"] / 1e6
        stack.append(e)
    strata = sum(v for k, v in own.items() if k.startswith("strata/"))
    system = sum(own.values()) - strata
    optimise = collections.Counter()
    for e in events:
        if e["name"] == "OptFunction":
            optimise[e.get("args", {}).get("detail", "?")] += e["dur"] / 1e6
    print(f"{'front end':<40} {totals.get('Total Frontend', 0):7.2f} s")
    print(f"{'back end':<40} {totals.get('Total Backend', 0):7.2f} s")
    print(f"{'parsing (Source)':<40} {sum(own.values()):7.2f} s: strata's headers {strata:.2f} s, others {system:.2f} s")
    print(f"the {a.top} strata headers with the most parsing of their own:")
    top_headers = [(k, v) for k, v in own.most_common() if k.startswith("strata/")][:a.top]
    for k, v in top_headers:
        print(f"  {v:6.3f} s  {k}")
    print(f"the {a.top} functions longest to optimise (of {len(optimise)}; {sum(optimise.values()):.2f} s in all):")
    top_functions = optimise.most_common(a.top)
    for k, v in top_functions:
        print(f"  {v:6.3f} s  {k[:120]}")  # mangled names: pipe through c++filt to read them
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "time_trace_summary", "trace": a.trace, "totals_seconds": totals,
                       "parsing_seconds": {"strata": round(strata, 3), "other": round(system, 3)},
                       "strata_headers_own_seconds": dict(top_headers),
                       "functions_optimise_seconds": dict(top_functions)}, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
