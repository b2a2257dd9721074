#!/usr/bin/env bash
# How far the README program's header-only build is from its target by optimisation level alone:
# the README's first program (extracted from README.md, as compile_time.sh does) compiled and
# linked header-only from scratch with the same flags as compile_time.sh but for the level, at
# -O0, -Og, -O1, -Os and -O2 (the one compile_time.sh measures), best of N wall seconds each,
# the levels alternated within each round. A level's time bounds what any reorganisation of the
# same code could reach at -O2 while the unit still compiles that code: issue 20's "README
# program header-only <= 8 s" needs less code in the unit, not cheaper code, when even -O1 is
# near it. Also prints the unit's code size (`size`, text) at each level.
#   benchmarks/compile_opt_levels.sh [--reps 3] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/compile_common.sh
start_readme_benchmark "usage: $0 [--reps N] [--json FILE]" "$@"

levels=(-O0 -Og -O1 -Os -O2)
declare -A runs text
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for _ in $(seq "$reps"); do
  for lv in "${levels[@]}"; do
    f=("${flags[@]/#-O2/$lv}")  # compile_common.sh's flags with the level replaced
    s=$(now); "$cxx" "${f[@]}" "$out/readme.cpp" -o "$out/readme$lv" "${libs[@]}"; e=$(now)
    runs[$lv]="${runs[$lv]:-} $(elapsed "$s" "$e")"
    text[$lv]=$(size "$out/readme$lv" | awk 'NR == 2 { print $1 }')
  done
done

printf '%-8s %-9s %-12s %s\n' "level" "best (s)" "text (bytes)" "runs (s)"
for lv in "${levels[@]}"; do
  read -r -a ts <<<"${runs[$lv]}"
  printf '%-8s %-9.2f %-12s %s\n' "$lv" "$(best "${ts[@]}")" "${text[$lv]}" "${ts[*]}"
done
printf '%s %s -> %s\n' "load average (1, 5, 15 min) before -> after:" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)"

if [ -n "$json" ]; then
  {
    printf '{\n  "benchmark": "compile_opt_levels",\n  "program": "README.md first C++ listing, header-only, compile + link",\n'
    printf '  "compiler": "%s",\n  "cores": %s,\n  "levels": {\n' "$("$cxx" --version | head -n1)" "$(nproc)"
    i=0
    for lv in "${levels[@]}"; do
      read -r -a ts <<<"${runs[$lv]}"
      i=$((i + 1)); sep=","; [ $i -eq ${#levels[@]} ] && sep=""
      printf '    "%s": {"best_seconds": %s, "runs_seconds": [%s], "text_bytes": %s}%s\n' \
        "$lv" "$(best "${ts[@]}")" "$(printf '%s\n' "${ts[@]}" | paste -sd, | sed 's/,/, /g')" "${text[$lv]}" "$sep"
    done
    printf '  },\n  "load_average_before_after": "%s -> %s"\n}\n' "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$json"
  echo "wrote $json"
fi
