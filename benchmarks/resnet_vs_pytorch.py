#!/usr/bin/env python3
"""strata vs PyTorch on strata_train's resnet, side by side in one run, and the cost of
synchronized batch normalization.

Both train the same network and recipe (benchmarks/pytorch_resnet.py says what and how) on the
same files with the same number of threads; the runs alternate (strata, PyTorch, strata, ...)
so that both see the same machine state, and the table reports the median of the repetitions.

    python3 benchmarks/resnet_vs_pytorch.py --dataset fashion_mnist --epochs 2 --steps-per-epoch 60 --reps 3 --json r.json
    python3 benchmarks/resnet_vs_pytorch.py --baseline /tmp/build-before/tools/strata_train ...  (a before/after beside PyTorch)
    python3 benchmarks/resnet_vs_pytorch.py --sync-cost --steps-per-epoch 60 --reps 3 [--mpirun mpirun]

The first compares training speed (images/s over the training steps: augmentation, forward,
backward, update) after each side's first epoch (its warm-up: see steady_rate); with --epochs 15
and no --steps-per-epoch, accuracy too. --sync-cost times
strata's step under mirrored x2 (and, with --mpirun, multi_worker_mirrored over 2 processes of
one replica each) with --sync-batch-norm on and off.

Needs: build/tools/strata_train, the data set (scripts/fetch-fashion-mnist data/fashion_mnist or
scripts/fetch-mnist data/mnist), and PyTorch in /usr/bin/python3 (Debian's python3-torch;
scripts/install-deps installs it).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_vs_pytorch import blas_env, run  # noqa: E402 - beside this file


def steady_rate(r, name):
    """Training images/s over the epochs after the first, or None with one epoch. The first epoch
    carries each framework's warm-up (first-call allocations; PyTorch's oneDNN builds its
    primitives): about 2.5 s of PyTorch's, which over 60 steps of batch 128 once made it look 40%
    slower than its steady state."""
    if name == "pytorch":
        later = r.get("epochs_detail", [])[1:]
        if not later:
            return None
        return sum(e["train_images_per_second"] * e["train_seconds"] for e in later) / sum(e["train_seconds"] for e in later)
    secs = r.get("epoch_train_seconds", [])
    if len(secs) < 2:
        return None
    per_epoch = r["train_images_per_second"] * sum(secs) / len(secs)  # the same images every epoch
    return per_epoch * (len(secs) - 1) / sum(secs[1:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=["mnist", "fashion_mnist"], default="fashion_mnist")
    p.add_argument("--data", default="")
    p.add_argument("--epochs", type=int, default=2, help="the speed is that of the epochs after the first (see steady_rate)")
    p.add_argument("--steps-per-epoch", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--strata", default="build/tools/strata_train")
    p.add_argument("--baseline", default="", help="another strata_train (an earlier revision's build) run in the same "
                                                  "alternation: a before/after figure beside PyTorch's")
    p.add_argument("--python", default="/usr/bin/python3", help="a Python with torch (Debian's python3-torch)")
    p.add_argument("--sync-cost", action="store_true", help="time strata's step with and without synchronized batch norm")
    p.add_argument("--mpirun", default="", help="--sync-cost: also multi_worker_mirrored over 2 processes")
    p.add_argument("--json", default="")
    a = p.parse_args()
    data = a.data or os.path.join("data", a.dataset)
    env = blas_env()
    steps = [] if a.steps_per_epoch <= 0 else ["--steps-per-epoch", str(a.steps_per_epoch)]
    strata = [a.strata, "--model", "resnet", "--dataset", a.dataset, "--data", data, "--verbose", "0", "--seed", str(a.seed),
              "--epochs", str(a.epochs)] + steps
    if a.sync_cost:
        return sync_cost(a, env, strata)
    # The same warm-up and cosine over the same steps: strata's recipe, spelled out for PyTorch.
    torch_cmd = [a.python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_resnet.py"), "--dataset", a.dataset,
                 "--data", data, "--epochs", str(a.epochs), "--threads", str(a.threads), "--seed", str(a.seed)] + steps
    strata_cmd = strata + ["--threads", str(a.threads)]
    names = ("strata", "pytorch") + (("baseline",) if a.baseline else ())
    results = {name: [] for name in names}
    cmds = [("strata", strata_cmd), ("pytorch", torch_cmd)]
    if a.baseline:
        cmds.append(("baseline", [a.baseline] + strata_cmd[1:]))
    for rep in range(a.reps):
        for name, cmd in cmds:
            r = run(cmd, env)
            steady = steady_rate(r, name)
            r["speed"] = steady if steady is not None else r["train_images_per_second"]
            results[name].append(r)
            print(f"rep {rep + 1}/{a.reps} {name:8s} {r['speed']:10.1f} images/s"
                  f"{' after the first epoch' if steady is not None else ' (one epoch: warm-up included)'}, "
                  f"{r['train_images_per_second']:.1f} over all; test accuracy {100 * r['test_accuracy']:.2f}%", flush=True)
    rows = [{"framework": name, "train_images_per_second": statistics.median(r["speed"] for r in results[name]),
             "all_epochs_images_per_second": statistics.median(r["train_images_per_second"] for r in results[name]),
             "test_accuracy": statistics.median(r["test_accuracy"] for r in results[name]),
             "runs": [r["speed"] for r in results[name]]} for name in names]
    ratio = rows[0]["train_images_per_second"] / rows[1]["train_images_per_second"]
    print()
    print(f"resnet on {a.dataset}, batch 128, {a.threads} threads, {a.epochs} epoch(s)"
          f"{'' if a.steps_per_epoch <= 0 else f', {a.steps_per_epoch} steps/epoch'}, median of {a.reps}")
    print(f"{'framework':<10} {'images/s':>10} {'test acc':>9}")
    for r in rows:
        print(f"{r['framework']:<10} {r['train_images_per_second']:>10.1f} {100 * r['test_accuracy']:>8.2f}%")
    print(f"strata / PyTorch speed: {ratio:.2f}x")
    if a.baseline:
        print(f"strata / baseline ({a.baseline}) speed: {rows[0]['train_images_per_second'] / rows[2]['train_images_per_second']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "resnet_vs_pytorch", "dataset": a.dataset, "epochs": a.epochs, "threads": a.threads,
                       "steps_per_epoch": a.steps_per_epoch, "reps": a.reps,
                       "env": {k: env[k] for k in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY") if k in env},
                       "results": rows, "speed_ratio": ratio, "baseline": a.baseline or None}, f, indent=2)


def sync_cost(a, env, strata):
    """strata's training images/s with --sync-batch-norm on and off, alternating."""
    cases = [("mirrored x2", strata + ["--strategy", "mirrored", "--replicas", "2"], env)]
    if a.mpirun:
        mpi_env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
                       OMPI_MCA_hwloc_base_binding_policy="none")
        cases.append(("multi_worker_mirrored np 2", [a.mpirun, "-np", "2"] + strata + ["--strategy", "multi_worker_mirrored",
                                                                                      "--replicas", "1", "--threads", "1"], mpi_env))
    rows = []
    for label, cmd, e in cases:
        speed = {"on": [], "off": []}
        for rep in range(a.reps):
            for sync in ("on", "off"):
                r = run(cmd + ["--sync-batch-norm", sync], e)
                speed[sync].append(r["train_images_per_second"])
                print(f"rep {rep + 1}/{a.reps} {label} sync {sync:3s} {r['train_images_per_second']:8.1f} images/s", flush=True)
        on, off = statistics.median(speed["on"]), statistics.median(speed["off"])
        rows.append({"strategy": label, "sync_on_images_per_second": on, "sync_off_images_per_second": off,
                     "step_cost": off / on - 1, "runs": speed})
    print()
    print(f"resnet on {a.dataset}, batch 128, {a.epochs} epoch(s) x {a.steps_per_epoch} steps, median of {a.reps}")
    print(f"{'strategy':<28} {'sync on':>9} {'sync off':>9} {'step cost':>10}")
    for r in rows:
        print(f"{r['strategy']:<28} {r['sync_on_images_per_second']:>9.1f} {r['sync_off_images_per_second']:>9.1f} "
              f"{100 * r['step_cost']:>9.1f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "resnet_vs_pytorch --sync-cost", "dataset": a.dataset, "reps": a.reps,
                       "steps_per_epoch": a.steps_per_epoch, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
