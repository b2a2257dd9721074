#!/usr/bin/env bash
# The parameter server's results, to compare bit for bit before and after a change to its core
# (distribute/path/parameter_server.hpp and its parts): builds nothing; runs every sync mode of
# tools/strata_train (--strategy parameter_server) under both clocks, with and without a
# straggler model, in one process and across 4 MPI processes, each with --save and --json, and
# benchmarks/ps_study's deterministic parts (runtime and mnist: the virtual clock) with --json.
#   benchmarks/ps_bitexact.sh BUILD_DIR OUT_DIR [MNIST_DIR]      (MNIST_DIR default: data/mnist)
#   benchmarks/ps_bitexact.sh --compare BEFORE_DIR AFTER_DIR
# Compare: `cmp` on every .safetensors file; the JSON figures, all but the wall-clock ones.
# Real-clock runs use configurations whose result does not depend on timing (Synchronous with
# 2 workers: a sum of two gradients is the same in either order; one worker).
set -euo pipefail

if [ "${1:-}" = "--compare" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 --compare BEFORE_DIR AFTER_DIR" >&2; exit 2; }
  a=$2 b=$3 bad=0 n=0
  for f in "$a"/*.safetensors; do
    n=$((n + 1))
    if cmp -s "$f" "$b/$(basename "$f")"; then echo "same  $(basename "$f")"; else echo "DIFF  $(basename "$f")"; bad=1; fi
  done
  python3 - "$a" "$b" <<'EOF' || bad=1
import json, math, os, sys
a, b = sys.argv[1], sys.argv[2]
# Wall-clock figures: not reproducible from run to run.
timing = ("images_per_second", "wall", "elapsed", "compile", "per_second", "ms", "time_s", "throughput", "machine",
          "updates_per_second", "vs_sync", "real", "train_seconds")
def walk(x, y, path, out):
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            if any(t in k for t in timing): continue
            walk(x.get(k), y.get(k), path + "." + k, out)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)): walk(u, v, f"{path}[{i}]", out)
    elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
        out.append(f"{path}: {x!r} -> {y!r}")
bad = 0
for f in sorted(os.listdir(a)):
    if not f.endswith(".json"): continue
    x, y = json.load(open(os.path.join(a, f))), json.load(open(os.path.join(b, f)))
    if "seconds" in x and x.get("clock") == "real": x.pop("seconds"); y.pop("seconds", None)
    diffs = []
    walk(x, y, "", diffs)
    print(("same  " if not diffs else "DIFF  ") + f + "".join("\n      " + d for d in diffs[:10]))
    bad |= bool(diffs)
sys.exit(bad)
EOF
  [ $bad -eq 0 ] && echo "bit-exact: every file the same" || echo "DIFFERENCES (above)"
  exit $bad
fi

[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR [MNIST_DIR] | --compare BEFORE_DIR AFTER_DIR" >&2; exit 2; }
build=$1 out=$2 data=${3:-data/mnist}
mkdir -p "$out"
export OMP_WAIT_POLICY=passive
train="$build/tools/strata_train"
common=(--data "$data" --strategy parameter_server --epochs 1 --steps-per-epoch 5 --batch-size 16 --seed 7 --verbose 0
        --threads 1)

run() {  # NAME FLAGS...
  local name=$1; shift
  echo "== $name: $*"
  "$train" "${common[@]}" "$@" --save "$out/$name.safetensors" --json "$out/$name.json" > "$out/$name.log" 2>&1 ||
    { echo "   failed: $(tail -3 "$out/$name.log")"; return 1; }
}

# Every mode under the virtual clock, with a straggler model (3 workers, 2 servers, sharded).
v=(--workers 3 --servers 2 --shards 2 --clock virtual --straggler sexp:5:10)
run v_sync         "${v[@]}" --sync sync
run v_ksync        "${v[@]}" --sync ksync --k 2
run v_kbatch_sync  "${v[@]}" --sync kbatch_sync --k 2
run v_kasync       "${v[@]}" --sync kasync --k 2
run v_kbatch_async "${v[@]}" --sync kbatch_async --k 2
run v_async        "${v[@]}" --sync async
run v_async_b1     "${v[@]}" --sync async --staleness 1
run v_async_b0     "${v[@]}" --sync async --staleness 0
run v_ksync_slow   --workers 3 --servers 1 --clock virtual --straggler slow:1:4 --sync ksync --k 1
run v_kbs_none     --workers 4 --servers 1 --clock virtual --sync kbatch_sync --k 3
run v_kasync_exp   --workers 4 --servers 2 --clock virtual --straggler exp:10 --sync kasync --k 1
# The real clock where timing cannot change the result.
run r_sync         --workers 2 --servers 2 --clock real --sync sync
run r_sync_slow    --workers 2 --servers 1 --clock real --straggler slow:1:2 --sync sync
run r_async_1      --workers 1 --servers 1 --clock real --sync async
run r_kbasync_1    --workers 1 --servers 2 --clock real --sync kbatch_async --k 1

# Across processes: 1 coordinator, 1 server, 2 workers (mpirun -np 4).
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_hwloc_base_binding_policy=none
  for m in "kbatch_sync --k 1" "ksync --k 1" "kasync --k 1" "async --staleness 1" "sync"; do
    name="mpi_$(echo "$m" | cut -d' ' -f1)"
    echo "== $name: mpirun -np 4 ... --sync $m"
    # shellcheck disable=SC2086
    mpirun -np 4 "$train" "${common[@]}" --workers 2 --servers 1 --clock virtual --straggler exp:5 --sync $m \
      --save "$out/$name.safetensors" --json "$out/$name.json" > "$out/$name.log" 2>&1 ||
      echo "   failed: $(tail -3 "$out/$name.log")"
  done
fi

# ps_study's virtual-clock parts (the real part measures wall time).
study="$build/benchmarks/ps_study"
echo "== ps_study runtime"
OMP_NUM_THREADS=1 "$study" --part runtime --updates 200 --json "$out/ps_study_runtime.json" > "$out/ps_study_runtime.log" 2>&1
echo "== ps_study mnist"
OMP_NUM_THREADS=1 "$study" --part mnist --data "$data" --mnist-updates 40 --eval-every 20 --json "$out/ps_study_mnist.json" \
  > "$out/ps_study_mnist.log" 2>&1
echo "done: $out"
