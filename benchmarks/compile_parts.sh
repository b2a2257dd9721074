#!/usr/bin/env bash
# Where a program's compile time goes: each unit in benchmarks/compile_parts/ (one piece of the
# README program, or of the tool, alone) compiled with g++ -O2 from scratch, best of N wall
# seconds, with strata's compiled part (STRATA_SEPARATE_COMPILATION), and what it costs over the
# umbrella header. The umbrella is also measured header-only: the difference is what the
# headers' non-template definitions (impl/*.ipp) cost a unit that compiles them.
#   benchmarks/compile_parts.sh [--reps 3] [--rev REV] [--pch] [--json FILE]
#     --rev REV  measure the headers of git revision REV (a temporary worktree) instead of the
#                working tree's: the same units, before and after a change
#     --pch      also: a precompiled header of tools/strata_train_model.hpp (the seed CNN's
#                model, --model cnn) with the Pipeline and ParameterServer headers (its build
#                time and size), and each of strata_train's host units for that model compiled
#                with it and without it (a unit that defines a macro before its includes, as
#                strata_train_in_process.cpp does, cannot take it and is left out, saying so)
# Prints a table; --json FILE writes the same figures. compile_time.sh measures the targets.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
reps=3 rev="" json="" pch=0
usage() { echo "usage: $0 [--reps N] [--rev REV] [--pch] [--json FILE]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) [ $# -ge 2 ] || usage; reps=$2; shift 2 ;;
    --rev) [ $# -ge 2 ] || usage; rev=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    --pch) pch=1; shift ;;
    *) usage ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "$0: --reps expects an integer in [1, 999], got '$reps'" >&2; exit 2; }
out=$(mktemp -d)
tree=$repo
cleanup() {
  [ "$tree" != "$repo" ] && git -C "$repo" worktree remove --force "$tree" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
if [ -n "$rev" ]; then
  git -C "$repo" rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "$0: --rev: no commit '$rev'" >&2; exit 2; }
  tree="$out/tree"
  git -C "$repo" worktree add --detach --quiet "$tree" "$rev"
fi
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -fopenmp -I"$tree/include" $(pkg-config --cflags openblas) -DSTRATA_BLAS_OPENBLAS)
[ -f /usr/local/cuda/include/cccl/thrust/version.h ] && flags+=(-isystem /usr/local/cuda/include/cccl)
parts_dir="$repo/benchmarks/compile_parts"   # the units are this tree's; the headers --rev's
now() { date +%s.%N; }
# best wall seconds of compiling $1 with the extra flags after it
time_unit() {
  local f=$1 best="" s e t
  shift
  for _ in $(seq "$reps"); do
    s=$(now)
    "$cxx" "${flags[@]}" "$@" -c "$f" -o "$out/unit.o"
    e=$(now)
    t=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.2f", b - a }')
    if [ -z "$best" ] || awk -v t="$t" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$t; fi
  done
  echo "$best"
}
names=() secs=()
add() { names+=("$1"); secs+=("$2"); }
add "umbrella, header-only" "$(time_unit "$parts_dir/umbrella.cpp")"
base=$(time_unit "$parts_dir/umbrella.cpp" -DSTRATA_SEPARATE_COMPILATION)
add "umbrella" "$base"
for p in umbrella_trimmed network mirrored_path model_mirrored dataset_lines model_fit_evaluate ps_model; do
  add "$p" "$(time_unit "$parts_dir/$p.cpp" -DSTRATA_SEPARATE_COMPILATION)"
done

pch_rows=()
if [ "$pch" = 1 ]; then
  mpi=()
  command -v mpicxx >/dev/null 2>&1 && read -r -a mpi <<<"$(mpicxx --showme:compile) -DSTRATA_TRAIN_HAVE_MPI=1"
  # tools/meson.build's flags for one model's units (the seed CNN's).
  model=(-DSTRATA_TRAIN_MODEL=cnn -DSTRATA_TRAIN_SYNC_NET=0 -I "$tree/tools")
  printf '#include "%s/tools/strata_train_model.hpp"\n#include <strata/distribute/pipeline.hpp>\n#include <strata/distribute/parameter_server.hpp>\n' \
    "$tree" > "$out/all.hpp"
  s=$(now)
  "$cxx" "${flags[@]}" -DSTRATA_SEPARATE_COMPILATION "${mpi[@]}" "${model[@]}" -x c++-header "$out/all.hpp" -o "$out/all.hpp.gch"
  e=$(now)
  add "pch: build tools/strata_train_model.hpp + Pipeline + ParameterServer" "$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.2f", b - a }')"
  pch_mb=$(du -m "$out/all.hpp.gch" | cut -f1)
  for u in "$tree"/tools/strata_train_{in_process,pipeline,ps,mw}.cpp; do
    b=$(basename "$u" .cpp)
    [ "$b" = strata_train_mw ] && [ ${#mpi[@]} -eq 0 ] && continue
    if awk '/^#include/ { exit } /^#(define|undef)/ { found = 1; exit } END { exit !found }' "$u"; then
      echo "compile_parts.sh: $b defines a macro before its includes: a precompiled header -include'd first would change it; left out" >&2
      continue
    fi
    add "pch: $b without" "$(time_unit "$u" -DSTRATA_SEPARATE_COMPILATION "${mpi[@]}" "${model[@]}")"
    add "pch: $b with" "$(time_unit "$u" -DSTRATA_SEPARATE_COMPILATION "${mpi[@]}" "${model[@]}" -include "$out/all.hpp" -Winvalid-pch)"
  done
  pch_rows=("$pch_mb")
fi

label=${rev:-working tree}
printf 'headers of: %s (%s); g++ -O2, best of %s, wall seconds\n' "$label" "$(git -C "$tree" rev-parse --short HEAD)" "$reps"
printf '%-62s %9s %14s\n' "unit" "seconds" "over umbrella"
for i in "${!names[@]}"; do
  over=""
  case "${names[$i]}" in umbrella*|pch:*) ;; *) over=$(awk -v a="${secs[$i]}" -v b="$base" 'BEGIN { printf "%+.2f", a - b }') ;; esac
  printf '%-62s %9s %14s\n' "${names[$i]}" "${secs[$i]}" "$over"
done
[ ${#pch_rows[@]} -gt 0 ] && printf '%-62s %9s\n' "pch: size (MB)" "${pch_rows[0]}"

if [ -n "$json" ]; then
  python3 - "$json" "$label" "$(git -C "$tree" rev-parse HEAD)" "$reps" "$base" "${pch_rows[0]:-}" "${names[@]}" -- "${secs[@]}" <<'PY'
import json, os, sys
path, label, commit, reps, base, pch_mb = sys.argv[1:7]
rest = sys.argv[7:]
cut = rest.index("--")
names, secs = rest[:cut], [float(s) for s in rest[cut + 1:]]
doc = {"benchmark": "compile_parts", "headers_of": label, "commit": commit, "reps": int(reps), "flags": "-O2",
       "units": {n: {"best_seconds": s, **({} if n.startswith(("umbrella", "pch:")) else {"over_umbrella_seconds": round(s - float(base), 2)})}
                 for n, s in zip(names, secs)}}
if pch_mb:
    doc["pch_size_mb"] = int(pch_mb)
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(path + ".tmp", path)
PY
fi
