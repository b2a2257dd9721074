#!/usr/bin/env python3
"""The least time strata_train's ViT step can take on this host's BLAS: every GEMM of one
training step (batch 128) at the rate OpenBLAS reaches on that shape alone, back to back
(benchmarks/bench_gemm's `vit.*` rows), and nothing else. Compared with a step time, it says how
much of the step is not GEMM, and what a target step time leaves for it (issue 43's >= 2x
PyTorch; docs/tools.md).

    build/benchmarks/bench_gemm --threads 1 --only vit --json gemm.json
    python3 benchmarks/vit_gemm_floor.py --gemm-json gemm.json [--step-ms 121] [--pytorch-images-per-second 813] [--json F]

The step's GEMMs, per encoder block (4 blocks; b = 128 examples, s = 49 tokens, h = 64, 4 heads
of d = 16, MLP 128): forward the 4 projections (query, key, value, output: vit.proj.fwd), the
MLP's two layers (vit.mlp_up.fwd, vit.mlp_down.fwd), and per example and head the scores Q K^T
(vit.scores.fwd) and A V (vit.av.fwd); backward each layer's dW and dX, and per head dA = dO V^T
(NT, as vit.scores.dX's rate is taken for it: the worse of the two small NT rows), dV = A^T dO
and dK = dA^T Q (TN: vit.av.dW), dQ = dA K (NN: vit.av.fwd). The patch embedding's GEMM (a
[6272, 16] x [16, 64] product, forward and dW) is under 1% and left out, as are the head's.
Prints a table and, with --json FILE, JSON.
"""
import argparse
import json
import sys

BATCH, HEADS, BLOCKS = 128, 4, 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemm-json", required=True, help="bench_gemm --only vit --json output")
    ap.add_argument("--step-ms", type=float, help="a measured step time to compare (ms)")
    ap.add_argument("--pytorch-images-per-second", type=float, help="PyTorch's training rate at batch 128")
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(a.gemm_json) as f:
        rows = {r["name"]: r for r in json.load(f)["rows"]}

    def ms(name, calls=1):
        r = rows[name]
        return calls * 2.0 * r["m"] * r["n"] * r["k"] / (r["direct_gflops"] * 1e9) * 1e3

    heads = BATCH * HEADS  # the small products a block runs per kind
    forward = 4 * ms("vit.proj.fwd") + ms("vit.mlp_up.fwd") + ms("vit.mlp_down.fwd") + ms("vit.scores.fwd", heads) + ms("vit.av.fwd", heads)
    backward = (4 * (ms("vit.proj.dW") + ms("vit.proj.dX")) + ms("vit.mlp_up.dW") + ms("vit.mlp_up.dX") + ms("vit.mlp_down.dW")
                + ms("vit.mlp_down.dX") + ms("vit.scores.dX", heads) + 2 * ms("vit.av.dW", heads) + ms("vit.av.fwd", heads))
    floor = BLOCKS * (forward + backward)
    out = {"forward_ms_per_block": forward, "backward_ms_per_block": backward, "gemm_floor_ms": floor}
    print(f"GEMMs of one ViT training step at batch {BATCH}, each at its measured rate alone:")
    print(f"  per block: forward {forward:.2f} ms, backward {backward:.2f} ms; {BLOCKS} blocks: {floor:.1f} ms")
    if a.step_ms:
        out["step_ms"] = a.step_ms
        out["not_gemm_ms"] = a.step_ms - floor
        print(f"  a step of {a.step_ms:.1f} ms: {a.step_ms - floor:.1f} ms ({(a.step_ms - floor) / a.step_ms:.0%}) beyond the GEMM floor")
    if a.pytorch_images_per_second:
        target = BATCH / (2 * a.pytorch_images_per_second) * 1e3
        out["two_x_pytorch_step_ms"] = target
        out["left_for_the_rest_ms"] = target - floor
        print(f"  2x PyTorch ({a.pytorch_images_per_second:.0f} images/s) is a step of {target:.1f} ms: "
              f"{target - floor:.1f} ms left for everything that is not a GEMM")
        if a.step_ms:
            print(f"  that is {(a.step_ms - floor) / max(target - floor, 1e-9):.1f}x less than the step spends on it now")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
