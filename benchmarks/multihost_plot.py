#!/usr/bin/env python3
"""The all-reduce across emulated hosts as a picture: one panel per link, time of one all-reduce
against the buffer's size (both axes logarithmic), one line per implementation, from
bench_mpi_allreduce's JSON of runs under scripts/multihost (docs/benchmarks.md, "Across emulated
hosts: gradient sizes up to 64 MiB").

  multihost_plot.py --run 1gbit=mpi_1gbit.json --run 10gbit=mpi_10gbit.json --plot FILE.svg

Each --run is LABEL=FILE: the panel's title and the JSON that
`scripts/multihost ... -- bench_mpi_allreduce --json FILE` wrote. A dotted line in each panel is
what the link alone allows the hierarchical transport: its leaders' all-reduce moves
2(H-1)/H x S bytes each way over a host's link, here S (2 hosts), at the panel's rate (taken
from its label, such as 1gbit). Standard library only; prints the figures it drew as a table.
"""
import argparse
import json
import math
import os
import re
import sys

COLORS = {"MPI_Allreduce": "#7f7f7f", "strata mpi": "#1f77b4", "strata hier": "#d62728", "strata shm": "#2ca02c"}
RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
SCALE = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def link_seconds(label, size_bytes, hosts=2):
    m = RATE.match(label)
    if not m:
        return None
    bits_per_second = float(m.group(1)) * SCALE[m.group(2)]
    return 2 * (hosts - 1) / hosts * size_bytes * 8 / bits_per_second


def panel(x0, w, h, label, rows, lo, hi):
    m = 54
    sizes = sorted({r["mib"] for r in rows})
    sx0, sx1 = math.log10(min(sizes)), math.log10(max(sizes))
    px = lambda mib: x0 + m + (math.log10(mib) - sx0) * (w - 1.5 * m) / max(1e-9, sx1 - sx0)  # noqa: E731
    py = lambda ms: h - m - (math.log10(ms) - lo) * (h - 1.8 * m) / (hi - lo)  # noqa: E731
    out = [f'<text x="{x0 + w / 2}" y="18" text-anchor="middle" font-size="13">{label} links: one all-reduce, 4 ranks on 2 hosts</text>',
           f'<line x1="{x0 + m}" y1="{h - m}" x2="{x0 + w - m / 2}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{x0 + m}" y1="{h - m}" x2="{x0 + m}" y2="{0.8 * m}" stroke="black"/>',
           f'<text x="{x0 + w / 2}" y="{h - 12}" text-anchor="middle" font-size="11">buffer (MiB)</text>',
           f'<text x="{x0 + 14}" y="{h / 2}" text-anchor="middle" font-size="11" transform="rotate(-90 {x0 + 14} {h / 2})">ms</text>']
    for mib in sizes:
        out.append(f'<text x="{px(mib):.1f}" y="{h - m + 14}" text-anchor="middle" font-size="10">{mib:g}</text>')
    for k in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= k <= hi:
            out.append(f'<text x="{x0 + m - 4}" y="{py(10 ** k) + 4:.1f}" text-anchor="end" font-size="10">{10 ** k:g}</text>')
    algorithms = [a for a in COLORS if any(r["algorithm"] == a for r in rows)]
    for i, a in enumerate(algorithms):
        pts = sorted((r["mib"], r["seconds"] * 1e3) for r in rows if r["algorithm"] == a)
        poly = " ".join(f"{px(s):.1f},{py(t):.1f}" for s, t in pts)
        out.append(f'<g class="series" data-name="{a}"><polyline points="{poly}" fill="none" stroke="{COLORS[a]}" stroke-width="2"/>')
        out += [f'<circle cx="{px(s):.1f}" cy="{py(t):.1f}" r="3" fill="{COLORS[a]}"/>' for s, t in pts]
        out.append("</g>")
        out.append(f'<text x="{x0 + m + 8}" y="{0.8 * m + 12 + 14 * i}" font-size="11" fill="{COLORS[a]}">{a}</text>')
    bound = [(s, link_seconds(label, s * 2**20) * 1e3) for s in sizes if link_seconds(label, s * 2**20)]
    if bound:
        poly = " ".join(f"{px(s):.1f},{py(t):.1f}" for s, t in bound)
        out.append(f'<polyline points="{poly}" fill="none" stroke="#d62728" stroke-dasharray="2,3"/>')
        out.append(f'<text x="{x0 + m + 8}" y="{0.8 * m + 12 + 14 * len(algorithms)}" font-size="11" fill="#d62728">'
                   f'S over one {label} link (dotted)</text>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=FILE (bench_mpi_allreduce --json)")
    ap.add_argument("--plot", required=True)
    a = ap.parse_args()
    runs = []
    for item in a.run:
        label, eq, path = item.partition("=")
        if not eq:
            ap.error(f"--run: expected LABEL=FILE, found {item!r}")
        with open(path) as f:
            runs.append((label, json.load(f)["rows"]))
    times = [r["seconds"] * 1e3 for _, rows in runs for r in rows if r["seconds"] > 0]
    lo, hi = math.floor(math.log10(min(times))), math.ceil(math.log10(max(times)))
    w, h = 420, 320
    body = []
    for i, (label, rows) in enumerate(runs):
        body += panel(i * w, w, h, label, rows, lo, hi)
        for r in sorted(rows, key=lambda r: (r["mib"], r["algorithm"])):
            print(f"{label:>7} {r['mib']:>6g} MiB {r['algorithm']:<14} {r['seconds'] * 1e3:10.2f} ms")
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(runs)}" height="{h}" font-family="sans-serif">',
           f'<rect width="{w * len(runs)}" height="{h}" fill="white"/>'] + body + ["</svg>"]
    with open(a.plot + ".tmp", "w") as f:
        f.write("\n".join(svg) + "\n")
    os.replace(a.plot + ".tmp", a.plot)
    print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
