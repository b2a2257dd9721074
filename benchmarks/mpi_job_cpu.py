#!/usr/bin/env python3
"""Where a multi-process job's CPU goes: starts `mpirun -np NP mnist_cnn` on a tiny MNIST-shaped
set (the one tests/check_multi_worker.py writes), lets it train for --warmup seconds, optionally
stops one rank (SIGSTOP, so the others wait for it at their next collective), then samples every
rank's and mpirun's user and system CPU from /proc/PID/stat over --seconds, and prints the cores
each used (a table; --json FILE writes the same). docs/benchmarks.md ("2026-11-30: where the
lane's CPU goes") quotes it.

  benchmarks/mpi_job_cpu.py --mnist-cnn build/tools/mnist_cnn [--np 2] [--stop-rank R]
      [--seconds 5] [--warmup 3] [--json FILE] -- [mnist_cnn flags, default: --strategy multi_worker_mirrored]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import check_multi_worker as c  # noqa: E402  (its tiny data set, its environment, its rank finder)


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().split(")")[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(f[11]) / tick, int(f[12]) / tick


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mnist-cnn", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--stop-rank", type=int, default=-1, help="SIGSTOP this rank before sampling (-1: none)")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--json")
    ap.add_argument("flags", nargs="*")
    a = ap.parse_args()
    flags = a.flags or ["--strategy", "multi_worker_mirrored"]
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "mnist")
        os.mkdir(data)
        c.fake_mnist(data)
        cmd = ["mpirun", "-np", str(a.np), a.mnist_cnn, "--data", data, "--epochs", "100000", "--steps-per-epoch", "3",
               "--batch-size", "12", "--verbose", "0", "--threads", "1", "--timeout-ms", "600000"] + flags
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=c.env())
        try:
            time.sleep(a.warmup)
            ranks = c.ranks_of(p.pid, os.path.basename(a.mnist_cnn))
            if len(ranks) != a.np:
                print(f"mpi_job_cpu: found {len(ranks)} of {a.np} ranks: {p.stderr.read1(2000) if p.poll() is not None else ''}")
                return 1
            if a.stop_rank >= 0:
                os.kill(ranks[a.stop_rank], signal.SIGSTOP)
                time.sleep(1)
            pids = {f"rank {r}": pid for r, pid in sorted(ranks.items())}
            pids["mpirun"] = p.pid
            before = {k: cpu(v) for k, v in pids.items()}
            t = time.time()
            time.sleep(a.seconds)
            after = {k: cpu(v) for k, v in pids.items()}
            dt = time.time() - t
        finally:
            c.end_job(p, list(c.ranks_of(p.pid, os.path.basename(a.mnist_cnn)).values()))
    rows = []
    print(f"{'process':<10} {'user cores':>11} {'sys cores':>10}  ({' '.join(flags)}, np {a.np}, stopped rank {a.stop_rank})")
    for k in pids:
        u, s = (after[k][0] - before[k][0]) / dt, (after[k][1] - before[k][1]) / dt
        stopped = k == f"rank {a.stop_rank}"
        print(f"{k:<10} {u:>11.2f} {s:>10.2f}{'  (stopped)' if stopped else ''}")
        rows.append({"process": k, "user_cores": u, "sys_cores": s, "stopped": stopped})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "mpi_job_cpu", "np": a.np, "flags": flags, "stop_rank": a.stop_rank, "seconds": dt, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
