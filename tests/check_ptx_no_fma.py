#!/usr/bin/env python3
"""Compiles a .cu file to PTX with nvcc (default flags: -fmad=true, as strata's CUDA units are
built) and fails if any kernel in it contains a fused multiply-add (fma.*), naming the kernel.

Used on tests/cuda_random_kernels.cu: Philox initialisation must round like the host, which does
not contract a*b+c. Runs wherever nvcc is found; needs no GPU.
    check_ptx_no_fma.py --nvcc NVCC --arch 90 --include DIR FILE.cu
"""
import argparse
import re
import subprocess
import sys
import tempfile
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--arch", default="90")
    ap.add_argument("--include", action="append", default=[])
    ap.add_argument("source")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "out.ptx")
        cmd = [a.nvcc, "-std=c++20", f"-arch=sm_{a.arch}", "-ptx", a.source, "-o", ptx]
        for inc in a.include:
            cmd += ["-I", inc]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"nvcc failed ({r.returncode}):\n{r.stderr}", file=sys.stderr)
            return 1
        text = open(ptx).read()
    kernels = re.split(r"^\.visible \.entry ", text, flags=re.M)[1:]
    if not kernels:
        print("no kernel found in the PTX", file=sys.stderr)
        return 1
    bad = 0
    for k in kernels:
        name = k.split("(", 1)[0]
        n = len(re.findall(r"\bfma\.", k))
        print(f"{name}: {n} fma instruction(s)")
        bad += n > 0
    print(f"{len(kernels) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
