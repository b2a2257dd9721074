#!/usr/bin/env python3
"""strata vs PyTorch on the reference MNIST CNN, side by side in one run.

Both train the identical model (Conv2D 32 -> MaxPool -> Conv2D 64 -> MaxPool -> Flatten ->
Dense 64 -> Dense 10; Glorot-uniform kernels, zero biases; RMSprop lr 1e-3 with Keras's
formula; batch 128) on the same MNIST files with the same number of threads. The runs
alternate (strata, PyTorch, strata, PyTorch, ...) so that both see the same machine state, and
the table reports the median of the repetitions.

    python3 benchmarks/mnist_vs_pytorch.py --epochs 1 --threads 2 --reps 3 --json mnist.json

Needs: build/tools/mnist_cnn (meson compile -C build mnist_cnn), MNIST in data/mnist
(scripts/fetch-mnist data/mnist), and PyTorch in /usr/bin/python3 (Debian's python3-torch;
scripts/install-deps installs it). Uses only the standard library itself.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def blas_env():
    """The environment scripts/blas-env recommends (OPENBLAS_CORETYPE etc.), for both sides."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(["bash", os.path.join(here, "..", "scripts", "blas-env")], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            env[k] = v
    return env


def run(cmd, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        r = subprocess.run(cmd + ["--json", path], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps-per-epoch", type=int, default=-1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--strata", default="build/tools/mnist_cnn")
    p.add_argument("--python", default="/usr/bin/python3", help="a Python with torch (Debian's python3-torch)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--inference", action="store_true",
                   help="compare inference instead: images/s over the 10 000 test images at batch 1000 (strata's "
                        "Model::evaluate after a one-step fit; PyTorch eager and a frozen TorchScript trace)")
    p.add_argument("--json", default="")
    a = p.parse_args()

    env = blas_env()
    if a.inference:
        return inference(a, env)
    common = ["--data", a.data, "--epochs", str(a.epochs), "--threads", str(a.threads), "--seed", str(a.seed),
              "--batch-size", str(a.batch_size)]
    if a.steps_per_epoch > 0:
        common += ["--steps-per-epoch", str(a.steps_per_epoch)]
    strata_cmd = [a.strata, "--verbose", "0"] + common
    torch_cmd = [a.python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_mnist.py")] + common

    results = {"strata": [], "pytorch": []}
    for rep in range(a.reps):
        for name, cmd in (("strata", strata_cmd), ("pytorch", torch_cmd)):
            r = run(cmd, env)
            results[name].append(r)
            print(f"rep {rep + 1}/{a.reps} {name:8s} {r['train_images_per_second']:10.1f} images/s  "
                  f"test accuracy {100 * r['test_accuracy']:.2f}%", flush=True)

    def med(name, key):
        return statistics.median(r[key] for r in results[name])

    rows = []
    for name in ("strata", "pytorch"):
        rows.append({"framework": name, "train_images_per_second": med(name, "train_images_per_second"),
                     "test_accuracy": med(name, "test_accuracy"), "test_loss": med(name, "test_loss"),
                     "runs": [r["train_images_per_second"] for r in results[name]]})
    ratio = rows[0]["train_images_per_second"] / rows[1]["train_images_per_second"]
    print()
    print(f"MNIST CNN, batch {a.batch_size}, {a.threads} threads, {a.epochs} epoch(s)"
          f"{'' if a.steps_per_epoch <= 0 else f', {a.steps_per_epoch} steps/epoch'}, median of {a.reps}")
    print(f"{'framework':<10} {'images/s':>10} {'test acc':>9} {'test loss':>10}")
    for r in rows:
        print(f"{r['framework']:<10} {r['train_images_per_second']:>10.1f} {100 * r['test_accuracy']:>8.2f}% {r['test_loss']:>10.4f}")
    print(f"strata / PyTorch speed: {ratio:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "mnist_vs_pytorch", "batch_size": a.batch_size, "epochs": a.epochs, "threads": a.threads, "reps": a.reps,
                       "steps_per_epoch": a.steps_per_epoch, "env": {k: env[k] for k in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY") if k in env},
                       "results": rows, "speed_ratio": ratio}, f, indent=2)


def inference(a, env):
    """strata's evaluate throughput beside PyTorch's eager and frozen-TorchScript inference."""
    strata_cmd = [a.strata, "--verbose", "0", "--data", a.data, "--epochs", "1", "--steps-per-epoch", "1",
                  "--threads", str(a.threads), "--seed", str(a.seed)]
    torch_cmd = [a.python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_mnist.py"), "--data", a.data,
                 "--threads", str(a.threads), "--inference-only", "--inference-reps", "3"]
    runs = {"strata": [], "pytorch eager": [], "pytorch TorchScript (frozen)": []}
    for rep in range(a.reps):
        s = run(strata_cmd, env)["test_images_per_second"]
        t = run(torch_cmd, env)
        runs["strata"].append(s)
        runs["pytorch eager"].append(t["eager_images_per_second"])
        runs["pytorch TorchScript (frozen)"].append(t["torchscript_images_per_second"])
        print(f"rep {rep + 1}/{a.reps}: strata {s:.0f}, eager {t['eager_images_per_second']:.0f}, "
              f"TorchScript {t['torchscript_images_per_second']:.0f} images/s", flush=True)
    rows = [{"framework": k, "images_per_second": statistics.median(v), "runs": v} for k, v in runs.items()]
    print()
    print(f"MNIST CNN inference over 10 000 test images, batch 1000, {a.threads} threads, median of {a.reps}")
    print(f"{'framework':<30} {'images/s':>10} {'strata is':>10}")
    for r in rows:
        print(f"{r['framework']:<30} {r['images_per_second']:>10.0f} {rows[0]['images_per_second'] / r['images_per_second']:>9.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "mnist_vs_pytorch --inference", "threads": a.threads, "reps": a.reps, "batch": 1000,
                       "env": {k: env[k] for k in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY") if k in env},
                       "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
