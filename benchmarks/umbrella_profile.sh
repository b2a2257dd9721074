#!/usr/bin/env bash
# Where the umbrella header's compile time goes: compiles, with g++ -O2 and the flags of
# benchmarks/compile_time.sh, a unit that includes the first header of strata/strata.hpp, then
# the first two, and so on, and reports for each prefix g++'s own -ftime-report totals: the
# memory its garbage-collected heap allocated (the same from run to run, so a change of a few MB
# is real) and the CPU seconds (user + system; they vary with the machine's load). The "added"
# columns are what each header brings on top of those before it (a header whose dependencies an
# earlier one already pulled adds only its own code).
# Then the same totals for Thrust's host systems alone (three units after strata/config.hpp: the
# execution-policy headers place.hpp included until the host got its own loops in
# place/algorithm.hpp, the algorithms strata uses with only their host systems' headers, one
# policy object), and how many of that object's headers are libcu++'s: what a host unit would
# parse if the host place ran on Thrust.
#   benchmarks/umbrella_profile.sh [--compiled] [--json FILE]
# --compiled defines STRATA_SEPARATE_COMPILATION (the program links libstrata; the headers then
# declare, and leave the definitions to the compiled part).
set -euo pipefail
cd "$(dirname "$0")/.."
json="" extra=()
usage() { echo "usage: $0 [--compiled] [--json FILE]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --compiled) extra=(-DSTRATA_SEPARATE_COMPILATION); shift ;;
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    *) usage ;;
  esac
done
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -fopenmp -Iinclude $(pkg-config --cflags openblas) -DSTRATA_BLAS_OPENBLAS "${extra[@]}")
[ -f /usr/local/cuda/include/cccl/thrust/version.h ] && flags+=(-isystem /usr/local/cuda/include/cccl)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

mapfile -t headers < <(sed -n 's/^#include "\(strata\/[^"]*\)"$/\1/p' include/strata/strata.hpp)
[ ${#headers[@]} -gt 0 ] || { echo "$0: no #include \"strata/...\" line in include/strata/strata.hpp" >&2; exit 1; }
# measure NAME UNIT: one line "NAME user sys memory" into $out/rows (g++ 12's -ftime-report line
# " TOTAL : <user> <sys> <wall> <memory>k|M"); a unit that does not compile stops the script
# with the compiler's message.
measure() {
  if ! "$cxx" "${flags[@]}" -ftime-report -c "$2" -o "$out/unit.o" > "$out/report" 2>&1; then
    echo "$0: $cxx failed on the unit for $1:" >&2; grep -v '^ ' "$out/report" | head -n 20 >&2; exit 1
  fi
  local total
  total=$(awk '$1 == "TOTAL" {print $3, $4, $6}' "$out/report")
  [ -n "$total" ] || { echo "$0: no -ftime-report TOTAL line from $cxx for $1" >&2; exit 1; }
  echo "$1 $total" >> "$out/rows"
}
: > "$out/unit.cpp"
: > "$out/rows"
for h in "${headers[@]}"; do
  echo "#include \"$h\"" >> "$out/unit.cpp"
  measure "$h" "$out/unit.cpp"
done

# Thrust's part, each unit alone after strata/config.hpp, with the serial system standing in for
# the device system (the CUDA one compiles only in nvcc): the two execution-policy headers
# place.hpp included; the Thrust algorithms strata's headers include for the CUDA place,
# each with only its cpp and OpenMP system's header; one policy object alone (detail/par.h).
policies='#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>'
algorithms=$(grep -rhoE '#include <thrust/[a-z_]+\.h>' include | sed -E 's/.*<thrust\/([a-z_]+)\.h>/\1/' \
  | grep -v -x functional | sort -u)
{ echo '#include <thrust/system/cpp/detail/execution_policy.h>'
  echo '#include <thrust/system/omp/detail/execution_policy.h>'
  for a in $algorithms; do
    echo "#include <thrust/system/cpp/detail/$a.h>"; echo "#include <thrust/system/omp/detail/$a.h>"
  done; } > "$out/algorithms.h"
par='#include <thrust/system/cpp/detail/par.h>'
for unit in policies algorithms par; do
  case $unit in
    policies) body=$policies ;; algorithms) body=$(cat "$out/algorithms.h") ;; par) body=$par ;;
  esac
  printf '#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP\n#include "strata/config.hpp"\n%s\n' "$body" \
    > "$out/thrust_$unit.cpp"
  measure "thrust:$unit" "$out/thrust_$unit.cpp"
