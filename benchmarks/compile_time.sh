#!/usr/bin/env bash
# Compile time is part of the product. Measures, with g++ -O2 from scratch, best of N runs:
#   readme     the README's first program (the seed CNN, Mirrored, fit, evaluate), extracted
#              from README.md so that it is always the program users copy; compile + link
#   compiled   the README program with the compiled part (STRATA_SEPARATE_COMPILATION: libstrata
#              built once beforehand, not counted, then linked)
#   readme_pch, compiled_pch  the same two with the umbrella as a precompiled header
#              (docs/building.md, "A precompiled header"; built once beforehand per mode, its
#              time reported, not counted, and checked to be used: g++ -H marks it with "!")
#   umbrella   a translation unit that includes <strata/strata.hpp> and nothing else
#              (benchmarks/compile_parts/umbrella.cpp)
#   floor      what no change to strata's own code can go below: a unit with only the system
#              headers strata's headers include (the standard library, Thrust, CBLAS, OpenMP,
#              found with g++ -H on the umbrella), and a unit with the seed CNN's network alone
#              (compile_parts/network.cpp: Network<Net> forward and backward, with the compiled
#              part): its layers' kernels,
#              specialised on the network's shapes, are compiled in the unit that uses them
#   mnist_cnn  every host unit of tools/mnist_cnn (every strategy and sync mode it offers;
#              MultiWorkerMirrored's unit too where MPI is found) as tools/meson.build builds
#              them: with the compiled part (libstrata built once beforehand, not counted; where
#              MPI is found, libstrata_mpi too, and the units define STRATA_SEPARATE_COMPILATION_MPI),
#              two at a time as `meson compile -j 2` would on this 2-core machine, then linked
#   mnist_cnn_header_only  the same units header-only, beside
#   units      each unit alone, both ways (the slowest one bounds the parallel build)
#   nvcc       tools/strata_train_gpu.cu (--device gpu, the seed CNN), where nvcc is found, once, with its own
#              target (no slower than the ~50 s one CUDA model unit took): as built (with the
#              CUDA place's compiled part, libstrata_cuda, built once beforehand, its time
#              reported) and without it, with the kernels each compiles (benchmarks/nvcc_units.sh)
# Prints a table; --json FILE writes the same figures (and the machine, compiler and flags).
#   benchmarks/compile_time.sh [--reps 3] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/compile_common.sh
start_readme_benchmark "usage: $0 [--reps N] [--json FILE]" "$@"  # out/readme.cpp: the README's first C++ listing
# The floor: the system headers the umbrella's strata headers include directly (g++ -H prints
# the include tree, one dot per level), and the seed CNN's network alone.
"$cxx" "${flags[@]}" -H -fsyntax-only benchmarks/compile_parts/umbrella.cpp 2>&1 >/dev/null | python3 -c '
import sys
stack, seen = [], []
for line in sys.stdin:
    dots = len(line) - len(line.lstrip("."))
    if dots == 0 or not line[dots:].startswith(" "):
        continue
    path = line[dots:].strip()
    del stack[dots - 1:]
    parent = stack[-1] if stack else ""
    if "/strata/" in parent and "/strata/" not in path:
        for root in ("/c++/12/", "/cccl/", "/include/"):
            if root in path:
                name = path.split(root, 1)[1]
                break
        if name not in seen:
            seen.append(name)
    stack.append(path)
print("#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP")
for n in seen:
    print(f"#include <{n}>")
print("int main() { return 0; }")' > "$out/system.cpp"

# tools/mnist_cnn's host units (as tools/meson.build lists them, without CUDA) and their flags.
# (strata_train's driver and mnist_cnn's main, then the seed CNN's model units, -DSTRATA_TRAIN_MODEL=cnn.)
units=(tools/mnist_cnn.cpp tools/strata_train_driver.cpp tools/strata_train_in_process.cpp tools/strata_train_ps.cpp
       tools/strata_train_pipeline.cpp)
flags+=(-DSTRATA_TRAIN_MODEL=cnn -DSTRATA_TRAIN_SYNC_NET=0)
mpi_flags=() mpi_libs=()
if command -v mpicxx >/dev/null 2>&1; then
  read -r -a mpi_flags <<<"$(mpicxx --showme:compile)"
  read -r -a mpi_libs <<<"$(mpicxx --showme:link)"
  mpi_flags+=(-DSTRATA_TRAIN_HAVE_MPI=1)
  units+=(tools/strata_train_mw.cpp)
fi

load_before=$(cut -d' ' -f1-3 /proc/loadavg)  # the machine may be shared: say how busy it was

