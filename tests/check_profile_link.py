#!/usr/bin/env python3
"""A unit compiled with STRATA_PROFILE=1 does not link with a libstrata built without it, and the
linker names the setting (strata/core/profile.hpp); the same unit with STRATA_PROFILE=0 links and
runs (the negative control).

  check_profile_link.py --cxx 'c++ ...' --source tests/profile_link.cpp --lib libstrata.a
                        [--cflag F]... [--ldflag F]...
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile


def build(a, setting, out):
    cmd = shlex.split(a.cxx) + a.cflag + ["-O0", "-DSTRATA_SEPARATE_COMPILATION", f"-DSTRATA_PROFILE={setting}",
                                         a.source, a.lib, "-o", out] + a.ldflag
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cxx", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--lib", required=True)
    p.add_argument("--cflag", action="append", default=[])
    p.add_argument("--ldflag", action="append", default=[])
    a = p.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as d:
        good = build(a, 0, os.path.join(d, "off"))
        if good.returncode != 0:
            failures.append(f"STRATA_PROFILE=0 with libstrata built without it: did not link:\n{good.stderr[-3000:]}")
        else:
            r = subprocess.run([os.path.join(d, "off")])
            if r.returncode != 0:
                failures.append(f"STRATA_PROFILE=0: the program says the probes are on (exit {r.returncode})")
        bad = build(a, 1, os.path.join(d, "on"))
        says = "compiled_part_built_with_STRATA_PROFILE_1"
        if bad.returncode == 0:
            failures.append("STRATA_PROFILE=1 linked with a libstrata built without it")
        elif says not in bad.stderr:
            failures.append(f"STRATA_PROFILE=1: the link failed without naming the setting ({says}):\n{bad.stderr[-3000:]}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok: STRATA_PROFILE=0 links and runs; STRATA_PROFILE=1 is refused by the linker, naming the setting")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
