#!/usr/bin/env python3
"""Checks that strata's compiled parts cannot drift from the headers (strata/config.hpp).

Each header lists the instantiations it leaves to a compiled part once, in a block that is their
`extern template` declarations in a program and their definitions in the part's source. A
declaration whose definition is missing only shows as a link error in a program that happens to
use it, so this checks the structure instead:
  - every header with non-template code (`#if STRATA_DEFINITIONS` / `STRATA_MPI_DEFINITIONS`) or
    a list (`#if STRATA_INSTANCES` / `STRATA_MPI_INSTANCES` / `STRATA_CUDA_INSTANCES`) is
    included by its part's source (src/strata.cpp, src/strata_mpi.cpp, src/strata_cuda.cu);
  - every such source defines its building macro before its first include;
  - no header writes `extern template` itself (it would have no definition), and every
    STRATA_TEMPLATE / STRATA_MPI_TEMPLATE / STRATA_CUDA_TEMPLATE line is inside its own block.
Exits 1 with one line per problem, 2 when --root is not a strata checkout.
    tests/check_compiled_parts.py [--root DIR]
"""
import argparse
import pathlib
import re
import sys

PARTS = {
    # block macros -> (source, building macro, template macro)
    "host": (("STRATA_DEFINITIONS", "STRATA_INSTANCES"), "src/strata.cpp", "STRATA_BUILDING_COMPILED_PART", "STRATA_TEMPLATE"),
    "mpi": (("STRATA_MPI_DEFINITIONS", "STRATA_MPI_INSTANCES"), "src/strata_mpi.cpp", "STRATA_BUILDING_MPI_PART", "STRATA_MPI_TEMPLATE"),
    "cuda": (("STRATA_CUDA_INSTANCES",), "src/strata_cuda.cu", "STRATA_BUILDING_CUDA_PART", "STRATA_CUDA_TEMPLATE"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    root = pathlib.Path(ap.parse_args().root)
    include = root / "include"
    missing = [str(p) for p in [include / "strata" / "config.hpp"] + [root / v[1] for v in PARTS.values()] if not p.is_file()]
    if missing:
        print(f"check_compiled_parts: --root {root} is not a strata checkout: missing {', '.join(missing)}")
        return 2
    headers = sorted(include.rglob("*.hpp"))
    problems = []
    for name, (blocks, source, building, template) in PARTS.items():
        src_text = (root / source).read_text()
        included = set(re.findall(r'^#include "([^"]+)"', src_text, re.M))
        first_include = re.search(r"^#include ", src_text, re.M)
        define = re.search(rf"^#define {building}\b", src_text, re.M)
        if not define or (first_include and define.start() > first_include.start()):
            problems.append(f"{source}: #define {building} must come before its first #include")
        for h in headers:
            rel = h.relative_to(include).as_posix()
            text = h.read_text()
            if any(re.search(rf"^#if {b}$", text, re.M) for b in blocks) and rel not in included:
                problems.append(f"{source}: does not include {rel}, which has a block of the {name} part "
                                f"({' / '.join(blocks)}): its definitions would be missing from the library")
    for h in headers:
        rel = h.relative_to(include).as_posix()
        if rel == "strata/config.hpp":
            continue
        open_block = []
        for n, line in enumerate(h.read_text().splitlines(), 1):
            stripped = line.strip()
            if re.match(r"extern\s+template\b", stripped):
                problems.append(f"{rel}:{n}: `extern template` written by hand; list it in the header's "
                                "STRATA_INSTANCES block as STRATA_TEMPLATE (strata/config.hpp)")
            if stripped.startswith("#if"):
                m = re.match(r"#if (STRATA_(?:MPI_|CUDA_)?INSTANCES)$", stripped)
                open_block.append(m.group(1) if m else None)
            elif stripped.startswith("#endif"):
                if open_block:
                    open_block.pop()
            for _, (blocks, _, _, template) in PARTS.items():
                if re.match(rf"{template}\b", stripped):
                    want = blocks[-1]
                    if want not in open_block:
                        problems.append(f"{rel}:{n}: {template} outside an `#if {want}` block")
    for p in problems:
        print(p)
    if not problems:
        print(f"check_compiled_parts: {len(headers)} headers, the three compiled parts complete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
