#!/usr/bin/env python3
"""The compile-time benchmarks refuse bad flags at once, with exit 2 and a line saying what was
wrong, before they compile anything (a run takes minutes): benchmarks/compile_time.sh and
benchmarks/compile_opt_levels.sh, which parse their flags in compile_common.sh's
start_readme_benchmark. And benchmarks/time_trace_summary.py: on a small trace written here, each
header's own parsing time (its time less the headers it includes), the split into strata's and
the others', and the functions by optimisation time; a missing or corrupt trace is named.

  check_compile_scripts.py --root SOURCE_ROOT
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

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


def source(ts, dur, path):
    return {"ph": "X", "name": "Source", "ts": ts, "dur": dur, "args": {"detail": path}}


def check_time_trace_summary(script):
    """0 when the summary of a made-up trace is right and bad traces are named, else the failures."""
    # strata.hpp (1.0 s) includes <vector> (0.3 s) and strata/a.hpp (0.5 s), which includes
    # <string> (0.2 s): strata's own 0.2 + 0.3 = 0.5 s, the others' 0.5 s.
    trace = {"traceEvents": [
        source(0, 1_000_000, "/x/include/strata/strata.hpp"),
        source(100_000, 300_000, "/usr/include/c++/12/vector"),
        source(450_000, 500_000, "/x/include/strata/a.hpp"),
        source(500_000, 200_000, "/usr/include/c++/12/string"),
        {"ph": "X", "name": "OptFunction", "ts": 2_000_000, "dur": 40_000, "args": {"detail": "_Z4slowv"}},
        {"ph": "X", "name": "OptFunction", "ts": 2_100_000, "dur": 10_000, "args": {"detail": "_Z4fastv"}},
        {"ph": "X", "name": "Total Frontend", "ts": 0, "dur": 1_200_000},
    ]}
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        good, bad = os.path.join(d, "t.json"), os.path.join(d, "bad.json")
        with open(good, "w") as f:
            json.dump(trace, f)
        with open(bad, "w") as f:
            f.write('{"traceEvents": [{"ph": "X"')  # cut short
        p = subprocess.run([script, good, "--top", "2", "--json", os.path.join(d, "s.json")],
                           capture_output=True, text=True, timeout=30)
        want = ("strata's headers 0.50 s, others 0.50 s", "0.300 s  strata/a.hpp", "0.200 s  strata/strata.hpp",
                "1.20 s", "0.040 s  _Z4slowv")
        missing = [w for w in want if w not in p.stdout]
        if p.returncode != 0 or missing or p.stdout.index("_Z4slowv") > p.stdout.index("_Z4fastv"):
            print(f"time_trace_summary.py on a made-up trace: exit {p.returncode}, missing {missing}: {p.stdout!r} {p.stderr!r}")
            failures += 1
        for path in (bad, os.path.join(d, "none.json")):
            p = subprocess.run([script, path], capture_output=True, text=True, timeout=30)
            if p.returncode == 0 or "is not a clang -ftime-trace file" not in p.stderr or "Traceback" in p.stderr:
                print(f"time_trace_summary.py {path}: expected a named error, got exit {p.returncode}: {p.stderr[-300:]!r}")
                failures += 1
    return failures


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
    failures += check_time_trace_summary(os.path.join(root, "benchmarks/time_trace_summary.py"))
    if failures:
        return 1
    print(f"{len(SCRIPTS)} scripts x {len(CASES)} bad flag sets: each refused with exit 2 and its reason; "
          "time_trace_summary.py's sums and errors as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
