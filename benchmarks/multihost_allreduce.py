#!/usr/bin/env python3
"""MultiWorkerMirrored across emulated hosts: flat MPI against hierarchical, by link speed
(docs/benchmarks.md, "Across emulated hosts"). Needs root (scripts/multihost).

  multihost_allreduce.py --mnist-cnn build/tools/mnist_cnn [--multihost scripts/multihost]
                         [--hosts 2] [--per-host 2] [--links 1gbit,10gbit]
                         [--transports mpi,hierarchical] [--reps 3] [--epochs 40]
                         [--batch-size 48] [--data DIR] [--json FILE]

Each run is `scripts/multihost --hosts H --per-host P --link RATE -- mnist_cnn --strategy
multi_worker_mirrored --transport T --epochs E --batch-size B --threads 1 --verbose 0 --json F`:
one Open MPI job of H x P ranks on H emulated hosts (network namespaces with their own host
names; every host's link shaped to RATE with tc tbf). The runs are interleaved (repetition by
repetition, every link and transport in each), so that load on the machine drifts over all of
them alike; the table has medians over --reps. Columns:
  images/s       the JSON's train_images_per_second (the epochs' time, not set-up or evaluation)
  ms/step        batch / images/s
  cross ms       hierarchical only: rank 0's cross-host stage per all-reduce (the MPI transport
                 between the host leaders, arrival check included), from its report
  MiB/call       hierarchical only: what rank 0 (host 0's leader) put into the cross-host stage
                 per all-reduce call (the report's "MiB from this host" over its all-reduces)
  x flat         images/s over flat MPI's on the same link
  link MiB/step  what host 0 sent over its link (multihost --json: the switch port's counters,
                 IP and TCP headers included) over the training steps: the whole run's bytes,
                 start-up and evaluation included (one broadcast of the weights, a few sums: well
                 under 1% of 40 epochs)
  formula        the same predicted from the gradient's size G (the model's parameters x 4 bytes)
                 and the algorithm: hierarchical, the leaders' all-reduce over H hosts,
                 2(H-1)/H x G; flat MPI over N = H x P ranks placed host by host, a ring sends
                 2(N-1)/N x G over each host's one outgoing ring edge, recursive doubling (and
                 Rabenseifner's halving and doubling) P x log2(H) x G: both are printed, as
                 "ring / doubling" (strata's MPI transport runs its own ring from 256 KiB on,
                 ProcessGroupOptions::ring_min_bytes; MPI_Iallreduce below, where Open MPI
                 picks the algorithm by size)
--data: an MNIST directory; without it a tiny MNIST-shaped set (256 random images) is written to a
temporary directory (the figures are rates: the images' content does not change them).
Exit status 77 where scripts/multihost cannot run (not root, no network namespaces); 2 for bad
flags. Standard library only.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from multihost_common import load, machine, run_job  # noqa: E402 - beside this file
RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$|^none$")
CROSS = re.compile(r"cross-host stage\s+(\d+) hosts; (\d+) all-reduces, ([\d.]+) MiB from this host, ([\d.]+) s "
                   r"\(([\d.]+) ms each\)")
TRANSPORTS = ("auto", "mpi", "hierarchical")


def fake_mnist(directory, train=256, test=100):
    """Four MNIST-named IDX files of random 28x28 images and labels 0..9."""
    rng = random.Random(7)
    for prefix, n in (("train", train), ("t10k", test)):
        with open(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + rng.randbytes(n * 28 * 28))
        with open(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist-cnn", required=True)
    ap.add_argument("--multihost", default=os.path.join(HERE, "..", "scripts", "multihost"))
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--links", default="1gbit,10gbit")
    ap.add_argument("--transports", default="mpi,hierarchical")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--data")
    ap.add_argument("--json")
    a = ap.parse_args()
    for flag, v, lo, hi in (("--hosts", a.hosts, 1, 64), ("--per-host", a.per_host, 1, 64), ("--reps", a.reps, 1, 1000),
                            ("--epochs", a.epochs, 1, 1000000), ("--batch-size", a.batch_size, 1, 1000000)):
        if not lo <= v <= hi:
            ap.error(f"{flag}: expected {lo} to {hi}, found {v}")
    a.links = [x for x in a.links.split(",") if x]
    a.transports = [x for x in a.transports.split(",") if x]
    if not a.links or any(not RATE.match(x) for x in a.links):
        ap.error(f"--links: expected comma-separated tc rates (1gbit, 10gbit, 500mbit) or none, found {','.join(a.links)!r}")
    if not a.transports or any(t not in TRANSPORTS for t in a.transports):
        ap.error(f"--transports: expected a comma-separated subset of {', '.join(TRANSPORTS)}, found {','.join(a.transports)!r}")
    if a.batch_size % (a.hosts * a.per_host) != 0:
        ap.error(f"--batch-size: expected a multiple of the {a.hosts * a.per_host} ranks, found {a.batch_size}")
    for flag, path in (("--mnist-cnn", a.mnist_cnn), ("--multihost", a.multihost)):
        if not os.access(path, os.X_OK):
            ap.error(f"{flag}: {path} is not an executable file")
    if a.data is not None and not os.path.isfile(os.path.join(a.data, "train-images-idx3-ubyte")):
        ap.error(f"--data: no train-images-idx3-ubyte in {a.data}")
    return a


def one_run(a, data, link, transport, work):
    out_json = os.path.join(work, "run.json")
    link_json = os.path.join(work, "links.json")
    cmd = [a.multihost, "--hosts", str(a.hosts), "--per-host", str(a.per_host), "--link", link, "--deadline", "900",
           "--json", link_json, "--", a.mnist_cnn, "--data", data, "--strategy", "multi_worker_mirrored", "--transport", transport,
           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--threads", "1", "--verbose", "0",
           "--json", out_json]
    out, doc, links = run_job("multihost_allreduce", cmd, out_json, link_json)
    row = {"link": link, "transport": transport, "images_per_second": doc["train_images_per_second"],
           "train_seconds": doc["seconds"], "test_loss": doc["test_loss"]}
    images = re.search(r"MNIST: (\d+) training", out)
    per_epoch = doc.get("steps_per_epoch", -1)
    if per_epoch is None or per_epoch <= 0:
        per_epoch = -(-int(images.group(1)) // a.batch_size) if images else 0
    steps = a.epochs * per_epoch
    params = re.search(r"Total params: ([\d,]+)", out)  # the model's summary, printed by rank 0
    g = int(params.group(1).replace(",", "")) * 4 if params else 0
    n, h, p = a.hosts * a.per_host, a.hosts, a.per_host
    row.update({"steps": steps, "gradient_bytes": g, "host0_sent_bytes": links[0]["sent_bytes"],
                "host0_received_bytes": links[0]["received_bytes"],
                "link_bytes_per_step": links[0]["sent_bytes"] / steps if steps else None,
                "formula_bytes_per_step": ([2 * (h - 1) / h * g] if transport == "hierarchical" or p == 1 else
                                           [2 * (n - 1) / n * g, p * math.log2(h) * g])})
    m = CROSS.search(out)
    if m:
        steps = int(m.group(2))
        row.update({"cross_host_all_reduces": steps, "cross_host_mib": float(m.group(3)),
                    "cross_host_ms_each": float(m.group(5))})
    return row


def main():
    a = parse_args()
    work = tempfile.mkdtemp(prefix="multihost-allreduce-")
    data = a.data
    if data is None:
        data = os.path.join(work, "mnist")
        os.mkdir(data)
        fake_mnist(data)
    load_before = load()
    runs = []
    t0 = time.time()
    try:
        for rep in range(a.reps):
            for link in a.links:
                for transport in a.transports:
                    row = one_run(a, data, link, transport, work)
                    row["rep"] = rep
                    runs.append(row)
                    print(f"  rep {rep + 1}/{a.reps} {link:>7} {transport:<12} {row['images_per_second']:9.1f} images/s",
                          file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = load()

    table = []
    for link in a.links:
        flat = None
        for transport in a.transports:
            rs = [r for r in runs if r["link"] == link and r["transport"] == transport]
            ips = [r["images_per_second"] for r in rs]
            med = statistics.median(ips)
            t = {"link": link, "transport": transport, "images_per_second": med, "images_per_second_min": min(ips),
                 "images_per_second_max": max(ips), "ms_per_step": a.batch_size / med * 1e3, "reps": len(rs)}
            cross = [r for r in rs if "cross_host_ms_each" in r]
            if cross:
                t["cross_host_ms_each"] = statistics.median(r["cross_host_ms_each"] for r in cross)
                t["cross_host_mib_per_call"] = statistics.median(r["cross_host_mib"] / r["cross_host_all_reduces"]
                                                                 for r in cross)
            per_step = [r["link_bytes_per_step"] for r in rs if r.get("link_bytes_per_step")]
            if per_step:
                t["link_mib_per_step"] = statistics.median(per_step) / 2**20
                t["formula_mib_per_step"] = [x / 2**20 for x in rs[0]["formula_bytes_per_step"]]
            if transport == "mpi":
                flat = med
            table.append(t)
        for t in table:
            if t["link"] == link and flat:
                t["x_flat"] = t["images_per_second"] / flat

    print(f"MultiWorkerMirrored across {a.hosts} emulated hosts x {a.per_host} processes (scripts/multihost), mnist_cnn "
          f"seed CNN, batch {a.batch_size}, {a.epochs} epochs, --threads 1, median of {a.reps}")
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, kernel {m['kernel']}; load average {load_before:.2f} before, "
          f"{load_after:.2f} after; {time.time() - t0:.0f} s")
    print(f"{'link':>7} {'transport':<13} {'images/s':>9} {'(min-max)':>17} {'ms/step':>8} {'cross ms':>9} {'MiB/call':>9} "
          f"{'x flat':>7} {'link MiB/step':>14} {'formula':>13}")
    for t in table:
        rng = f"{t['images_per_second_min']:.0f}-{t['images_per_second_max']:.0f}"
        cross = f"{t['cross_host_ms_each']:.3f}" if "cross_host_ms_each" in t else "-"
        mib = f"{t['cross_host_mib_per_call']:.3f}" if "cross_host_mib_per_call" in t else "-"
        xf = f"{t['x_flat']:.2f}" if "x_flat" in t else "-"
        lm = f"{t['link_mib_per_step']:.3f}" if "link_mib_per_step" in t else "-"
        fm = " / ".join(f"{x:.3f}" for x in t.get("formula_mib_per_step", [])) or "-"
        print(f"{t['link']:>7} {t['transport']:<13} {t['images_per_second']:9.1f} {rng:>17} {t['ms_per_step']:8.2f} "
              f"{cross:>9} {mib:>9} {xf:>7} {lm:>14} {fm:>13}")
    if a.json:
        doc = {"benchmark": "multihost_allreduce", "machine": m, "load_before": load_before, "load_after": load_after,
               "hosts": a.hosts, "per_host": a.per_host, "epochs": a.epochs, "batch_size": a.batch_size,
               "reps": a.reps, "data": a.data or "256 random MNIST-shaped images", "command": sys.argv,
               "rows": table, "runs": runs}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
