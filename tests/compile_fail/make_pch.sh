#!/usr/bin/env bash
# Compiles HEADER into the precompiled header GCH with the compile-fail cases' command (tests/
# compile_fail/meson.build), writing ninja's depfile DEP (the headers it holds) for STAMP, the
# target ninja tracks, so that the .gch is compiled again when one of them changes.
#   make_pch.sh STAMP DEP GCH HEADER COMPILER FLAGS...
set -euo pipefail
stamp=$1 dep=$2 gch=$3 header=$4
shift 4
mkdir -p "$(dirname "$gch")"
rm -f "$gch"
# A temporary name, then a rename: a case compiled meanwhile never reads half a .gch.
"$@" -x c++-header "$header" -o "$gch.tmp.$$" -MD -MF "$dep" -MT "$stamp"
mv -f "$gch.tmp.$$" "$gch"
touch "$stamp"
