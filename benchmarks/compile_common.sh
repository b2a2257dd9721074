# Sourced by benchmarks/compile_time.sh and benchmarks/compile_time_baseline.sh, so that both
# measure the same program with the same flags and the same clock.
#   compile_flags INCLUDE_DIR   sets cxx, flags (g++ -O2, OpenMP, OpenBLAS, CCCL where found), libs
#   readme_program README OUT   writes README's first C++ listing (the program users copy) to OUT
#   now; elapsed A B; best T...  a timestamp; B - A in seconds (2 decimals); the least of the times
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
