#!/usr/bin/env bash
# How far the README program's header-only build is from its target by optimisation level alone:
# the README's first program (extracted from README.md, as compile_time.sh does) compiled and
# linked header-only from scratch with the same flags as compile_time.sh but for the level, at
# -O0, -Og, -O1, -Os and -O2 (the one compile_time.sh measures), best of N wall seconds each,
# the levels alternated within each round. A level's time bounds what any reorganisation of the
# same code could reach at -O2 while the unit still compiles that code: issue 20's "README
# program header-only <= 8 s" needs less code in the unit, not cheaper code, when even -O1 is
# near it. Also prints the unit's code size (`size`, text) at each level, and the front end's
# time alone (`front-end`: the same -O2 command with -fsyntax-only: parsing and instantiating,
# no code generated), which no level goes below; and, of the -O2 program, the bytes of all its
# functions and its five largest (`nm -C --size-sort -S`): whether one piece of code is the lever.
#   benchmarks/compile_opt_levels.sh [--reps 3] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/compile_common.sh
start_readme_benchmark "usage: $0 [--reps N] [--json FILE]" "$@"

levels=(-O0 -Og -O1 -Os -O2 front-end)
declare -A runs text
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for _ in $(seq "$reps"); do
  for lv in "${levels[@]}"; do
    if [ "$lv" = front-end ]; then
      s=$(now); "$cxx" "${flags[@]}" -fsyntax-only "$out/readme.cpp"; e=$(now)
      text[$lv]=null
    else
      f=("${flags[@]/#-O2/$lv}")  # compile_common.sh's flags with the level replaced
      s=$(now); "$cxx" "${f[@]}" "$out/readme.cpp" -o "$out/readme$lv" "${libs[@]}"; e=$(now)
      text[$lv]=$(size "$out/readme$lv" | awk 'NR == 2 { print $1 }')
    fi
    runs[$lv]="${runs[$lv]:-} $(elapsed "$s" "$e")"
  done
done

printf '%-9s %-9s %-12s %s\n' "level" "best (s)" "text (bytes)" "runs (s)"
for lv in "${levels[@]}"; do
  read -r -a ts <<<"${runs[$lv]}"
  printf '%-9s %-9.2f %-12s %s\n' "$lv" "$(best "${ts[@]}")" "${text[$lv]/null/-}" "${ts[*]}"
done
nm -C --size-sort -S "$out/readme-O2" | awk '$3 ~ /^[tTwW]$/' > "$out/functions.txt"
function_bytes=$(python3 -c 'import sys; print(sum(int(l.split()[1], 16) for l in open(sys.argv[1])))' "$out/functions.txt")
echo "functions of the -O2 program: $function_bytes bytes in $(wc -l < "$out/functions.txt"); the five largest:"
tail -n 5 "$out/functions.txt" | while read -r _ size _ name; do printf '  %6d  %s\n' "$((16#$size))" "${name:0:150}"; done
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
    printf '  },\n  "o2_function_bytes": %s,\n  "o2_largest_function_bytes": %s,\n' "$function_bytes" "$((16#$(tail -n 1 "$out/functions.txt" | cut -d' ' -f2)))"
    printf '  "load_average_before_after": "%s -> %s"\n}\n' "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$json"
  echo "wrote $json"
fi
