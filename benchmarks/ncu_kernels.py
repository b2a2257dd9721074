#!/usr/bin/env python3
"""Per-kernel GPU time of a program, from Nsight Compute's CSV (issue 18: where a step goes).

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        build/benchmarks/gpu_cnn --batch-size 128 --warmup 3 --steps 2 --reps 1 > ncu.csv
    python3 benchmarks/ncu_kernels.py ncu.csv --steps 5 [--top 30] [--json FILE]

Groups the kernels by name and prints, largest first: the calls per step, microseconds per step
and per call, and the share of the profiled GPU time. --steps is the number of training steps the
profiled run took (warm-up + timed), so that "per step" divides the totals by it. Kernel names are
shortened for the table (template arguments elided past --width characters); the JSON keeps them
whole. ncu serialises the kernels and times each alone, so the sum is the GPU time of a step
without overlap or launch gaps: a floor for the step, not its wall time.
"""
import argparse
import csv
import io
import json
import sys


def read_rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    # ncu prints its own lines ("==PROF== ...") before the CSV; the CSV starts at the header.
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"ncu_kernels: no CSV header (\"ID\", ...) in {path}: was ncu run with --csv?")
    rows = []
    for r in csv.DictReader(io.StringIO(text[start:])):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "")
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
                 "second": 1e6}.get(unit)
        if scale is None:
            sys.exit(f"ncu_kernels: unknown unit {unit!r} for gpu__time_duration.sum")
        rows.append((r["Kernel Name"], value * scale, r.get("Grid Size", ""), r.get("Block Size", "")))
    if not rows:
        sys.exit(f"ncu_kernels: no gpu__time_duration.sum rows in {path}")
    return rows


def shorten(name, width):
    if len(name) <= width:
        return name
    return name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, required=True, help="training steps in the profiled run")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--width", type=int, default=110)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("ncu_kernels: --steps must be >= 1")
    groups = {}
    for name, us, grid, block in read_rows(a.csv):
        g = groups.setdefault(name, {"name": name, "calls": 0, "us": 0.0, "grids": set(), "blocks": set()})
        g["calls"] += 1
        g["us"] += us
        g["grids"].add(grid)
        g["blocks"].add(block)
    total = sum(g["us"] for g in groups.values())
    ordered = sorted(groups.values(), key=lambda g: -g["us"])
    print(f"{len(groups)} kernels, {sum(g['calls'] for g in ordered)} launches, "
          f"{total / a.steps:.1f} us of GPU time per step ({a.steps} steps profiled)")
    print(f"{'calls/step':>10} {'us/step':>9} {'us/call':>9} {'share':>6}  kernel (grid; block)")
    for g in ordered[: a.top]:
        grid = ",".join(sorted(g["grids"]))[:40]
        block = ",".join(sorted(g["blocks"]))[:20]
        print(f"{g['calls'] / a.steps:10.1f} {g['us'] / a.steps:9.1f} {g['us'] / g['calls']:9.2f} "
              f"{100 * g['us'] / total:5.1f}%  {shorten(g['name'], a.width)} ({grid}; {block})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "total_us_per_step": total / a.steps,
                       "kernels": [{"name": g["name"], "calls_per_step": g["calls"] / a.steps,
                                    "us_per_step": g["us"] / a.steps, "us_per_call": g["us"] / g["calls"],
                                    "grids": sorted(g["grids"]), "blocks": sorted(g["blocks"])} for g in ordered]},
                      f, indent=1)


if __name__ == "__main__":
    main()
