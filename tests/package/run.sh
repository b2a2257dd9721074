#!/usr/bin/env bash
# Packaging checks: a tiny consumer project builds against strata in one of five ways.
#   run.sh subproject SRC   strata as a Meson subproject (dependency('strata') via override)
#   run.sh wrap SRC         strata fetched by Meson through packaging/strata.wrap (wrap-git, from a
#                           git repository made of SRC's files), found by dependency('strata')
#   run.sh pkgconfig SRC    strata installed by `meson install`, found through strata.pc
#   run.sh cmake SRC        strata installed by `meson install`, found by CMake's
#                           find_package(strata CONFIG) as the target strata::strata
#   run.sh plain SRC        a plain compiler line: -I include plus the flags docs/building.md lists
# Each mode with the suffix _compiled uses the compiled part instead (STRATA_SEPARATE_COMPILATION:
# dependency('strata-compiled'), strata-compiled.pc, the CMake target strata::compiled, or
# src/strata.cpp on the command line);
# the consumer then checks that it runs the library's code ("compiled part" in its output).
# Each of subproject, cmake and plain (header-only or _compiled) with the further suffix _pch
# builds the consumer with strata's umbrella as a precompiled header (subproject: beside the
# plain consumer, in one project, so that it covers the mode without _pch too), the way docs/building.md
# ("A precompiled header") shows: Meson's cpp_pch, CMake's target_precompile_headers, or g++
# -x c++-header and -include. g++ -H must show the .gch in use (its line starts with "!"), and
# -Winvalid-pch must say nothing: a header the compiler found but refused fails the check.
# subproject_mpi_compiled, pkgconfig_mpi_compiled and cmake_mpi_compiled build mpi_consumer/ (a
# ProcessGroup's all-reduce) against the MPI code's compiled part too
# (dependency('strata-mpi-compiled'), strata-mpi-compiled.pc, strata::mpi_compiled) and run it under mpirun -np 2 where mpirun is found: every rank must
# say that it ran libstrata_mpi's code.
#
# The consumers are compiled without optimisation (-O0, no debug information), strata's compiled
# part in them too: these checks are about how strata is found, flagged and linked, not about
# speed, and -O0 takes 40% less compiler time than the -O2 a user's release build would (the
# consumer: 14.5 s against 24.0 s). Each mode works in its own temporary folder, so the suite
# runs them side by side; the modes that install strata share one installation (install_strata),
# made under a lock by whichever comes first.
set -euo pipefail
mode=$1
compiled=0 mpi=0 pch=0
case "$mode" in *_pch) pch=1; mode=${mode%_pch} ;; esac
case "$mode" in *_mpi_compiled) mpi=1; mode=${mode%_mpi_compiled}_compiled ;; esac
case "$mode" in *_compiled) compiled=1; mode=${mode%_compiled} ;; esac
src=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=() ranks=1
if [ "$mpi" = 1 ]; then
  case "$mode" in subproject|pkgconfig|cmake) ;; *) echo "run.sh: no MPI check for $mode"; exit 2 ;; esac
  cp -r "$here/mpi_consumer" "$work/consumer"
  if command -v mpirun >/dev/null; then
    launch=(mpirun -np 2) ranks=2
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  fi
else
  cp -r "$here/consumer" "$work/consumer"
fi
if [ "$compiled" = 1 ] && [ "$mpi" = 0 ]; then
  sed -i "s|dependency('strata', fallback: \['strata', 'strata_dep'\])|dependency('strata-compiled', fallback: ['strata', 'strata_compiled_dep'])|" \
    "$work/consumer/meson.build"
  grep -q "strata-compiled" "$work/consumer/meson.build" || { echo "consumer/meson.build changed; update run.sh"; exit 1; }
fi
expect=header-only
[ "$compiled" = 1 ] && expect="compiled part"
check() {  # runs the consumer (on every rank) and checks which mode it was built in
  local out
  out=$("${launch[@]}" "$@") || { echo "$out"; exit 1; }
  echo "$out"
  [ "$(grep -c "($expect)" <<<"$out")" = "$ranks" ] || { echo "the consumer was not built $expect (on each of $ranks ranks)"; exit 1; }
}
blas_cflags=$(pkg-config --cflags openblas 2>/dev/null || true)
consumer_opts=(-Doptimization=0 -Ddebug=false)
if [ "$pch" = 1 ]; then
  case "$mode" in subproject|cmake|plain) ;; *) echo "run.sh: no precompiled-header check for $mode"; exit 2 ;; esac
  [ "$mpi" = 0 ] || { echo "run.sh: no precompiled-header check for the MPI consumer"; exit 2; }
