#!/usr/bin/env bash
# The CPU time of each test of the suite (user + sys of the test's command and every process it
# waited for), to see where a CPU-bound `scripts/test` spends its cores (docs/benchmarks.md,
# "The test suite's time"). Runs `meson test` in BUILD (already built: --no-rebuild) with a
# wrapper that times each test's command with /usr/bin/time, then prints them, largest first.
#   benchmarks/suite_cpu.sh BUILD [meson test args...]      e.g. benchmarks/suite_cpu.sh build --no-suite headers
# The build's own CPU time is in BUILD/.ninja_log (benchmarks/suite_time.py BUILD prints it).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUILD [meson test args...]" >&2; exit 2; }
build=$1
shift
[ -f "$build/build.ninja" ] || { echo "$0: $build is not a configured build folder" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "$0: needs /usr/bin/time (Debian: apt-get install time)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/wrap" <<'WRAP'
#!/usr/bin/env bash
# "wall user sys command" of one test, appended to $SUITE_CPU_LOG
t=$(mktemp)
/usr/bin/time -o "$t" -f "%e %U %S" "$@"
rc=$?
echo "$(cat "$t") $*" >> "$SUITE_CPU_LOG"
rm -f "$t"
exit $rc
WRAP
chmod +x "$work/wrap"
export SUITE_CPU_LOG="$work/log"
: > "$SUITE_CPU_LOG"
set +e
meson test -C "$build" --no-rebuild --wrapper "$work/wrap" --num-processes "$(nproc)" "$@" > "$work/meson.txt" 2>&1
status=$?
set -e
tail -n 8 "$work/meson.txt"
python3 - "$SUITE_CPU_LOG" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    p = line.split(maxsplit=3)
    if len(p) < 4:
        continue
    wall, user, sys_ = map(float, p[:3])
    rows.append((user + sys_, wall, user, sys_, p[3].strip()))
rows.sort(reverse=True)
print(f"{'cpu s':>8} {'wall s':>8} {'user':>8} {'sys':>8}  command")
for cpu, wall, user, sys_, cmd in rows:
    print(f"{cpu:8.1f} {wall:8.1f} {user:8.1f} {sys_:8.1f}  {cmd[:140]}")
print(f"{sum(r[0] for r in rows):8.1f} {sum(r[1] for r in rows):8.1f}  all {len(rows)} tests")
PY
exit $status
