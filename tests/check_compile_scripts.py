#!/usr/bin/env python3
"""The compile-time benchmarks refuse bad flags at once, with exit 2 and a line saying what was
wrong, before they compile anything (a run takes minutes): benchmarks/compile_time.sh and
benchmarks/compile_opt_levels.sh, which parse their flags in compile_common.sh's
start_readme_benchmark.

  check_compile_scripts.py --root SOURCE_ROOT
"""
import argparse
import os
import signal
import subprocess
import sys

SCRIPTS = ("benchmarks/compile_time.sh", "benchmarks/compile_opt_levels.sh")
# (arguments, text the error must hold)
CASES = (
    (["--bogus"], "usage: "),
    (["--reps"], "usage: "),                         # a flag without its value
    (["--json"], "usage: "),
    (["--reps", "0"], "--reps expects an integer in [1, 999], got '0'"),
    (["--reps", "x1"], "--reps expects an integer in [1, 999], got 'x1'"),
    (["--reps", "1000"], "--reps expects an integer in [1, 999], got '1000'"),
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    root = ap.parse_args().root
    failures = 0
    for script in SCRIPTS:
        path = os.path.join(root, script)
        for args, expected in CASES:
            p = subprocess.Popen([path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)  # its own group: a compiler it started goes too
            try:
                out, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                print(f"{script} {' '.join(args)}: still running after 20 s (it took the flags and started measuring)")
                failures += 1
                continue
            if p.returncode != 2 or expected not in err or out:
                print(f"{script} {' '.join(args)}: expected exit 2 and {expected!r} on stderr, nothing on stdout; "
                      f"got exit {p.returncode}, stderr {err[-300:]!r}, stdout {out[-300:]!r}")
                failures += 1
    if failures:
        return 1
    print(f"{len(SCRIPTS)} scripts x {len(CASES)} bad flag sets: each refused with exit 2 and its reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
