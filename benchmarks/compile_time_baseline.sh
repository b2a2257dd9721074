#!/usr/bin/env bash
# Compile time of an earlier revision, measured on today's machine, to set beside
# benchmarks/compile_time.sh's figures of the current tree. This VM's speed changes from day to
# day (the same unit has taken 1.6-2.2x longer on one day than on another), so a figure only
# compares with one measured in the same session; issue 20's targets were set from fe99a26.
# In a temporary git worktree of REV, best of N, g++ -O2, the flags of compile_time.sh:
#   readme      REV's README program, header-only, compile + link
#   umbrella    a unit that includes REV's <strata/strata.hpp> alone
#   tool        REV's own benchmarks/compile_time.sh (its definition of the mnist_cnn build:
#               at fe99a26, examples/mnist_cnn's two units in parallel + link, with CLI11 and
#               nlohmann-json, Debian's libcli11-dev and nlohmann-json3-dev: scripts/install-deps --bench)
# Prints a table; --json FILE writes the same figures.
#   benchmarks/compile_time_baseline.sh [--rev fe99a26] [--reps 3] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=fe99a26 reps=3 json=""
usage() { echo "usage: $0 [--rev REV] [--reps N] [--json FILE]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) [ $# -ge 2 ] || usage; rev=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || usage; reps=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "$0: --reps expects an integer in [1, 999], got '$reps'" >&2; exit 2; }
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "$0: no commit '$rev' in this repository" >&2; exit 2; }
source benchmarks/compile_common.sh
out=$(mktemp -d)
tree="$out/tree"
cleanup() { git worktree remove --force "$tree" >/dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
git worktree add --detach "$tree" "$rev" >/dev/null 2>&1
compile_flags "$tree/include"
readme_program "$tree/README.md" "$out/readme.cpp"
echo '#include <strata/strata.hpp>' > "$out/umbrella.cpp"
if grep -rqs 'CLI/CLI.hpp' "$tree/examples" "$tree/tools" && ! { [ -f /usr/include/CLI/CLI.hpp ] && [ -f /usr/include/nlohmann/json.hpp ]; }; then
  echo "$0: $rev's examples need CLI11 and nlohmann-json (Debian's libcli11-dev, nlohmann-json3-dev): run scripts/install-deps --bench" >&2
  exit 1
fi

seconds() { local a; a=$(now); "$@" >/dev/null; elapsed "$a" "$(now)"; }
readme=() umbrella=()
for i in $(seq "$reps"); do
  readme+=("$(seconds "$cxx" "${flags[@]}" "$out/readme.cpp" -o "$out/readme" "${libs[@]}")")
  umbrella+=("$(seconds "$cxx" "${flags[@]}" -c "$out/umbrella.cpp" -o "$out/umbrella.o")")
done
tool_table=""
if [ -x "$tree/benchmarks/compile_time.sh" ]; then
  tool_table=$(cd "$tree" && benchmarks/compile_time.sh --reps "$reps" --json "$out/tool.json")
fi

sha=$(git rev-parse --short "$rev")
printf '%-58s %-10s %s\n' "at $sha (this machine, now)" "best (s)" "runs (s)"
printf '%-58s %-10.2f %s\n' "README program, header-only (compile + link)" "$(best "${readme[@]}")" "${readme[*]}"
printf '%-58s %-10.2f %s\n' "#include <strata/strata.hpp> alone" "$(best "${umbrella[@]}")" "${umbrella[*]}"
[ -n "$tool_table" ] && { echo "its own benchmarks/compile_time.sh:"; echo "$tool_table"; }
if [ -n "$json" ]; then
  python3 - "$json" "$sha" "$($cxx --version | head -n1)" "${readme[*]}" "${umbrella[*]}" "$out/tool.json" <<'PY'
import json, os, sys
path, sha, compiler, readme, umbrella, tool = sys.argv[1:7]
runs = lambda s: [float(t) for t in s.split()]
doc = {"benchmark": "compile_time_baseline", "revision": sha, "compiler": compiler, "flags": "-O2",
       "load_average": os.getloadavg(),
       "readme_header_only": {"best_seconds": min(runs(readme)), "runs_seconds": runs(readme)},
       "umbrella": {"best_seconds": min(runs(umbrella)), "runs_seconds": runs(umbrella)},
       "own_compile_time_sh": json.load(open(tool)) if os.path.exists(tool) else None}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(path + ".tmp", path)
PY
fi
