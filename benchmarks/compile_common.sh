# Sourced by benchmarks/compile_time.sh and benchmarks/compile_time_baseline.sh, so that both
# measure the same program with the same flags and the same clock.
#   compile_flags INCLUDE_DIR   sets cxx, flags (g++ -O2, OpenMP, OpenBLAS, CCCL where found), libs
#   readme_program README OUT   writes README's first C++ listing (the program users copy) to OUT
#   now; elapsed A B; best T...  a timestamp; B - A in seconds (2 decimals); the least of the times
#   two_core_bound T...        the least time two workers can build units of times T... in, each
#                               unit whole on one of them (the best split into two queues): what
#                               no build order beats, before the link
#   start_readme_benchmark USAGE ARG...  what compile_time.sh and compile_opt_levels.sh start
#                               with: reps (3) and json ("") from their only flags, --reps N and
#                               --json FILE (anything else prints USAGE and exits 2); compile_flags
#                               for the working tree; out, a scratch folder removed on exit, with
#                               the README's program in $out/readme.cpp
compile_flags() {
  cxx=${CXX:-g++}
  flags=(-std=c++20 -O2 -fopenmp -I"$1" $(pkg-config --cflags openblas) -DSTRATA_BLAS_OPENBLAS)
  [ -f /usr/local/cuda/include/cccl/thrust/version.h ] && flags+=(-isystem /usr/local/cuda/include/cccl)
  libs=(-fopenmp -lopenblas)
}
readme_program() {
  python3 - "$1" "$2" <<'PY'
import re, sys
m = re.search(r"```cpp\n(.*?)```", open(sys.argv[1]).read(), re.S)
if not m: sys.exit(f"{sys.argv[1]} has no C++ listing")
open(sys.argv[2], "w").write(m.group(1))
PY
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
best() { printf '%s\n' "$@" | sort -n | head -n1; }
two_core_bound() {
  python3 -c '
import itertools, sys
t = [float(a) for a in sys.argv[1:]]
print("%.2f" % min(max(sum(s), sum(t) - sum(s)) for r in range(len(t) + 1) for s in itertools.combinations(t, r)))' "$@"
}
start_readme_benchmark() {
  local usage=$1
  shift
  reps=3 json=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --reps) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; reps=$2; shift 2 ;;
      --json) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; json=$2; shift 2 ;;
      *) echo "$usage" >&2; exit 2 ;;
    esac
  done
  [[ "$reps" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "$0: --reps expects an integer in [1, 999], got '$reps'" >&2; exit 2; }
  compile_flags include
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  readme_program README.md "$out/readme.cpp"
}
