#!/usr/bin/env bash
# The CUDA unit of tools/mnist_cnn (tools/mnist_cnn_gpu.cu, --device gpu) compiled by nvcc with
# the flags tools/meson.build gives it (sm_90, as the GPU builds use), once each way:
#   as built   with the compiled parts, libstrata's and the CUDA place's (libstrata_cuda,
#              -DSTRATA_SEPARATE_COMPILATION_CUDA): src/strata_cuda.cu is compiled once
#              beforehand, its time reported and not counted
#   without    with libstrata's compiled part alone, as before libstrata_cuda
# For each object, the kernels it compiles: the host stubs nvcc writes, one per kernel
# instantiation (local text symbols named __device_stub__..., counted with nm). Prints a table;
# --json FILE writes the same figures. Needs nvcc (NVCC=..., else PATH, else /usr/local/cuda).
#   benchmarks/nvcc_units.sh [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
json=""
usage() { echo "usage: $0 [--json FILE]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    *) usage ;;
  esac
done
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "$0: nvcc not found (set NVCC, or put it on PATH; looked at $nvcc)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

read -r -a blas_flags <<<"$(pkg-config --cflags openblas)"
flags=(-std=c++20 -O2 -gencode "arch=compute_90,code=sm_90" --extended-lambda -Xcompiler -fopenmp -Iinclude
       "${blas_flags[@]}" -DSTRATA_BLAS_OPENBLAS -DSTRATA_SEPARATE_COMPILATION)
now() { date +%s.%N; }
# compile NAME EXTRA_FLAGS... SOURCE: sets seconds[NAME] and kernels[NAME]; a failure stops the
# script with nvcc's message (a figure for a unit that did not compile would be meaningless).
declare -A seconds kernels
compile() {
  local name=$1 s e
  s=$(now)
  if ! "$nvcc" "${flags[@]}" "${@:2}" -o "$out/$name.o" 2>"$out/$name.log"; then
    echo "$0: nvcc failed on ${*: -1} ($name):" >&2; head -c 2000 "$out/$name.log" >&2; exit 1
  fi
  e=$(now)
  seconds[$name]=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.2f", b - a }')
  kernels[$name]=$(nm "$out/$name.o" | awk '$2 ~ /^[tT]$/ && $3 ~ /__device_stub__/' | wc -l)
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
compile libstrata_cuda -c src/strata_cuda.cu
compile as_built -DSTRATA_SEPARATE_COMPILATION_CUDA -DSTRATA_TRAIN_MODEL=cnn -DSTRATA_TRAIN_SYNC_NET=0 -c tools/strata_train_gpu.cu
compile without -DSTRATA_TRAIN_MODEL=cnn -DSTRATA_TRAIN_SYNC_NET=0 -c tools/strata_train_gpu.cu
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

printf '%-62s %9s %8s\n' "unit (nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_90, once)" "seconds" "kernels"
printf '%-62s %9s %8s\n' "tools/mnist_cnn_gpu.cu as built (with libstrata_cuda)" "${seconds[as_built]}" "${kernels[as_built]}"
printf '%-62s %9s %8s\n' "tools/mnist_cnn_gpu.cu without libstrata_cuda" "${seconds[without]}" "${kernels[without]}"
printf '%-62s %9s %8s\n' "  src/strata_cuda.cu (libstrata_cuda), once per build" "${seconds[libstrata_cuda]}" "${kernels[libstrata_cuda]}"
printf '%-62s %s -> %s\n' "load average (1, 5, 15 min) before -> after" "$load_before" "$load_after"

if [ -n "$json" ]; then
  python3 - "$json" "$("$nvcc" --version | tail -n1)" "$load_before -> $load_after" \
    "${seconds[as_built]}" "${kernels[as_built]}" "${seconds[without]}" "${kernels[without]}" \
    "${seconds[libstrata_cuda]}" "${kernels[libstrata_cuda]}" <<'PY'
import json, os, sys
path, nvcc, load = sys.argv[1:4]
f = sys.argv[4:]
unit = lambda s, k: {"seconds": float(s), "kernels": int(k)}
doc = {"benchmark": "nvcc_units", "nvcc": nvcc, "arch": "sm_90", "flags": "-O2", "runs": 1,
       "kernels_counted_as": "local text symbols __device_stub__* in the object (nm), one per kernel instantiation",
       "mnist_cnn_gpu": unit(f[0], f[1]), "mnist_cnn_gpu_without_cuda_part": unit(f[2], f[3]),
       "libstrata_cuda_once": unit(f[4], f[5]), "target_seconds": 50, "load_average_before_after": load}
with open(path + ".tmp", "w") as out:
    json.dump(doc, out, indent=1)
    out.write("\n")
os.replace(path + ".tmp", path)
PY
fi
