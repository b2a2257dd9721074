#!/usr/bin/env bash
# Packaging checks: a tiny consumer project builds against strata in one of three ways.
#   run.sh subproject SRC   strata as a Meson subproject (dependency('strata') via override)
#   run.sh pkgconfig SRC    strata installed by `meson install`, found through strata.pc
#   run.sh plain SRC        a plain compiler line: -I include plus the flags docs/building.md lists
set -euo pipefail
mode=$1
src=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/consumer" "$work/consumer"
cccl=/usr/local/cuda/include/cccl
blas_cflags=$(pkg-config --cflags openblas 2>/dev/null || true)

case "$mode" in
  subproject)
    mkdir -p "$work/consumer/subprojects/strata"
    cp -r "$src/meson.build" "$src/meson_options.txt" "$src/include" "$work/consumer/subprojects/strata/"
    meson setup "$work/build" "$work/consumer" --force-fallback-for=strata >"$work/setup.log" 2>&1 ||
      { cat "$work/setup.log"; exit 1; }
    meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
    "$work/build/consumer"
    ;;
  pkgconfig)
    meson setup "$work/strata-build" "$src" --prefix="$work/prefix" -Dtests=false -Dexamples=false \
      -Dbenchmarks=false -Dcuda=disabled >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
    meson install -C "$work/strata-build" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
    pc=$(dirname "$(find "$work/prefix" -name strata.pc | head -n1)")
    [ -n "$pc" ] || { echo "meson install wrote no strata.pc"; exit 1; }
    export PKG_CONFIG_PATH="$pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    echo "strata.pc: $(pkg-config --cflags --libs strata)"
    meson setup "$work/build" "$work/consumer" >"$work/setup2.log" 2>&1 || { cat "$work/setup2.log"; exit 1; }
    meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
    "$work/build/consumer"
    # And straight from the command line, as a Makefile would.
    ${CXX:-c++} -O2 $(pkg-config --cflags strata) "$work/consumer/consumer.cpp" -o "$work/consumer-direct" $(pkg-config --libs strata)
    "$work/consumer-direct"
    ;;
  plain)
    extra=()
    [ -f "$cccl/thrust/version.h" ] && extra=(-isystem "$cccl")
    ${CXX:-c++} -std=c++20 -O2 -fopenmp -I "$src/include" "${extra[@]}" $blas_cflags -DSTRATA_BLAS_OPENBLAS \
      "$work/consumer/consumer.cpp" -o "$work/consumer-plain" -lopenblas
    "$work/consumer-plain"
    ;;
  *) echo "usage: run.sh subproject|pkgconfig|plain SRC_ROOT"; exit 2 ;;
esac