# The compiled part, once (a library a project builds once and links on every edit); where MPI
# is found, the MPI code's compiled part too (libstrata_mpi, as tools/meson.build links it).
"$cxx" "${flags[@]}" -DSTRATA_SEPARATE_COMPILATION -c src/strata.cpp -o "$out/libstrata.o"
compiled_lib=("$out/libstrata.o") compiled_flags=(-DSTRATA_SEPARATE_COMPILATION)
if [ ${#mpi_flags[@]} -gt 0 ]; then
  "$cxx" "${flags[@]}" "${mpi_flags[@]}" -DSTRATA_SEPARATE_COMPILATION -DSTRATA_SEPARATE_COMPILATION_MPI \
    -c src/strata_mpi.cpp -o "$out/libstrata_mpi.o"
  compiled_lib=("$out/libstrata_mpi.o" "$out/libstrata.o")
  compiled_flags+=(-DSTRATA_SEPARATE_COMPILATION_MPI)
fi

# The umbrella as a precompiled header, once per mode (header-only, compiled part), the way
# docs/building.md shows: g++ -x c++-header on a one-line header, then -include. A .gch the
# compiler refuses (flags that differ) is silently skipped, so check it is used.
pch_build=()
for m in header_only compiled; do
  d="$out/pch-$m" mf=()
  [ "$m" = compiled ] && mf=(-DSTRATA_SEPARATE_COMPILATION)
  mkdir -p "$d"
  echo '#include <strata/strata.hpp>' > "$d/strata_pch.hpp"
  s=$(now); "$cxx" "${flags[@]}" "${mf[@]}" -x c++-header "$d/strata_pch.hpp" -o "$d/strata_pch.hpp.gch"
  pch_build+=("$(elapsed "$s" "$(now)")")
  "$cxx" "${flags[@]}" "${mf[@]}" -include "$d/strata_pch.hpp" -Winvalid-pch -H -fsyntax-only "$out/readme.cpp" 2>&1 |
    grep -q "^! .*strata_pch\.hpp\.gch$" || { echo "$0: g++ did not use the precompiled header in $d" >&2; exit 1; }
done

# Builds tools/mnist_cnn's units two at a time (this machine's cores), then links; appends the
# wall time to the array named $2 and each unit's time to the map named $3. $1 suffixes the
# objects; the arguments after $3 are extra flags (with them, the compiled part: libstrata, and
# libstrata_mpi where MPI is found, is linked in).
build_mnist() {
  local tag=$1 extra=("${@:4}") s e u b lib=()
  local -n times=$2 per_unit=$3
  [ ${#extra[@]} -gt 0 ] && lib=("${compiled_lib[@]}")
  s=$(now)
  printf '%s\n' "${units[@]}" | xargs -P 2 -I{} sh -c '
    u="$1"; shift; a=$(date +%s.%N)
    "$@" -c "$u" -o "'"$out"'/$(basename "$u" .cpp)'"$tag"'.o"
    b=$(date +%s.%N); awk -v a="$a" -v b="$b" "BEGIN { printf \"%.2f\", b - a }" > "'"$out"'/$(basename "$u" .cpp)'"$tag"'.t"' \
    _ {} "$cxx" "${flags[@]}" "${extra[@]}" "${mpi_flags[@]}"
  local objs=()
  for u in "${units[@]}"; do objs+=("$out/$(basename "$u" .cpp)$tag.o"); done
  "$cxx" "${objs[@]}" "${lib[@]}" -o "$out/mnist_cnn$tag" "${libs[@]}" "${mpi_libs[@]}"
  e=$(now)
  times+=("$(elapsed "$s" "$e")")
  for u in "${units[@]}"; do
    b=$(basename "$u" .cpp)
    per_unit[$b]="${per_unit[$b]:-} $(cat "$out/$b$tag.t")"
  done
}

readme=() compiled=() readme_pch=() compiled_pch=() umbrella=() mnist=() mnist_c=() system=() network=()
declare -A unit_times unit_times_c
for i in $(seq "$reps"); do
  s=$(now); "$cxx" "${flags[@]}" "$out/readme.cpp" -o "$out/readme" "${libs[@]}"; e=$(now)
  readme+=("$(elapsed "$s" "$e")")
  s=$(now); "$cxx" "${flags[@]}" -DSTRATA_SEPARATE_COMPILATION "$out/readme.cpp" "$out/libstrata.o" -o "$out/readme-c" "${libs[@]}"; e=$(now)
  compiled+=("$(elapsed "$s" "$e")")
  s=$(now); "$cxx" "${flags[@]}" -include "$out/pch-header_only/strata_pch.hpp" "$out/readme.cpp" -o "$out/readme-p" "${libs[@]}"; e=$(now)
  readme_pch+=("$(elapsed "$s" "$e")")
  s=$(now); "$cxx" "${flags[@]}" -DSTRATA_SEPARATE_COMPILATION -include "$out/pch-compiled/strata_pch.hpp" "$out/readme.cpp" \
    "$out/libstrata.o" -o "$out/readme-cp" "${libs[@]}"; e=$(now)
  compiled_pch+=("$(elapsed "$s" "$e")")
  s=$(now); "$cxx" "${flags[@]}" -c benchmarks/compile_parts/umbrella.cpp -o "$out/umbrella.o"; e=$(now)
  umbrella+=("$(elapsed "$s" "$e")")
  s=$(now); "$cxx" "${flags[@]}" -c "$out/system.cpp" -o "$out/system.o"; e=$(now)
  system+=("$(elapsed "$s" "$e")")
  s=$(now); "$cxx" "${flags[@]}" -DSTRATA_SEPARATE_COMPILATION -c benchmarks/compile_parts/network.cpp -o "$out/network.o"; e=$(now)
  network+=("$(elapsed "$s" "$e")")
  build_mnist "" mnist unit_times
  build_mnist -c mnist_c unit_times_c "${compiled_flags[@]}"
done

# The unit nvcc compiles for --device gpu, where nvcc is found: benchmarks/nvcc_units.sh (as
# built, with libstrata_cuda compiled once beforehand and not counted, and without it; once each,
# with the kernels each object compiles).
nvcc_note="nvcc not found" nvcc_json="{}"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ -x "$nvcc" ]; then
  if NVCC="$nvcc" benchmarks/nvcc_units.sh --json "$out/nvcc.json" >"$out/nvcc.txt" 2>&1; then
    nvcc_json=$(cat "$out/nvcc.json")
    nvcc_note=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); a, w, l = d["mnist_cnn_gpu"], d["mnist_cnn_gpu_without_cuda_part"], d["libstrata_cuda_once"]; print("tools/mnist_cnn_gpu.cu: {} s, {} kernels as built (target: no slower than ~50 s); {} s, {} kernels without libstrata_cuda; libstrata_cuda once: {} s".format(a["seconds"], a["kernels"], w["seconds"], w["kernels"], l["seconds"]))' "$out/nvcc.json")
  else
    nvcc_note="benchmarks/nvcc_units.sh failed: $(head -c 300 "$out/nvcc.txt" | tr -d '"\\\n\t')"
  fi
fi

printf '%-58s %-9s %-8s %s\n' "target" "best (s)" "target" "runs (s)"
printf '%-58s %-9.2f %-8s %s\n' "README program, header-only (compile + link)" "$(best "${readme[@]}")" "<= 8" "${readme[*]}"
printf '%-58s %-9.2f %-8s %s\n' "README program, with the compiled part (compile + link)" "$(best "${compiled[@]}")" "<= 5" "${compiled[*]}"
printf '%-58s %-9.2f %-8s %s\n' "README program, header-only, precompiled umbrella" "$(best "${readme_pch[@]}")" "" "${readme_pch[*]}"
printf '%-58s %-9.2f %-8s %s\n' "README program, compiled part + precompiled umbrella" "$(best "${compiled_pch[@]}")" "" "${compiled_pch[*]}"
printf '%-58s %s\n' "  (the precompiled umbrella, built once: header-only, compiled part)" "${pch_build[*]} s"
printf '%-58s %-9.2f %-8s %s\n' "#include <strata/strata.hpp> alone" "$(best "${umbrella[@]}")" "<= 2.5" "${umbrella[*]}"
printf '%-58s %-9.2f %-8s %s\n' "  floor: the system headers strata includes, alone" "$(best "${system[@]}")" "" "${system[*]}"
printf '%-58s %-9.2f %-8s %s\n' "  floor: the seed CNN's network alone (compiled part)" "$(best "${network[@]}")" "" "${network[*]}"
printf '%-58s %-9.2f %-8s %s\n' "tools/mnist_cnn as built (compiled part), ${#units[@]} units by 2 + link" "$(best "${mnist_c[@]}")" "<= 15" "${mnist_c[*]}"
printf '%-58s %-9.2f %-8s %s\n' "tools/mnist_cnn header-only, ${#units[@]} units by 2 + link" "$(best "${mnist[@]}")" "" "${mnist[*]}"
for u in "${units[@]}"; do
  b=$(basename "$u" .cpp)
  read -r -a ts <<<"${unit_times[$b]}"
  printf '%-58s %-9.2f %-8s %s\n' "  $u alone" "$(best "${ts[@]}")" "" "${ts[*]}"
done
for u in "${units[@]}"; do
  b=$(basename "$u" .cpp)
  read -r -a ts <<<"${unit_times_c[$b]}"
  printf '%-58s %-9.2f %-8s %s\n' "  $u alone, compiled part" "$(best "${ts[@]}")" "" "${ts[*]}"
done
unit_bests=()
for u in "${units[@]}"; do
  read -r -a ts <<<"${unit_times_c[$(basename "$u" .cpp)]}"
  unit_bests+=("$(best "${ts[@]}")")
done
split_c=$(two_core_bound "${unit_bests[@]}")
printf '%-58s %-9.2f\n' "  the units' best split over 2 cores (no order beats it)" "$split_c"
printf '%-58s %s\n' "nvcc units" "$nvcc_note"
printf '%-58s %s -> %s\n' "load average (1, 5, 15 min) before -> after" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)"

if [ -n "$json" ]; then
  unit_json=$(for u in "${units[@]}"; do b=$(basename "$u" .cpp); echo "$u=${unit_times[$b]}"; done)
  unit_json_c=$(for u in "${units[@]}"; do b=$(basename "$u" .cpp); echo "$u=${unit_times_c[$b]}"; done)
  python3 - "$json" "$($cxx --version | head -n1)" "$(nproc)" "${readme[*]}" "${compiled[*]}" "${umbrella[*]}" "${mnist[*]}" "$nvcc_note" "$unit_json" "${mnist_c[*]}" "$unit_json_c" "$load_before -> $(cut -d' ' -f1-3 /proc/loadavg)" "${system[*]}" "${network[*]}" "${readme_pch[*]}" "${compiled_pch[*]}" "${pch_build[*]}" "$nvcc_json" "$split_c" <<'PY'
import json, os, platform, sys
path, compiler, cores = sys.argv[1], sys.argv[2], int(sys.argv[3])
readme, compiled, umbrella, mnist = ([float(t) for t in a.split()] for a in sys.argv[4:8])
nvcc_note = sys.argv[8]
def unit_table(text):
    out = {}
    for line in text.splitlines():
        name, _, times = line.partition("=")
        out[name] = [float(t) for t in times.split()]
    return out
units = unit_table(sys.argv[9])
mnist_c = [float(t) for t in sys.argv[10].split()]
units_c = unit_table(sys.argv[11])
load_average = sys.argv[12]
system, network, readme_pch, compiled_pch, pch_build = ([float(t) for t in a.split()] for a in sys.argv[13:18])
nvcc = json.loads(sys.argv[18])
split_c = float(sys.argv[19])
cpu = ""
try:
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
except (OSError, StopIteration):
    pass
doc = {"benchmark": "compile_time", "compiler": compiler, "flags": "-O2", "cores": cores, "cpu": cpu,
       "readme_program": {"best_seconds": min(readme), "runs_seconds": readme, "target_seconds": 8},
       "readme_program_compiled_part": {"best_seconds": min(compiled), "runs_seconds": compiled, "target_seconds": 5},
       "readme_program_pch": {"best_seconds": min(readme_pch), "runs_seconds": readme_pch,
                              "precompiled_header_build_seconds": pch_build[0]},
       "readme_program_compiled_part_pch": {"best_seconds": min(compiled_pch), "runs_seconds": compiled_pch,
                                            "precompiled_header_build_seconds": pch_build[1]},
       "umbrella_header": {"best_seconds": min(umbrella), "runs_seconds": umbrella, "target_seconds": 2.5},
       "floor_system_headers": {"best_seconds": min(system), "runs_seconds": system},
       "floor_seed_cnn_network_compiled_part": {"best_seconds": min(network), "runs_seconds": network},
       "mnist_cnn_header_only": {"best_seconds": min(mnist), "runs_seconds": mnist,
                     "jobs": 2, "units": {u: {"best_seconds": min(t), "runs_seconds": t} for u, t in units.items()}},
       "mnist_cnn": {"best_seconds": min(mnist_c), "runs_seconds": mnist_c, "jobs": 2, "target_seconds": 15,
                     "as_built": "with the compiled part (tools/meson.build links libstrata, and libstrata_mpi where MPI is found)",
                     "units_best_two_core_split_seconds": split_c,
                                   "units": {u: {"best_seconds": min(t), "runs_seconds": t} for u, t in units_c.items()}},
       "load_average_before_after": load_average,
       "nvcc_units": nvcc_note, "nvcc": nvcc}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(path + ".tmp", path)
PY
fi
