#!/usr/bin/env python3
"""The precision policies side by side on the host: one model trained the same epochs under
float32, tf32, mixed_bfloat16 and mixed_float16 (strata_train --precision), the runs
interleaved (float32, bfloat16, float16, float32, ...) so that every policy sees the same machine
state. Reports each policy's test accuracy and its distance from float32's (the issue's bound:
0.3 points), training images/s (the median over --reps), and under mixed_float16 the loss
scale and the steps it skipped.

    python3 benchmarks/precision_accuracy.py --model cnn --data data/mnist --epochs 2 --json p.json
    python3 benchmarks/precision_accuracy.py --model resnet --dataset fashion_mnist --data data/fashion_mnist \\
        --epochs 2 --steps-per-epoch 100 --json r.json

On a host tf32 is float32 (no TF32 arithmetic): it is run once, as a check that it trains the
same weights, and its speed is float32's. Needs build/tools/strata_train and the data set.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_vs_pytorch import blas_env, run  # noqa: E402 - beside this file

POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", choices=["mnist", "fashion_mnist"], default="mnist")
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=-1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=1, help="runs of each policy (the speed is their median)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--strata", default="build/tools/strata_train")
    p.add_argument("--extra", default="", help="more strata_train flags, one string (e.g. '--strategy mirrored --replicas 2')")
    p.add_argument("--json", default="")
    a = p.parse_args()

    env = blas_env()
    base = [a.strata, "--model", a.model, "--dataset", a.dataset, "--data", a.data, "--epochs", str(a.epochs),
            "--threads", str(a.threads), "--seed", str(a.seed), "--verbose", "0"] + (a.extra.split() if a.extra else [])
    if a.steps_per_epoch > 0:
        base += ["--steps-per-epoch", str(a.steps_per_epoch)]
    runs = {q: [] for q in POLICIES}
    for _ in range(a.reps):
        for q in POLICIES:
            runs[q].append(run(base + ["--precision", q], env))
    tf32 = run(base + ["--precision", "tf32"], env)

    def acc(r):
        return 100 * r["test_accuracy"]

    ref = acc(runs["float32"][0])
    rows = []
    for q in POLICIES:
        r0 = runs[q][0]
        speeds = [r["train_images_per_second"] for r in runs[q]]
        row = {"precision": q, "test_accuracy": acc(r0), "points_from_float32": acc(r0) - ref,
               "test_loss": r0.get("test_loss"), "train_images_per_second": statistics.median(speeds),
               "train_images_per_second_all": speeds}
        if "loss_scale" in r0:
            row["loss_scale"] = r0["loss_scale"]
            row["skipped_steps"] = r0["skipped_steps"]
        rows.append(row)
    rows.append({"precision": "tf32", "test_accuracy": acc(tf32), "points_from_float32": acc(tf32) - ref,
                 "same_as_float32": acc(tf32) == ref and tf32.get("test_loss") == runs["float32"][0].get("test_loss")})

    steps = f"{a.steps_per_epoch} steps" if a.steps_per_epoch > 0 else "full epochs"
    print(f"precision_accuracy: --model {a.model} on {a.dataset}, {a.epochs} epochs ({steps}), {a.threads} threads, "
          f"{a.reps} run(s) each")
    print(f"{'precision':16s} {'test acc.':>10s} {'vs float32':>11s} {'train img/s':>12s}  loss scale / skipped")
    for r in rows:
        speed = f"{r['train_images_per_second']:12.0f}" if "train_images_per_second" in r else f"{'(= float32)':>12s}"
        scale = f"  {r['loss_scale']:g} / {r['skipped_steps']}" if "loss_scale" in r else ""
        print(f"{r['precision']:16s} {r['test_accuracy']:9.2f}% {r['points_from_float32']:+10.2f}  {speed}{scale}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "precision_accuracy", "model": a.model, "dataset": a.dataset, "epochs": a.epochs,
                       "steps_per_epoch": a.steps_per_epoch, "threads": a.threads, "reps": a.reps, "rows": rows},
                      f, indent=2)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
