#!/usr/bin/env bash
# A unit of a Meson build compiled both ways, alternated: with strata's compiled part (as the
# build compiles it: -DSTRATA_SEPARATE_COMPILATION) and header-only (the same command without
# the macro). The command comes from the build's compile_commands.json, so the flags are the
# build's own (-O3, -march=native, ...). Prints each run's wall and user seconds; --json FILE
# writes them.
#   benchmarks/compile_modes.sh [--reps 2] [--json FILE] BUILD_DIR OBJECT...
#   benchmarks/compile_modes.sh build-host tests/test_training.p/test_training.cpp.o
set -euo pipefail
reps=2 json=""
usage() { echo "usage: $0 [--reps N] [--json FILE] BUILD_DIR OBJECT..." >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) [ $# -ge 2 ] || usage; reps=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || usage
[[ "$reps" =~ ^[1-9][0-9]?$ ]] || { echo "$0: --reps expects an integer in [1, 99], got '$reps'" >&2; exit 2; }
build=$1; shift
[ -f "$build/compile_commands.json" ] || { echo "$0: no compile_commands.json in '$build' (meson setup it first)" >&2; exit 2; }
python3 - "$build" "$reps" "$json" "$@" <<'PY'
import json, os, resource, shlex, subprocess, sys, tempfile, time
build, reps, out_json, objects = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
commands = {e["output"]: e for e in json.load(open(os.path.join(build, "compile_commands.json")))}
tmp = tempfile.mkdtemp()
results = []
print(f"{'object':<58} {'mode':<13} {'wall (s)':>9} {'user (s)':>9}")
for obj in objects:
    if obj not in commands:
        sys.exit(f"compile_modes.sh: '{obj}' is not an object of {build} (see its compile_commands.json)")
    e = commands[obj]
    argv = shlex.split(e["command"])
    # The object and dependency outputs go to a scratch folder, not into the build.
    for flag in ("-o", "-MF", "-MQ"):
        while flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    argv = [a for a in argv if a != "-MD"] + ["-o", os.path.join(tmp, "unit.o")]
    if "-DSTRATA_SEPARATE_COMPILATION" not in argv:
        sys.exit(f"compile_modes.sh: '{obj}' is not compiled with the compiled part (no -DSTRATA_SEPARATE_COMPILATION)")
    modes = {"compiled part": argv,
             "header-only": [a for a in argv if a not in ("-DSTRATA_SEPARATE_COMPILATION", "-DSTRATA_SEPARATE_COMPILATION_MPI")]}
    for _ in range(reps):
        for mode, cmd in modes.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
            start = time.monotonic()
            subprocess.run(cmd, cwd=e["directory"], check=True)
            wall = time.monotonic() - start
            user = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
            print(f"{obj:<58} {mode:<13} {wall:>9.2f} {user:>9.2f}", flush=True)
            results.append({"object": obj, "mode": mode, "wall_s": round(wall, 2), "user_s": round(user, 2)})
if out_json:
    with open(out_json, "w") as f:
        json.dump({"build": build, "reps": reps, "load_average": os.getloadavg(), "runs": results}, f, indent=1)
PY
