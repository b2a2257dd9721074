#!/usr/bin/env python3
"""Pipeline x tensor across emulated hosts: the messages between stages whole, or in parts
gathered on arrival (Megatron's scatter/gather, Narayanan et al. 2021, section 4.1), by link
speed (docs/model_parallel.md, "Stages of shards"). Needs root (scripts/multihost).

  pipeline_tensor_multihost.py --strata-train build/tools/strata_train --data data/fashion_mnist
                               [--multihost scripts/multihost] [--links 1gbit,200mbit]
                               [--reps 3] [--steps 30] [--batch-size 128] [--micro-batches 4]
                               [--json FILE]

Each run is `scripts/multihost --hosts 2 --per-host N --link RATE -- strata_train --model vit
--dataset fashion_mnist --strategy pipeline --stages 2 --tensor-parallel N --scatter-gather S
--epochs 1 --steps-per-epoch STEPS --threads 1 --json F`: one Open MPI job of 2 x N ranks, each
stage's N shards on one host (ranks 0..N-1 host 0: stage 0; N..2N-1 host 1: stage 1), as
Megatron places tensor parallelism inside a node and the pipeline across nodes. The runs
alternate (on, off, on, off, ... for every link) so that load drifts over both alike; the table
has medians over --reps. Columns:
  images/s         the JSON's train_images_per_second (training steps only)
  x whole          images/s over the same link's run with whole messages
  sent/step        what strata_train's rank 0 (stage 0, shard 0) sent its neighbour per step
                   (the JSON's pipeline.message_bytes_sent over the steps; the test-set
                   evaluation's forward messages included, as on the link)
  link/step        what host 0 sent over its link per step (multihost --json: the switch port's
                   counters, IP and TCP headers, set-up, the sums of the loss over the stages and
                   the evaluation included)
  formula          host 0's N processes each send stage 1 the activations of every micro-batch:
                   N x B x 49 x 64 x 4 bytes a step whole, B x 49 x 64 x 4 in parts (B: the batch),
                   plus the test set twice (the epoch's validation, then the evaluation)
  test loss        equal for on and off: the parts arrive bit for bit
Exit status 77 where scripts/multihost cannot run (not root, no network namespaces); 2 for bad
flags. Standard library only.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from multihost_common import load, machine, run_job  # noqa: E402 - beside this file
RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$|^none$")
TOKENS, WIDTH = 49, 64  # strata_train's vit: 7 x 7 patches of 4, width 64 (tools/strata_train_models.hpp)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata-train", required=True)
    ap.add_argument("--data", required=True, help="a Fashion-MNIST directory (scripts/fetch-fashion-mnist DIR)")
    ap.add_argument("--multihost", default=os.path.join(HERE, "..", "scripts", "multihost"))
    ap.add_argument("--shards", type=int, default=2, choices=(2, 4))
    ap.add_argument("--links", default="1gbit,200mbit")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    for flag, v, lo, hi in (("--reps", a.reps, 1, 1000), ("--steps", a.steps, 1, 100000),
                            ("--batch-size", a.batch_size, 1, 60000), ("--micro-batches", a.micro_batches, 1, 4096)):
        if not lo <= v <= hi:
            ap.error(f"{flag}: expected {lo} to {hi}, found {v}")
    a.links = [x for x in a.links.split(",") if x]
    if not a.links or any(not RATE.match(x) for x in a.links):
        ap.error(f"--links: expected comma-separated tc rates (1gbit, 200mbit) or none, found {','.join(a.links)!r}")
    for flag, path in (("--strata-train", a.strata_train), ("--multihost", a.multihost)):
        if not os.access(path, os.X_OK):
            ap.error(f"{flag}: {path} is not an executable file")
    if not os.path.isfile(os.path.join(a.data, "train-images-idx3-ubyte")):
        ap.error(f"--data: no train-images-idx3-ubyte in {a.data}")
    return a


def one_run(a, link, scatter, work):
    out_json = os.path.join(work, "run.json")
    link_json = os.path.join(work, "links.json")
    cmd = [a.multihost, "--hosts", "2", "--per-host", str(a.shards), "--link", link, "--deadline", "900", "--json", link_json,
           "--", a.strata_train, "--model", "vit", "--dataset", "fashion_mnist", "--data", a.data, "--strategy", "pipeline",
           "--stages", "2", "--micro-batches", str(a.micro_batches), "--tensor-parallel", str(a.shards),
           "--scatter-gather", scatter, "--epochs", "1", "--steps-per-epoch", str(a.steps), "--batch-size", str(a.batch_size),
           "--threads", "1", "--verbose", "0", "--json", out_json]
    out, doc, links = run_job("pipeline_tensor_multihost", cmd, out_json, link_json)
    pipe = doc.get("pipeline", {})
    test_images = re.search(r"(\d+) test images", out)
    tests = int(test_images.group(1)) if test_images else 0
    # Per step: the batch's activations once whole per shard, or in N parts; the evaluation of
    # the test set (forward only) adds its activations once per shard (or in parts) over the run.
    parts = a.shards if scatter == "on" else 1
    act = TOKENS * WIDTH * 4
    formula_run = a.shards * (a.steps * a.batch_size + 2 * tests) * act / parts  # validation after the epoch, then evaluate
    return {"link": link, "scatter_gather": scatter, "images_per_second": doc["train_images_per_second"],
            "test_loss": doc["test_loss"], "steps": a.steps, "test_images": tests,
            "rank0_message_bytes": pipe.get("message_bytes_sent"), "rank0_messages": pipe.get("messages_sent"),
            "host0_sent_bytes": links[0]["sent_bytes"], "host0_received_bytes": links[0]["received_bytes"],
            "formula_host0_sent_bytes": formula_run}


def main():
    a = parse_args()
    work = tempfile.mkdtemp(prefix="pipeline-tensor-multihost-")
    load_before = load()
    runs = []
    t0 = time.time()
    for rep in range(a.reps):
        for link in a.links:
            for scatter in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                row = one_run(a, link, scatter, work)
                row["rep"] = rep
                runs.append(row)
                print(f"  rep {rep + 1}/{a.reps} {link:>8} scatter-gather {scatter:<3} {row['images_per_second']:8.1f} images/s",
                      file=sys.stderr, flush=True)
    load_after = load()
    table = []
    for link in a.links:
        whole = None
        for scatter in ("off", "on"):
            rs = [r for r in runs if r["link"] == link and r["scatter_gather"] == scatter]
            ips = statistics.median(r["images_per_second"] for r in rs)
            if scatter == "off":
                whole = ips
            steps = a.steps
            table.append({"link": link, "scatter_gather": scatter, "images_per_second": ips,
                          "images_per_second_min": min(r["images_per_second"] for r in rs),
                          "images_per_second_max": max(r["images_per_second"] for r in rs),
                          "x_whole": ips / whole,
                          "rank0_sent_mib_per_step": statistics.median(r["rank0_message_bytes"] for r in rs) / steps / 2**20,
                          "link_mib_per_step": statistics.median(r["host0_sent_bytes"] for r in rs) / steps / 2**20,
                          "formula_mib_per_step": rs[0]["formula_host0_sent_bytes"] / steps / 2**20,
                          "test_losses": sorted({r["test_loss"] for r in rs}), "reps": len(rs)})
    print(f"pipeline x tensor across 2 emulated hosts: vit, 2 stages x {a.shards} shards (a stage per host), batch "
          f"{a.batch_size} in {a.micro_batches} micro-batches, {a.steps} steps, --threads 1; medians of {a.reps}")
    print(f"{'link':>8} {'scatter-gather':>14} {'images/s':>9} {'x whole':>8} {'sent/step MiB':>14} {'link/step MiB':>14} "
          f"{'formula MiB':>12}  test loss")
    for t in table:
        print(f"{t['link']:>8} {t['scatter_gather']:>14} {t['images_per_second']:9.1f} {t['x_whole']:8.2f} "
              f"{t['rank0_sent_mib_per_step']:14.3f} {t['link_mib_per_step']:14.3f} {t['formula_mib_per_step']:12.3f}  "
              f"{', '.join(f'{x:.6f}' for x in t['test_losses'])}")
    print(f"load average {load_before:.2f} before, {load_after:.2f} after; {time.time() - t0:.0f} s")
    if a.json:
        doc = {"benchmark": "pipeline_tensor_multihost", "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(),
               "command": " ".join(sys.argv), "shards": a.shards, "batch_size": a.batch_size, "micro_batches": a.micro_batches,
               "steps": a.steps, "load_before": load_before, "load_after": load_after, "table": table, "runs": runs}
        with open(a.json + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
