#!/usr/bin/env python3
"""Checks that the test units sharing a precompiled header are compiled with its flags.

tests/meson.build ("One precompiled header") compiles tests/pch/strata_tests.hpp once for each
group of test units built alike, as the precompiled header of a library of one empty unit, and
the group's units take it with -include. GCC refuses a .gch whose macros differ
(-Werror=invalid-pch makes that an error), but it accepts one compiled at another -O level or
with another -ffp-contract, and the header's inline code would then be compiled under options
the unit did not ask for. This compares the flags themselves, from the build's
compile_commands.json: every unit that takes a group's header must have exactly the flags the
header was compiled with, apart from include folders, the outputs and the precompiled header's
own switches. A negative control first: a unit's flags with one option changed must be found.
Exits 1 naming each unit and the flags that differ, 2 when the build folder has no such groups.
    tests/check_test_pch.py --build BUILD_DIR
"""
import argparse
import json
import pathlib
import shlex
import sys

HEADER = "strata_tests.hpp"
# The unit's own switches for taking the header (and Meson's for its library's one unit).
TAKING = {"-Werror=invalid-pch", "-fpch-deps", "-fpch-preprocess"}
WITH_VALUE = {"-o", "-MQ", "-MF", "-MT", "-c"}


def split(command):
    """(flags that must match, include folders) of one compile command."""
    args = shlex.split(command)[1:]
    flags, dirs = [], []
    i = 0
    while i < len(args):
        a = args[i]
        if a in WITH_VALUE:
            i += 2
            continue
        if a == "-include" and i + 1 < len(args) and args[i + 1] == HEADER:
            i += 2
            continue
        if a.startswith("-I"):
            dirs.append(a[2:])
        elif a not in TAKING and a != "-MD" and not (a.endswith((".cpp", ".hpp")) and not a.startswith("-")):
            flags.append(a)
        i += 1
    return flags, dirs


def difference(want, got):
    """The flags one list has and the other lacks, in words ('' when equal, order included)."""
    if want == got:
        return ""
    only_want = [f for f in want if f not in got]
    only_got = [f for f in got if f not in want]
    if not only_want and not only_got:
        return f"the same flags in another order: header {' '.join(want)}; unit {' '.join(got)}"
    return f"the header has {' '.join(only_want) or 'nothing more'}; the unit has {' '.join(only_got) or 'nothing more'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    build = pathlib.Path(ap.parse_args().build).resolve()
    try:
        entries = json.loads((build / "compile_commands.json").read_text())
    except (OSError, ValueError) as e:
        print(f"check_test_pch: cannot read {build}/compile_commands.json: {e}")
        return 2
    # The groups: each compile of the header, by the folder its .gch is written to.
    headers = {}
    for e in entries:
        args = shlex.split(e["command"])
        if "-o" in args and args[args.index("-o") + 1].endswith(HEADER + ".gch"):
            out = args[args.index("-o") + 1]
            folder = (pathlib.Path(e.get("directory", build)) / out).parent.resolve()
            headers[folder] = split(e["command"])[0]
    if not headers:
        print(f"check_test_pch: no compile of {HEADER} in {build}/compile_commands.json (tests off?)")
        return 2
    units = {folder: [] for folder in headers}
    for e in entries:
        args = shlex.split(e["command"])
        if e["file"].endswith(".hpp") or "-include" not in args:
            continue
        if args[args.index("-include") + 1] != HEADER:
            continue
        flags, dirs = split(e["command"])
        base = pathlib.Path(e.get("directory", build))
        taken = [d for d in (((base / d).resolve()) for d in dirs) if d in headers]
        if not taken:
            print(f"FAIL {e['file']}: takes {HEADER} but names no folder holding its .gch")
            return 1
        units[taken[0]].append((e["file"], flags))

    # The negative control: one unit's flags with its -O level changed must be told apart.
    folder, group = next((f, u) for f, u in units.items() if u)
    control = ["-O3" if f.startswith("-O") else f for f in group[0][1]]
    if control == headers[folder]:
        control = control + ["-ffp-contract=fast"]
    if not difference(headers[folder], control):
        print("FAIL: the comparison did not see a changed option (negative control)")
        return 1

    failed = 0
    for folder, members in sorted(units.items()):
        name = folder.name
        bad = [(f, difference(headers[folder], flags)) for f, flags in members]
        bad = [(f, d) for f, d in bad if d]
        print(f"{name}: {len(members)} unit(s) take the header; flags equal for {len(members) - len(bad)}")
        for f, d in bad:
            print(f"  FAIL {f}: {d}")
        failed += len(bad)
        if len(members) < 2:
            print(f"  FAIL: a precompiled header shared by {len(members)} unit(s) saves nothing")
            failed += 1
    print("the negative control (one option changed) was told apart")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