fi
# check_pch LOG GCH_PATTERN: the compiler's -H output in LOG shows a precompiled header matching
# GCH_PATTERN in use ("! path.gch"), and no -Winvalid-pch warning (a .gch found but not used).
check_pch() {
  if grep -qF "[-Winvalid-pch]" "$1"; then
    echo "FAIL: the compiler refused the precompiled header:"; grep -F "[-Winvalid-pch]" "$1"; exit 1
  fi
  grep -qE "^! .*$2\$" "$1" || { echo "FAIL: no unit used the precompiled header $2:"; tail -n 40 "$1"; exit 1; }
  echo "precompiled header used: $(grep -E "^! .*$2\$" "$1" | head -n1 | cut -c3-)"
}

# strata installed by `meson install` (headers, libstrata and libstrata_mpi, strata*.pc, the CMake
# files) into $1. The pkgconfig and cmake modes share one installation per state of the sources
# when STRATA_PACKAGE_CACHE names a folder (the suite sets it to one in its build tree): it is
# rebuilt whenever a file under include/, src/ or packaging/ or a build file changes, and is used
# only once its install finished.
install_strata() {
  local dest=$1 key cache
  if [ -z "${STRATA_PACKAGE_CACHE:-}" ]; then
    meson setup "$work/strata-build" "$src" --prefix="$dest" -Dtests=false -Dexamples=false \
      -Dbenchmarks=false -Dcuda=disabled -Doptimization=0 -Ddebug=false >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
    meson install -C "$work/strata-build" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
    return
  fi
  key=$(cd "$src" && find meson.build meson_options.txt include src packaging -type f -print0 | sort -z |
        xargs -0 sha256sum | sha256sum | cut -c1-16)
  cache="$STRATA_PACKAGE_CACHE/$key"
  mkdir -p "$STRATA_PACKAGE_CACHE"
  # Side by side, the modes take turns: the first installs, the others wait for it and copy.
  exec 9>"$STRATA_PACKAGE_CACHE.lock"
  flock 9
  if [ ! -f "$cache/complete" ]; then
    find "$STRATA_PACKAGE_CACHE" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    mkdir -p "$cache"
    meson setup "$cache/build" "$src" --prefix="$cache/prefix" -Dtests=false -Dexamples=false \
      -Dbenchmarks=false -Dcuda=disabled -Doptimization=0 -Ddebug=false >"$work/setup.log" 2>&1 ||
      { cat "$work/setup.log"; exit 1; }
    meson install -C "$cache/build" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
    touch "$cache/complete"
    echo "installed strata once for the package checks: $cache/prefix"
  fi
  cp -a "$cache/prefix" "$dest"
  exec 9>&-
}

# strata_object FLAGS...: prints the path of src/strata.cpp compiled with FLAGS (-c). With
# STRATA_PACKAGE_CACHE, one object per state of the sources and flags, made under the cache's
# lock by whichever mode comes first; without it, in this mode's own folder.
strata_object() {
  local key dir
  if [ -z "${STRATA_PACKAGE_CACHE:-}" ]; then
    ${CXX:-c++} "$@" -c "$src/src/strata.cpp" -o "$work/strata.o" >&2
    echo "$work/strata.o"
    return
  fi
  key=$( (cd "$src" && find include src -type f -print0 | sort -z | xargs -0 sha256sum; echo "${CXX:-c++} $*") |
        sha256sum | cut -c1-16)
  dir="$STRATA_PACKAGE_CACHE-objects"
  mkdir -p "$dir"
  exec 8>"$dir.lock"
  flock 8
  if [ ! -f "$dir/$key.o" ]; then
    find "$dir" -mindepth 1 -maxdepth 1 -name '*.o' -delete  # an older state's objects
    ${CXX:-c++} "$@" -c "$src/src/strata.cpp" -o "$dir/$key.o.tmp" >&2
    mv "$dir/$key.o.tmp" "$dir/$key.o"
    echo "compiled src/strata.cpp once for the plain compiled checks: $dir/$key.o" >&2
  fi
  exec 8>&-
  echo "$dir/$key.o"
}

