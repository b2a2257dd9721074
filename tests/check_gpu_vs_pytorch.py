#!/usr/bin/env python3
"""benchmarks/gpu_vs_pytorch.py end to end without a GPU: PyTorch on the CPU, tiny batches.

  check_gpu_vs_pytorch.py [--strata PATH-TO-gpu_cnn]

Runs the script with --device cpu and checks its JSON: one record per batch size with the keys
issue 18 names, finite eager figures, and every mode that cannot run here (torch.compile before
PyTorch 2.0, CUDA graphs, strata's GPU binary without a GPU) reported unavailable with a reason
and null figures, never a number. Exits 77 (skipped) when no Python here has PyTorch.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "benchmarks", "gpu_vs_pytorch.py")


def python_with_torch():
    for exe in (sys.executable, "/usr/bin/python3"):
        if exe and os.path.exists(exe) and subprocess.run([exe, "-c", "import torch"], capture_output=True).returncode == 0:
            return exe
    return None


def main():
    args = sys.argv[1:]
    strata = args[args.index("--strata") + 1] if "--strata" in args else "no-such-gpu_cnn"
    py = python_with_torch()
    if not py:
        print("check_gpu_vs_pytorch: no Python here has PyTorch (Debian: python3-torch); skipping")
        return 77
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        cmd = [py, SCRIPT, "--device", "cpu", "--batch-size", "8", "--batch-size", "16", "--steps", "2",
               "--warmup", "1", "--reps", "1", "--threads", "1", "--strata", strata, "--json", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        print(r.stdout)
        if r.returncode != 0:
            print(r.stderr)
            print("FAIL: exit", r.returncode)
            return 1
        with open(out) as fh:
            doc = json.load(fh, parse_constant=lambda c: failures.append(f"{c} in the JSON"))
    recs = doc["records"]
    check([x["batch"] for x in recs] == [8, 16], f"batches {[x['batch'] for x in recs]}")
    import_torch_2 = subprocess.run([py, "-c", "import torch, sys; sys.exit(hasattr(torch, 'compile'))"]).returncode == 1
    for rec in recs:
        for key in ("gpu", "driver", "batch", "strata_images_per_second", "pytorch_eager_images_per_second",
                    "pytorch_compile_images_per_second", "pytorch_cudagraph_images_per_second", "pytorch_eager_step_ms",
                    "strata_fraction_of_fp32_peak", "flops_per_image", "unavailable"):
            check(key in rec, f"record has no {key!r}")
        check(rec["gpu"] is None and rec["driver"] is None, f"a CPU run names a GPU: {rec['gpu']!r} {rec['driver']!r}")
        check(rec["flops_per_image"] == 14778624, f"flops_per_image {rec['flops_per_image']}")
        eager = rec["pytorch_eager_images_per_second"]
        check(isinstance(eager, (int, float)) and eager > 0, f"eager images/s {eager!r}")
        check(rec["pytorch_eager_fraction_of_fp32_peak"] is None, "a CPU run has no GPU peak to compare with")
        modes = ["cudagraph", "strata"] + ([] if import_torch_2 else ["compile"])
        for mode in modes:
            key = "strata_images_per_second" if mode == "strata" else f"pytorch_{mode}_images_per_second"
            if rec[key] is None:
                check(bool(rec["unavailable"].get(mode)), f"{mode}: null without a reason")
            else:
                check(mode == "strata", f"{mode} has a figure on the CPU: {rec[key]!r}")
        check(rec["pytorch_cudagraph_images_per_second"] is None, "a CUDA graph figure on the CPU")
    print(f"{len(failures)} failure(s)" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
