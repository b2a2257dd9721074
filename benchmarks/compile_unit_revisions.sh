#!/usr/bin/env bash
# Compile time of one unit of a build, before and after a change: the build's own command for
# UNIT (`ninja -t commands`, so its exact flags) run on git revision REV's sources (a temporary
# worktree) and on the working tree's, alternating, N times each. Prints each run's wall seconds
# and the median of each side; --json FILE writes the same.
#   benchmarks/compile_unit_revisions.sh REV BUILD_DIR SOURCE [--reps 2] [--json FILE]
#   benchmarks/compile_unit_revisions.sh 8870eb9 build-bench tools/strata_train_tensor_parallel.cpp
# BUILD_DIR is a configured Meson build of the working tree (-Dcheck_build=false to measure what
# users compile); SOURCE the unit's path relative to the repository root. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 REV BUILD_DIR SOURCE [--reps N] [--json FILE]" >&2; exit 2; }
[ $# -ge 3 ] || usage
rev=$1 build=$2 source=$3
shift 3
reps=2 json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) [ $# -ge 2 ] || usage; reps=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "$0: --reps expects an integer in [1, 999], got '$reps'" >&2; exit 2; }
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "$0: no commit '$rev'" >&2; exit 2; }
[ -f "$build/build.ninja" ] || { echo "$0: $build is not a configured build (meson setup $build)" >&2; exit 2; }
[ -f "$source" ] || { echo "$0: no file $source" >&2; exit 2; }
repo=$(pwd)
cmd=$(cd "$build" && ninja -t commands | grep -F -- "../$source" | grep -- " -c " | head -n 1 || true)
[ -n "$cmd" ] || { echo "$0: $build has no compile command for $source" >&2; exit 2; }
out=$(mktemp -d)
cleanup() {
  git worktree remove --force "$out/before" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
git worktree add --detach --quiet "$out/before" "$rev"
# The same command, its object and dependency files moved out of the build, and for REV every
# path into the repository (../include, ../tools, ...) pointed at the worktree.
after=$(echo "$cmd" | sed -E "s# -o [^ ]+# -o $out/after.o#; s# -MF [^ ]+# -MF $out/after.d#")
before=$(echo "$after" | sed -E "s#\.\./#$out/before/#g; s#$out/after#$out/before-unit#g")
run() {  # $1: command; prints wall seconds
  local s e
  s=$(date +%s.%N)
  (cd "$build" && eval "$1") >/dev/null 2>"$out/err" || { cat "$out/err" >&2; echo "$0: the compile failed" >&2; exit 1; }
  e=$(date +%s.%N)
  echo "$e - $s" | bc
}
b=() a=()
for ((i = 1; i <= reps; ++i)); do
  t=$(run "$before"); b+=("$t"); echo "run $i: $rev ${t} s"
  t=$(run "$after"); a+=("$t"); echo "run $i: working tree ${t} s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
mb=$(median "${b[@]}") ma=$(median "${a[@]}")
echo "$source: median ${mb} s at $rev, ${ma} s in the working tree ($reps runs each, alternating; load average $(cut -d' ' -f1-3 /proc/loadavg))"
if [ -n "$json" ]; then
  python3 - "$json" "$rev" "$source" "$mb" "$ma" "${b[*]}" "${a[*]}" <<'EOF'
import json, sys
path, rev, source, mb, ma, b, a = sys.argv[1:]
json.dump({"benchmark": "compile_unit_revisions", "unit": source, "revision": rev,
           "before_seconds": [float(x) for x in b.split()], "after_seconds": [float(x) for x in a.split()],
           "before_median": float(mb), "after_median": float(ma)}, open(path, "w"), indent=1)
print("wrote", path)
EOF
fi
