#!/usr/bin/env bash
# Compile-fail check: compiles FILE with the given compiler command (-fsyntax-only), expects the
# compilation to fail, and expects every "// expect: TEXT" line of FILE to appear in the
# diagnostics. Exit 0 when both hold, 1 otherwise (with the reason).
set -u
file=$1; shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$@" -fsyntax-only "$file" >"$log" 2>&1; then
  echo "FAIL: $file compiled, but it must not"
  exit 1
fi
status=0
while IFS= read -r want; do
  if ! grep -qF -- "$want" "$log"; then
    echo "FAIL: $file: the diagnostics do not contain: $want"
    status=1
  fi
done < <(sed -n 's|^// expect: ||p' "$file")
if ! grep -q '^// expect: ' "$file"; then
  echo "FAIL: $file has no '// expect:' line"
  status=1
fi
if [ $status -ne 0 ]; then
  echo "---- compiler output ----"
  head -c 4000 "$log"
else
  echo "ok: $file fails to compile with the expected message"
fi
exit $status
