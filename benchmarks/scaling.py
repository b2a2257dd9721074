#!/usr/bin/env python3
"""Mirrored scaling on this machine: the reference MNIST CNN with N logical host devices (one
core each) against OneDevice with one thread, at the same per-replica batch (128), so each
replica does exactly the work of the single device. With --mpirun, also MultiWorkerMirrored
with N processes of 1 replica (one core each), compared with Mirrored's N replicas in one
process on the same global batch. Runs alternate; medians are reported.

    python3 benchmarks/scaling.py --replicas 2 --steps 150 --reps 3 --json scaling.json
    python3 benchmarks/scaling.py --replicas 2 --mpirun mpirun --reps 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_vs_pytorch import blas_env, run  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=150, help="training steps per run")
    p.add_argument("--per-replica-batch", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--strata", default="build/tools/mnist_cnn")
    p.add_argument("--json", default="")
    p.add_argument("--mpirun", default="", help="also run MultiWorkerMirrored with N processes (Open MPI's mpirun)")
    a = p.parse_args()
    env = blas_env()
    base = [a.strata, "--data", a.data, "--epochs", "1", "--steps-per-epoch", str(a.steps), "--verbose", "0"]
    configs = [
        ("one_device", base + ["--strategy", "one_device", "--threads", "1", "--batch-size", str(a.per_replica_batch)]),
        ("mirrored", base + ["--strategy", "mirrored", "--replicas", str(a.replicas), "--threads", "1",
                             "--batch-size", str(a.per_replica_batch * a.replicas)]),
        ("central_storage", base + ["--strategy", "central_storage", "--replicas", str(a.replicas), "--threads", "1",
                                    "--batch-size", str(a.per_replica_batch * a.replicas)]),
    ]
    if a.mpirun:
        env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none")
        configs.append(("multi_worker", [a.mpirun, "-np", str(a.replicas)] + base +
                        ["--strategy", "multi_worker_mirrored", "--replicas", "1", "--threads", "1",
                         "--batch-size", str(a.per_replica_batch * a.replicas)]))
    runs = {name: [] for name, _ in configs}
    for rep in range(a.reps):
        for name, cmd in configs:
            r = run(cmd, env)
            runs[name].append(r["train_images_per_second"])
            print(f"rep {rep + 1}/{a.reps} {name:16s} {runs[name][-1]:10.1f} images/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print()
    print(f"reference MNIST CNN, per-replica batch {a.per_replica_batch}, 1 core per replica, {a.steps} steps, median of {a.reps}")
    print(f"{'strategy':<16} {'replicas':>8} {'images/s':>10} {'speed-up':>9} {'/ mirrored':>10}")
    rows = []
    for name, _ in configs:
        n = 1 if name == "one_device" else a.replicas
        s = med[name] / med["one_device"]
        vs = med[name] / med["mirrored"]
        rows.append({"strategy": name, "replicas": n, "train_images_per_second": med[name], "speedup": s,
                     "relative_to_mirrored": vs, "runs": runs[name]})
        print(f"{name:<16} {n:>8} {med[name]:>10.1f} {s:>8.2f}x {vs:>9.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "mirrored_scaling", "steps": a.steps, "reps": a.reps, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
