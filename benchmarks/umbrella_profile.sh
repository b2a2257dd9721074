#!/usr/bin/env bash
# Where the umbrella header's compile time goes: compiles, with g++ -O2 and the flags of
# benchmarks/compile_time.sh, a unit that includes the first header of strata/strata.hpp, then
# the first two, and so on, and reports for each prefix g++'s own -ftime-report totals: the
# memory its garbage-collected heap allocated (the same from run to run, so a change of a few MB
# is real) and the CPU seconds (user + system; they vary with the machine's load). The "added"
# columns are what each header brings on top of those before it (a header whose dependencies an
# earlier one already pulled adds only its own code).
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
: > "$out/unit.cpp"
: > "$out/rows"
for h in "${headers[@]}"; do
  echo "#include \"$h\"" >> "$out/unit.cpp"
  # g++ 12: " TOTAL : <user> <sys> <wall> <memory>k|M"
  total=$("$cxx" "${flags[@]}" -ftime-report -c "$out/unit.cpp" -o "$out/unit.o" 2>&1 | awk '$1 == "TOTAL" {print $3, $4, $6}')
  [ -n "$total" ] || { echo "$0: no -ftime-report TOTAL from $cxx for $h" >&2; exit 1; }
  echo "$h $total" >> "$out/rows"
done

python3 - "$out/rows" "$json" "$cxx" "${extra[*]:-}" <<'PY'
import json, platform, subprocess, sys
rows_path, json_path, cxx, extra = sys.argv[1:5]
def mb(text):
    unit = text[-1]
    value = float(text[:-1])
    return value / 1024 if unit == "k" else value if unit == "M" else value * 1024
rows, prev_mem, prev_cpu = [], 0.0, 0.0
for line in open(rows_path):
    header, user, system, memory = line.split()
    cpu, mem = float(user) + float(system), mb(memory)
    rows.append({"header": header, "cumulative_mb": round(mem, 1), "added_mb": round(mem - prev_mem, 1),
                 "cumulative_cpu_s": round(cpu, 2), "added_cpu_s": round(cpu - prev_cpu, 2)})
    prev_mem, prev_cpu = mem, cpu
mode = "compiled part (-DSTRATA_SEPARATE_COMPILATION)" if extra else "header-only"
print(f"strata/strata.hpp's headers included one after another, {mode}; g++ -O2 -ftime-report")
print(f"{'header':46} {'total MB':>9} {'added MB':>9} {'total cpu s':>12} {'added cpu s':>12}")
for r in rows:
    print(f"{r['header']:46} {r['cumulative_mb']:9.1f} {r['added_mb']:9.1f} {r['cumulative_cpu_s']:12.2f} {r['added_cpu_s']:12.2f}")
if json_path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    cpu_name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    with open(json_path, "w") as f:
        json.dump({"benchmark": "umbrella_profile", "mode": mode, "compiler": version, "cpu": cpu_name,
                   "flags": "-O2", "rows": rows}, f, indent=1)
    print(f"wrote {json_path}")
PY
