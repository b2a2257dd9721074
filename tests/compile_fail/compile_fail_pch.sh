#!/usr/bin/env bash
# The compile-fail cases take the precompiled umbrella (tests/compile_fail/meson.build): GCC's -H
# lists each header it reads, and marks with '!' a precompiled header it used. Checks that CASE,
# compiled as the cases are, uses GCH; then, the negative control, that the same case with a
# macro the umbrella reads defined first (STRATA_SEPARATE_COMPILATION) does not.
#   compile_fail_pch.sh GCH CASE COMPILER FLAGS...
set -u
gch=$1 case=$2
shift 2
[ -f "$gch" ] || { echo "FAIL: no precompiled header at $gch"; exit 1; }
out=$("$@" -H -fsyntax-only "$case" 2>&1)
if ! grep -qF "! $gch" <<<"$out"; then
  echo "FAIL: $case did not take $gch; the headers it read first:"
  grep -E '^\.+ |^! ' <<<"$out" | head -n 5
  exit 1
fi
out=$("$@" -DSTRATA_SEPARATE_COMPILATION -H -fsyntax-only "$case" 2>&1)
if grep -qF "! $gch" <<<"$out"; then
  echo "FAIL: $case took $gch with STRATA_SEPARATE_COMPILATION defined, which the header was compiled without"
  exit 1
fi
echo "ok: $case takes $gch, and does not with another macro"
