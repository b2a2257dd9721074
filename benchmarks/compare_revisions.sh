#!/usr/bin/env bash
# Training speed before and after a change, side by side: builds tools/mnist_cnn as scripts/demo
# does (Meson, release, strata's compiled part, no CUDA) from git revision REV (a temporary
# worktree) and from the working tree, then runs the given mnist_cnn flags with each, in turn,
# N times. Prints each run and the best train images/s and the test accuracy of each build;
# --json FILE writes the same. The data: data/mnist (scripts/fetch-mnist).
#   benchmarks/compare_revisions.sh REV [--reps 3] [--json FILE] -- MNIST_CNN_FLAGS...
#   benchmarks/compare_revisions.sh 80ef45c -- --strategy parameter_server --sync sync --workers 2 --epochs 1 --steps-per-epoch 150
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
usage() { echo "usage: $0 REV [--reps N] [--json FILE] -- MNIST_CNN_FLAGS..." >&2; exit 2; }
[ $# -ge 1 ] || usage
rev=$1
shift
reps=3 json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) [ $# -ge 2 ] || usage; reps=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "$0: --reps expects an integer in [1, 999], got '$reps'" >&2; exit 2; }
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "$0: no commit '$rev'" >&2; exit 2; }
[ -f data/mnist/train-images-idx3-ubyte ] || scripts/fetch-mnist data/mnist
out=$(mktemp -d)
cleanup() {
  git worktree remove --force "$out/before" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
git worktree add --detach --quiet "$out/before" "$rev"
build() {  # $1: source tree, $2: build dir
  meson setup "$2" "$1" --buildtype=release -Dtests=false -Dexamples=true -Dbenchmarks=false -Dcuda=disabled >/dev/null
  meson compile -C "$2" mnist_cnn >/dev/null
}
echo "building tools/mnist_cnn at $rev and at the working tree ..."
build "$out/before" "$out/build-before"
build "$repo" "$out/build-after"
printf '%-8s %-4s %18s %14s\n' build run "train images/s" "test accuracy"
for i in $(seq "$reps"); do
  for b in before after; do
    "$out/build-$b/tools/mnist_cnn" "$@" --data "$repo/data/mnist" --verbose 0 --json "$out/$b-$i.json" >/dev/null
    python3 - "$out/$b-$i.json" "$b" "$i" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("%-8s %-4s %18.1f %14.4f" % (sys.argv[2], sys.argv[3], d["train_images_per_second"], d["test_accuracy"]))
PY
  done
done
python3 - "$out" "$reps" "$rev" "$(git rev-parse HEAD)" "${json:-}" "$*" <<'PY'
import json, os, sys
out, reps, rev, head, path, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
doc = {"benchmark": "compare_revisions", "flags": flags, "before": rev, "after": "working tree at " + head, "reps": reps}
for b in ("before", "after"):
    runs = [json.load(open(f"{out}/{b}-{i}.json")) for i in range(1, reps + 1)]
    ips = [r["train_images_per_second"] for r in runs]
    doc[b] = {"train_images_per_second": ips, "best_train_images_per_second": max(ips),
              "test_accuracy": [r["test_accuracy"] for r in runs]}
    print("%-8s best %.1f images/s, test accuracy %s" % (b, max(ips), sorted(set(doc[b]["test_accuracy"]))))
if path:
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
PY
