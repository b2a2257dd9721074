#!/usr/bin/env python3
"""No header of strata is half of an include loop: the graph of `#include "strata/..."` lines
among include/strata's files has no cycle. The one pattern left out is the separate-compilation
one: an `impl/X.ipp` that includes its own header (strata/.../X.hpp, or the strategy header its
definitions belong to, X_strategy.hpp), which that header includes back only under
STRATA_DEFINITIONS, so that src/*.cpp can compile the .ipp alone.

A strategy header brings its gradient path by including it at its end; the path includes the
strategy's classes (X_strategy.hpp, or for strategy.hpp's own strategies, nothing of
strategy.hpp), never the header that includes it.

  check_include_loops.py INCLUDE_DIR

Exit 0 without a loop; 1 with every loop found, each printed as a -> b -> ... -> a.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"(strata/[^"]+)"', re.M)


def stem(path):
    return os.path.basename(path).rsplit(".", 1)[0]


def graph(include_dir):
    g = {}
    for d, _, files in os.walk(include_dir):
        for f in files:
            if not f.endswith((".hpp", ".ipp", ".cuh", ".h")):
                continue
            path = os.path.relpath(os.path.join(d, f), include_dir).replace(os.sep, "/")
            with open(os.path.join(d, f), encoding="utf-8") as fh:
                edges = INCLUDE.findall(fh.read())
            if path.endswith(".ipp"):  # an .ipp's own header: the separate-compilation pattern
                edges = [e for e in edges if stem(e) not in (stem(path), stem(path) + "_strategy")]
            g[path] = edges
    return g


def cycles(g):
    found = set()

    def visit(node, stack, on_stack, seen):
        for nxt in g.get(node, []):
            if nxt in on_stack:
                c = stack[stack.index(nxt):]
                k = min(range(len(c)), key=lambda i: c[i])
                found.add(tuple(c[k:] + c[:k]))
            elif nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
                on_stack.add(nxt)
                visit(nxt, stack, on_stack, seen)
                stack.pop()
                on_stack.discard(nxt)

    for n in g:
        visit(n, [n], {n}, {n})
    return sorted(found, key=lambda c: (len(c), c))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    g = graph(sys.argv[1])
    if not g:
        print(f"no headers under {sys.argv[1]}")
        return 1
    loops = cycles(g)
    for c in loops:
        print("include loop: " + " -> ".join(c + (c[0],)))
    print(f"{len(g)} files, {sum(len(e) for e in g.values())} includes among them, {len(loops)} loop(s)")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