done
# How many of the headers one policy object brings are libcu++'s (cuda/std/...).
"$cxx" "${flags[@]}" -H -fsyntax-only "$out/thrust_par.cpp" 2> "$out/par_headers" || true
par_headers=$(grep -cE '^\.+ ' "$out/par_headers" || true)
par_libcudacxx=$(grep -E '^\.+ ' "$out/par_headers" | grep -cE '/include/(cccl/)?cuda/' || true)
echo "thrust_headers $par_headers $par_libcudacxx $(echo $algorithms | tr ' ' ,)" > "$out/thrust"

python3 - "$out/rows" "$json" "$cxx" "${extra[*]:-}" "$out/thrust" <<'PY'
import json, platform, subprocess, sys
rows_path, json_path, cxx, extra, thrust_path = sys.argv[1:6]
def mb(text):
    unit = text[-1]
    value = float(text[:-1])
    return value / 1024 if unit == "k" else value if unit == "M" else value * 1024
rows, thrust, prev_mem, prev_cpu = [], [], 0.0, 0.0
for line in open(rows_path):
    name, user, system, memory = line.split()
    cpu, mem = float(user) + float(system), mb(memory)
    if name.startswith("thrust:"):
        thrust.append({"unit": name[len("thrust:"):], "mb": round(mem, 1), "cpu_s": round(cpu, 2)})
        continue
    rows.append({"header": name, "cumulative_mb": round(mem, 1), "added_mb": round(mem - prev_mem, 1),
                 "cumulative_cpu_s": round(cpu, 2), "added_cpu_s": round(cpu - prev_cpu, 2)})
    prev_mem, prev_cpu = mem, cpu
_, par_headers, par_libcudacxx, algorithms = open(thrust_path).read().split()
mode = "compiled part (-DSTRATA_SEPARATE_COMPILATION)" if extra else "header-only"
print(f"strata/strata.hpp's headers included one after another, {mode}; g++ -O2 -ftime-report")
print(f"{'header':46} {'total MB':>9} {'added MB':>9} {'total cpu s':>12} {'added cpu s':>12}")
for r in rows:
    print(f"{r['header']:46} {r['cumulative_mb']:9.1f} {r['added_mb']:9.1f} {r['cumulative_cpu_s']:12.2f} {r['added_cpu_s']:12.2f}")
what = {"policies": "cpp and omp execution_policy.h (as place.hpp)",
        "algorithms": "strata's Thrust algorithms, cpp and omp headers only",
        "par": "one policy object: cpp/detail/par.h"}
print(f"\nThrust's host systems alone, after strata/config.hpp (algorithms: {algorithms})")
print(f"{'unit':56} {'MB':>7} {'cpu s':>7}")
for t in thrust:
    print(f"{what[t['unit']]:56} {t['mb']:7.1f} {t['cpu_s']:7.2f}")
print(f"cpp/detail/par.h includes {par_headers} headers, {par_libcudacxx} of them libcu++'s (cuda/...)")
if json_path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    cpu_name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    with open(json_path, "w") as f:
        json.dump({"benchmark": "umbrella_profile", "mode": mode, "compiler": version, "cpu": cpu_name,
                   "flags": "-O2", "rows": rows, "thrust_units": thrust, "thrust_algorithms": algorithms.split(","),
                   "par_headers": int(par_headers), "par_libcudacxx_headers": int(par_libcudacxx)}, f, indent=1)
    print(f"wrote {json_path}")
PY