# After a plain `meson compile` of a consumer with strata as a subproject: strata's libraries
# were built only where the consumer links them (a header-only consumer compiles nothing of
# strata's).
only_what_is_linked() {
  local built want=""
  built=$(cd "$work/build" && find subprojects -name '*.a' | sort | tr '\n' ' ')
  [ "$compiled" = 1 ] && want="subprojects/strata/libstrata.a "
  [ "$mpi" = 1 ] && want="subprojects/strata/libstrata.a subprojects/strata/libstrata_mpi.a "
  [ "$built" = "$want" ] || { echo "FAIL: the subproject built '${built% }', where the consumer needs '${want% }'"; exit 1; }
  echo "the subproject built only what the consumer links: ${want:-nothing}"
}

case "$mode" in
  subproject)
    mkdir -p "$work/consumer/subprojects/strata"
    cp -r "$src/meson.build" "$src/meson_options.txt" "$src/include" "$src/src" "$work/consumer/subprojects/strata/"
    setup_args=()
    if [ "$pch" = 1 ]; then
      # Beside the plain consumer, the same program with the umbrella as its precompiled header
      # (-H shows it used), in the same project: strata's libraries are built once for both, so
      # this mode also covers the mode without _pch (the suite runs this one, not both).
      mkdir -p "$work/consumer/pch"
      echo '#include <strata/strata.hpp>' > "$work/consumer/pch/consumer_pch.hpp"
      grep -q "^executable('consumer', 'consumer.cpp', dependencies: strata_dep)\$" "$work/consumer/meson.build" ||
        { echo "consumer/meson.build changed; update run.sh"; exit 1; }
      echo "executable('consumer_pch', 'consumer.cpp', dependencies: strata_dep, cpp_pch: 'pch/consumer_pch.hpp', cpp_args: ['-H'])" \
        >> "$work/consumer/meson.build"
    fi
    meson setup "$work/build" "$work/consumer" --force-fallback-for=strata "${consumer_opts[@]}" >"$work/setup.log" 2>&1 ||
      { cat "$work/setup.log"; exit 1; }
    # Everything the consumer's project builds by default, as `meson compile` would: strata
    # adds only what the consumer links (nothing else of its own, header-only).
    meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
    check "$work/build/consumer"
    if [ "$pch" = 1 ]; then
      check_pch "$work/compile.log" "consumer_pch\.hpp\.gch"
      check "$work/build/consumer_pch"
    fi
    only_what_is_linked
    ;;
  wrap)
    command -v git >/dev/null || { echo "the wrap check needs git (scripts/install-deps installs it)"; exit 1; }
    # The files a release would hold, committed to a fresh git repository: the wrap clones that.
    mkdir -p "$work/repo"
    cp -r "$src/meson.build" "$src/meson_options.txt" "$src/include" "$src/src" "$src/packaging" "$work/repo/"
    git -C "$work/repo" init -q
    git -C "$work/repo" add -A
    git -C "$work/repo" -c user.name=test -c user.email=test@invalid commit -q -m "strata for the wrap test"
    mkdir -p "$work/consumer/subprojects"
    sed "s|^url = .*|url = $work/repo|" "$src/packaging/strata.wrap" > "$work/consumer/subprojects/strata.wrap"
    grep -q "^url = $work/repo\$" "$work/consumer/subprojects/strata.wrap" || { echo "strata.wrap has no url line"; exit 1; }
    # No fallback: argument here: the wrap's [provide] section must answer dependency('strata').
    sed -i "s|dependency('strata', fallback: \['strata', 'strata_dep'\])|dependency('strata')|" "$work/consumer/meson.build"
    grep -q "dependency('strata')" "$work/consumer/meson.build" || { echo "consumer/meson.build changed; update run.sh"; exit 1; }
    meson setup "$work/build" "$work/consumer" --force-fallback-for=strata "${consumer_opts[@]}" >"$work/setup.log" 2>&1 ||
      { cat "$work/setup.log"; exit 1; }
    [ -f "$work/consumer/subprojects/strata/meson.build" ] || { echo "the wrap did not fetch strata"; cat "$work/setup.log"; exit 1; }
    meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
    check "$work/build/consumer"
    only_what_is_linked
    ;;
  cmake)
    command -v cmake >/dev/null || { echo "the CMake check needs cmake (scripts/install-deps installs it)"; exit 1; }
    install_strata "$work/prefix"
    config=$(find "$work/prefix" -name strataConfig.cmake | head -n1)
    [ -n "$config" ] || { echo "meson install wrote no strataConfig.cmake"; exit 1; }
    [ -f "$(dirname "$config")/strataConfigVersion.cmake" ] || { echo "meson install wrote no strataConfigVersion.cmake"; exit 1; }
    echo "strataConfig.cmake: ${config#$work/prefix/}"
    # Moved after installing: the config finds its headers relative to itself.
    mv "$work/prefix" "$work/moved"
    cp -r "$here/cmake_consumer" "$work/cmake_consumer"
    target=strata::strata
    [ "$compiled" = 1 ] && target=strata::compiled
    [ "$mpi" = 1 ] && target=strata::mpi_compiled
    pch_args=()
    [ "$pch" = 1 ] && pch_args=(-DSTRATA_PCH=ON -DCMAKE_CXX_FLAGS=-H)
    cmake -S "$work/cmake_consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/moved" -DCMAKE_BUILD_TYPE= \
      -DSTRATA_TARGET=$target "${pch_args[@]}" >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
    cmake --build "$work/build" --verbose >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
    echo "linked $target"
    [ "$pch" = 1 ] && check_pch "$work/compile.log" "cmake_pch\.hxx\.gch"
    if [ "$compiled" = 1 ]; then  # the program links the installed library, not a copy of its code
      grep -q "moved/.*/libstrata\.a" "$work/compile.log" || { echo "$target did not link libstrata.a"; cat "$work/compile.log"; exit 1; }
      if [ "$mpi" = 1 ]; then
        grep -q "moved/.*/libstrata_mpi\.a" "$work/compile.log" || { echo "$target did not link libstrata_mpi.a"; cat "$work/compile.log"; exit 1; }
      fi
    fi
    check "$work/build/consumer"
    if [ "$compiled" = 1 ]; then
      # An installation whose library has gone is refused by find_package, naming what is missing
      # and where it was looked for; never a program that fails at link time or runs header-only.
      lib=libstrata.a
      [ "$mpi" = 1 ] && lib=libstrata_mpi.a
      gone=$(find "$work/moved" -name "$lib" | head -n1)
      [ -n "$gone" ] || { echo "no installed $lib"; exit 1; }
      mv "$gone" "$gone.away"
      if cmake -S "$work/cmake_consumer" -B "$work/build-gone" -DCMAKE_PREFIX_PATH="$work/moved" \
           -DSTRATA_TARGET=$target >"$work/cmake-gone.log" 2>&1; then
        echo "find_package(strata) accepted an installation without $lib"; exit 1
      fi
      # CMake wraps the reason over lines: compare with the lines joined.
      tr -s ' \n' ' ' <"$work/cmake-gone.log" | grep -qF "(${lib%.a}) is not in $(dirname "$gone")," ||
        { echo "find_package(strata) did not name the missing $lib:"; cat "$work/cmake-gone.log"; exit 1; }
      echo "an installation without $lib is refused, naming it"
      mv "$gone.away" "$gone"
    fi
    # A version this installation does not serve must be refused, with CMake's message.
    if cmake -S "$work/cmake_consumer" -B "$work/build-v" -DCMAKE_PREFIX_PATH="$work/moved" \
         -DSTRATA_VERSION_WANTED=0.2 >"$work/cmake-v.log" 2>&1; then
      echo "find_package(strata 0.2) accepted strata $(sed -n 's/.*PACKAGE_VERSION "\(.*\)".*/\1/p' "$(dirname "$config" | sed "s|$work/prefix|$work/moved|")/strataConfigVersion.cmake")"
      exit 1
    fi
    grep -q "that is compatible" "$work/cmake-v.log" || { cat "$work/cmake-v.log"; exit 1; }
    echo "find_package(strata 0.2) refused, as it should be"
    ;;
  pkgconfig)
    install_strata "$work/prefix"
    pc=$(dirname "$(find "$work/prefix" -name strata.pc | head -n1)")
    [ -n "$pc" ] || { echo "meson install wrote no strata.pc"; exit 1; }
    export PKG_CONFIG_PATH="$pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    name=strata
    [ "$compiled" = 1 ] && name=strata-compiled
    [ "$mpi" = 1 ] && name=strata-mpi-compiled
    echo "$name.pc: $(pkg-config --cflags --libs $name)"
    meson setup "$work/build" "$work/consumer" "${consumer_opts[@]}" >"$work/setup2.log" 2>&1 || { cat "$work/setup2.log"; exit 1; }
    meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
    check "$work/build/consumer"
    # And straight from the command line, as a Makefile would.
    ${CXX:-c++} -O0 $(pkg-config --cflags $name) "$work/consumer/consumer.cpp" -o "$work/consumer-direct" $(pkg-config --libs $name)
    check "$work/consumer-direct"
    ;;
  plain)
    # The README's flags: no Thrust folder, since a host unit includes no Thrust (only the CUDA
    # place runs on it). g++ -H lists every header the unit opens: none may be Thrust's. (Once,
    # in the plain mode: the other plain modes compile the same includes.)
    extra=()
    if [ "$compiled" = 0 ] && [ "$pch" = 0 ] &&
       ${CXX:-c++} -std=c++20 -fopenmp -I "$src/include" $blas_cflags -DSTRATA_BLAS_OPENBLAS -H -fsyntax-only \
         "$work/consumer/consumer.cpp" 2>&1 >/dev/null | grep -E '^\.+ .*/thrust/'; then
      echo "FAIL: a host unit of the consumer includes Thrust headers (above)"; exit 1
    fi
    sources=("$work/consumer/consumer.cpp")
    [ "$compiled" = 1 ] && extra+=(-DSTRATA_SEPARATE_COMPILATION)
    plain_flags=(-std=c++20 -O0 -fopenmp -I "$src/include" "${extra[@]}" $blas_cflags -DSTRATA_BLAS_OPENBLAS)
    # The compiled part: src/strata.cpp with the same flags, compiled once for plain_compiled and
    # plain_compiled_pch (strata_object) and linked as an object, as a Makefile would.
    if [ "$compiled" = 1 ]; then
      obj=$(strata_object "${plain_flags[@]}") || { echo "src/strata.cpp did not compile with the plain flags"; exit 1; }
      sources+=("$obj")
    fi
    if [ "$pch" = 1 ]; then
      # docs/building.md's lines: the umbrella precompiled with the program's flags, then
      # -include'd (g++ takes the .gch beside the named header).
      mkdir -p "$work/pch"
      echo '#include <strata/strata.hpp>' > "$work/pch/strata_pch.hpp"
      ${CXX:-c++} "${plain_flags[@]}" -x c++-header "$work/pch/strata_pch.hpp" -o "$work/pch/strata_pch.hpp.gch"
      ${CXX:-c++} "${plain_flags[@]}" -include "$work/pch/strata_pch.hpp" -Winvalid-pch -H -c "$work/consumer/consumer.cpp" \
        -o "$work/consumer.o" 2>"$work/compile.log" || { cat "$work/compile.log"; exit 1; }
      check_pch "$work/compile.log" "strata_pch\.hpp\.gch"
      objs=("$work/consumer.o")
      [ "$compiled" = 1 ] && objs+=("${sources[1]}")
      ${CXX:-c++} "${plain_flags[@]}" "${objs[@]}" -o "$work/consumer-plain" -lopenblas
    else
      ${CXX:-c++} "${plain_flags[@]}" "${sources[@]}" -o "$work/consumer-plain" -lopenblas
    fi
    check "$work/consumer-plain"
    ;;
  *) echo "usage: run.sh subproject|wrap|pkgconfig|cmake|plain[_compiled] | subproject|cmake|plain[_compiled]_pch | subproject|pkgconfig|cmake_mpi_compiled SRC_ROOT"; exit 2 ;;
esac
