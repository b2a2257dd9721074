#!/usr/bin/env python3
"""How often a stopped rank's survivors name a live rank too (docs/multihost.md, issue 46).

Runs the fault of tests/check_multi_worker.py ("multi_worker stall (mpi transport)") N times
with each mnist_cnn given: 3 processes, the MPI transport (the seed CNN's gradient goes around
strata's ring), rank 2 stopped with SIGSTOP once all train. Counts the runs in which an error
names rank 0 or 1 as missing. Prints a table and, with --json FILE, JSON.
    python3 benchmarks/stall_naming.py --mpirun mpirun --data DIR --runs 10 \\
        --exe new=build/tools/mnist_cnn [--exe old=OTHER/mnist_cnn] [--json F]
The data folder holds MNIST's four IDX files (a fake set is enough: tests/check_examples.py's
fake_mnist). Runs alternate between the executables.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.argv, argv = sys.argv[:1], sys.argv[1:]
import check_multi_worker as cmw  # noqa: E402

LIVE = re.compile(r"ranks? [0-9, ]*\b[01]\b[0-9, ]* of 3 did not arrive")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--data", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--exe", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    exes = dict(e.split("=", 1) for e in a.exe)
    os.environ.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                       "OMPI_MCA_rmaps_base_oversubscribe": "1", "STRATA_QUIET_BLAS": "1"})
    res = {n: {"runs": 0, "live_named": 0, "rank2_named": 0} for n in exes}
    for _ in range(a.runs):
        for name, exe in exes.items():
            rc, secs, err = cmw.fault(a.mpirun, exe, a.data, "stall",
                                      strategy=("--strategy", "multi_worker_mirrored", "--transport", "mpi"))
            if rc is None:
                continue
            lines = [line for line in err.splitlines() if "did not arrive" in line and "error" in line]
            r = res[name]
            r["runs"] += 1
            r["live_named"] += any(LIVE.search(line) for line in lines)
            r["rank2_named"] += "rank 2 of 3 did not arrive" in err
    print(f"{'mnist_cnn':<12} {'runs':>5} {'rank 2 named':>13} {'a live rank named':>18}")
    for name, r in res.items():
        print(f"{name:<12} {r['runs']:>5} {r['rank2_named']:>13} {r['live_named']:>18}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
