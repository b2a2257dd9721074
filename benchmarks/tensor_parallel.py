#!/usr/bin/env python3
"""strata_train's ViT split by tensor parallelism against one device and data parallelism
(docs/model_parallel.md, issue 43): the training rate of each way of using 2 cores, and the bytes
each moves per step, measured where strata counts them and against the formulas.

    python3 benchmarks/tensor_parallel.py --strata-train build/tools/strata_train \\
        --data data/fashion_mnist --dataset fashion_mnist [--steps 30] [--reps 2] [--mpirun mpirun] [--json F]

The runs, each `--epochs 1 --steps-per-epoch STEPS`, alternating, REPS times:
  one_device           one process, 2 BLAS threads
  tp2_threads          --tensor-parallel 2: the shards on 2 threads of one process
  tp2_processes        mpirun -np 2 ... --tensor-parallel 2 --threads 1: a shard per process
  mirrored2            --strategy mirrored --replicas 2 (1 core each)
  mwm2_processes       mpirun -np 2 ... --strategy multi_worker_mirrored --replicas 1 --threads 1

Bytes per step (what one process hands its group per step):
  tensor parallel (Megatron's count, per block: one [b*s, h] sum forward, one backward), summed:
      depth * 4*b*s*h
  plus, as strata keeps every variable on every process, the split variables' gradients
  gathered (an all-gather of each process's part):
      depth * (attention_vars + mlp_vars)
  data parallel: the gradient of every variable, summed once a step.
Into each of N processes a sum moves about 2(N-1)/N of its buffer (reduce-scatter, then the
others' sums) and a gather (N-1)/N (the others' parts): the "received" column.
The processes' counts come from strata_train's JSON (tensor_parallel_bytes and
tensor_parallel_gathered_bytes: the whole run's, training and the evaluations); the script checks
them against the formulas for that whole run.
Prints a table and, with --json FILE, JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# strata_train's ViT (tools/strata_train_models.hpp): 49 tokens of width 64, depth 4, 4 heads of
# 16, MLP 128, biases; 138 890 variables.
S, H_WIDTH, DEPTH, HEADS, DK, MLP, VARIABLES = 49, 64, 4, 4, 16, 128, 138890
ATTENTION_VARS = 3 * H_WIDTH * HEADS * DK + HEADS * DK * H_WIDTH + 3 * HEADS * DK  # q, k, v kernels and biases; output kernel
MLP_VARS = H_WIDTH * MLP + MLP + MLP * H_WIDTH  # both kernels, the first layer's bias


def tp_summed_per_step(batch, training=True):
    return DEPTH * (4 if training else 2) * batch * S * H_WIDTH


def tp_gathered_per_step(training=True):
    return DEPTH * (ATTENTION_VARS + MLP_VARS) if training else 0


def received(summed, gathered, n=2):
    """Bytes moved into each of n processes: 2(n-1)/n of a sum's buffer, (n-1)/n of a gather's."""
    return (2 * summed + gathered) * (n - 1) // n


def run(cmd, out, env):
    r = subprocess.run(cmd + ["--json", out], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1200)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata-train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--json")
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMP_WAIT_POLICY="passive", STRATA_QUIET_BLAS="1")
    base = [a.strata_train, "--model", "vit", "--dataset", a.dataset, "--data", a.data, "--epochs", "1",
            "--steps-per-epoch", str(a.steps), "--batch-size", str(a.batch_size), "--verbose", "0"]
    mpi = [a.mpirun, "-np", "2"]
    runs = {
        "one_device": base + ["--threads", "2"],
        "tp2_threads": base + ["--tensor-parallel", "2", "--threads", "2"],
        "tp2_processes": mpi + base + ["--tensor-parallel", "2", "--threads", "1"],
        "mirrored2": base + ["--strategy", "mirrored", "--replicas", "2", "--threads", "1"],
        "mwm2_processes": mpi + base + ["--strategy", "multi_worker_mirrored", "--replicas", "1", "--threads", "1"],
    }
    rates = {k: [] for k in runs}
    docs = {}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.reps):
            for name, cmd in runs.items():
                doc = run(cmd, os.path.join(d, name + ".json"), env)
                rates[name].append(doc["train_images_per_second"])
                docs[name] = doc
    b = a.batch_size
    tp_sum, tp_gather = 4 * tp_summed_per_step(b), 4 * tp_gathered_per_step()
    dp_step = 4 * VARIABLES
    # The processes' whole run: the training steps, then two evaluations of the test set (the
    # epoch's validation and the final evaluate), batch 1000.
    tp = docs["tp2_processes"]
    test_images = 10000
    evals = 2 * sum(4 * tp_summed_per_step(min(1000, test_images - i), training=False) for i in range(0, test_images, 1000))
    expected = {"summed": a.steps * tp_sum + evals, "gathered": a.steps * tp_gather}
    measured = {"summed": tp.get("tensor_parallel_bytes"), "gathered": tp.get("tensor_parallel_gathered_bytes")}
    per_step = {"one_device": (0, 0), "tp2_threads": (tp_sum, tp_gather), "tp2_processes": (tp_sum, tp_gather),
                "mirrored2": (dp_step, 0), "mwm2_processes": (dp_step, 0)}
    print(f"strata_train --model vit, batch {b}, {a.steps} steps, {a.reps} runs each (train images/s, median)")
    print(f"{'run':<16} {'images/s':>9} {'vs one_device':>14} {'summed/step':>12} {'gathered/step':>14} {'received/step':>14}  loss after the epoch")
    one = statistics.median(rates["one_device"])
    out = {"batch_size": b, "steps": a.steps, "reps": a.reps, "runs": {}}
    for name in runs:
        m = statistics.median(rates[name])
        summed, gathered = per_step[name]
        print(f"{name:<16} {m:>9.1f} {m / one:>13.2f}x {summed:>12,} {gathered:>14,} {received(summed, gathered):>14,}  "
              f"{docs[name]['epoch_loss'][0]:.4f}")
        out["runs"][name] = {"images_per_second": rates[name], "median": m, "bytes_summed_per_step": summed,
                             "bytes_gathered_per_step": gathered, "bytes_received_per_step": received(summed, gathered),
                             "epoch_loss": docs[name]["epoch_loss"], "test_accuracy": docs[name]["test_accuracy"]}
    ok = measured == expected
    for k in ("summed", "gathered"):
        print(f"tp2_processes, the whole run: {measured[k]:,} bytes {k} on rank 0 (strata's count), "
              f"{expected[k]:,} by the formula: {'equal' if measured[k] == expected[k] else 'DIFFERENT'}")
    out["tp2_processes_run_bytes"] = {"measured": measured, "formula": expected}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
