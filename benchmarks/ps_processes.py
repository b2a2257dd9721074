#!/usr/bin/env python3
"""ParameterServer across processes against in process, on the seed CNN (docs/benchmarks.md,
"ParameterServer across processes").

  ps_processes.py --mnist-cnn build/tools/mnist_cnn [--data data/mnist] [--mpirun mpirun]
                  [--reps 3] [--steps 150] [--curve-epochs 8] [--json FILE] [--plot FILE.svg]
  ps_processes.py --replot FILE.json --plot FILE.svg     (the plot of a run's JSON, nothing run)

1. Speed: 1 server + 3 workers, asynchronous, real clock, batch 64 per worker, --threads 1:
   `mnist_cnn --strategy parameter_server ...` in one process and under `mpirun -np 5`,
   alternated --reps times; updates per second and ms per update from the coordinator's clock
   (the JSON's `seconds`: the epochs' time, not the start-up or the evaluation), medians.
2. A worker killed halfway: the same job under `mpirun --enable-recovery -np 5`, --curve-epochs
   epochs of --steps updates, worker 2 (rank 4) killed with SIGKILL once rank 0 has reported half
   of the epochs; the validation accuracy of every epoch, the epoch of the kill, and the warning
   that named the worker; --plot draws it (validation accuracy and epoch time per epoch, the
   kill marked). Standard library only.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# The MPI environment and the ranks' pids, as tests/check_multi_worker.py finds them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from check_multi_worker import env, ranks_of  # noqa: E402

ENV = env()


def plot_curve(curve, path):
    """An SVG of the killed-worker run: validation accuracy (left) and epoch time (right) per
    epoch, a dashed line where the worker was killed."""
    acc = [100 * a for a in curve["epoch_val_accuracy"]]
    secs = curve["epoch_train_seconds"]
    killed = curve.get("killed_after_epoch")
    n = len(acc)
    w, h, m = 360, 260, 48  # one panel; margins

    def panel(x0, values, lo, hi, title, unit):
        px = lambda e: x0 + m + (e - 1) * (w - 1.5 * m) / max(1, n - 1)
        py = lambda v: h - m - (v - lo) * (h - 1.8 * m) / (hi - lo)
        out = [f'<text x="{x0 + w / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>',
               f'<line x1="{x0 + m}" y1="{h - m}" x2="{x0 + w - m / 2}" y2="{h - m}" stroke="black"/>',
               f'<line x1="{x0 + m}" y1="{h - m}" x2="{x0 + m}" y2="{0.8 * m}" stroke="black"/>']
        for k in range(5):
            v = lo + k * (hi - lo) / 4
            out.append(f'<text x="{x0 + m - 4}" y="{py(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.1f}{unit}</text>')
        for e in range(1, n + 1):
            out.append(f'<text x="{px(e):.1f}" y="{h - m + 14}" text-anchor="middle" font-size="10">{e}</text>')
        out.append(f'<text x="{x0 + w / 2}" y="{h - 10}" text-anchor="middle" font-size="11">epoch</text>')
        if killed:
            xk = (px(killed) + px(killed + 1)) / 2
            out.append(f'<line x1="{xk:.1f}" y1="{h - m}" x2="{xk:.1f}" y2="{0.8 * m}" stroke="#c00" stroke-dasharray="4,3"/>')
            out.append(f'<text x="{xk + 3:.1f}" y="{0.8 * m + 10}" font-size="10" fill="#c00">worker 2 killed</text>')
        pts = " ".join(f"{px(e + 1):.1f},{py(v):.1f}" for e, v in enumerate(values))
        out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
        out += [f'<circle cx="{px(e + 1):.1f}" cy="{py(v):.1f}" r="3" fill="#1f77b4"/>' for e, v in enumerate(values)]
        return out

    lo_acc = min(acc) - 0.5
    body = panel(0, acc, lo_acc, 100.0, "validation accuracy", "%")
    body += panel(w, secs, 0.0, max(secs) * 1.15, "epoch time (s)", "")
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" font-family="sans-serif">',
           f'<rect width="{2 * w}" height="{h}" fill="white"/>'] + body + ["</svg>"]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(svg) + "\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mnist-cnn")
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--curve-epochs", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--plot", help="an SVG of the killed-worker run")
    ap.add_argument("--replot", metavar="JSON", help="only draw --plot from a JSON this script wrote")
    a = ap.parse_args()
    if a.replot:
        if not a.plot:
            ap.error("--replot needs --plot FILE.svg")
        try:
            with open(a.replot) as f:
                curve = json.load(f)["curve"]
            curve["epoch_val_accuracy"], curve["epoch_train_seconds"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--replot {a.replot}: expected this script's JSON (a 'curve' with 'epoch_val_accuracy' and "
                     f"'epoch_train_seconds'), found: {type(e).__name__}: {e}")
        plot_curve(curve, a.plot)
        return 0
    if not a.mnist_cnn:
        ap.error("--mnist-cnn is required (or --replot JSON --plot FILE.svg)")
    flags = ["--data", a.data, "--strategy", "parameter_server", "--workers", "3", "--servers", "1", "--sync", "async",
             "--batch-size", "64", "--threads", "1"]
    out = {"flags": flags, "speed": {}, "curve": {}}
    with tempfile.TemporaryDirectory() as d:
        runs = {"in process": [], "5 processes": []}
        for rep in range(a.reps):
            for name, prefix in (("in process", []), ("5 processes", [a.mpirun, "-np", "5"])):
                j = os.path.join(d, f"speed{rep}.json")
                r = subprocess.run(prefix + [a.mnist_cnn] + flags + ["--epochs", "1", "--steps-per-epoch", str(a.steps),
                                                                    "--verbose", "0", "--json", j],
                                   capture_output=True, text=True, env=ENV, timeout=900)
                if r.returncode != 0:
                    sys.exit(f"{name}: exit {r.returncode}: {r.stderr[-1000:]}")
                with open(j) as f:
                    doc = json.load(f)
                runs[name].append(doc["updates"] / doc["seconds"])
        print(f"1 server + 3 workers, async, real clock, batch 64 per worker, {a.steps} updates, {a.reps} runs each (medians):")
        for name, ups in runs.items():
            m = statistics.median(ups)
            print(f"  {name:12s} {m:7.1f} updates/s  {1e3 / m:6.2f} ms per update   (runs: {', '.join(f'{u:.1f}' for u in ups)})")
            out["speed"][name] = {"updates_per_second": m, "ms_per_update": 1e3 / m, "runs": ups}

        j = os.path.join(d, "curve.json")
        cmd = [a.mpirun, "--enable-recovery", "-np", "5", a.mnist_cnn] + flags + [
            "--epochs", str(a.curve_epochs), "--steps-per-epoch", str(a.steps), "--verbose", "2", "--timeout-ms", "3000",
            "--json", j]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        killed_after = None
        lines = []
        for line in p.stdout:
            lines.append(line)
            if killed_after is None and line.startswith("Epoch") is False and "val_accuracy" in line:
                done = sum(1 for x in lines if "val_accuracy" in x)
                if done == a.curve_epochs // 2:
                    pids = ranks_of(p.pid, os.path.basename(a.mnist_cnn))
                    if 4 in pids:
                        os.kill(pids[4], signal.SIGKILL)
                        killed_after = done
        err = p.stderr.read()
        p.wait()
        with open(j) as f:
            doc = json.load(f)
        named = [x for x in err.splitlines() if "did not report" in x]
        print(f"\nworker 2 (rank 4) killed after epoch {killed_after} of {a.curve_epochs} ({a.steps} updates per epoch):")
        for e, acc in enumerate(doc["epoch_val_accuracy"]):
            mark = "   <- worker 2 killed after this epoch" if killed_after == e + 1 else ""
            print(f"  epoch {e + 1}: validation accuracy {100 * acc:.2f}%, epoch time {doc['epoch_train_seconds'][e]:.2f} s{mark}")
        print(f"  test accuracy {100 * doc['test_accuracy']:.2f}%, updates {doc['updates']}, dropped {doc['dropped']}")
        print("  " + (named[0] if named else "(no warning naming the worker)"))
        out["curve"] = {"killed_after_epoch": killed_after, "epoch_val_accuracy": doc["epoch_val_accuracy"],
                        "epoch_train_seconds": doc["epoch_train_seconds"], "test_accuracy": doc["test_accuracy"],
                        "updates": doc["updates"], "dropped": doc["dropped"], "warning": named[0] if named else None}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.plot:
        plot_curve(out["curve"], a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
