#!/usr/bin/env python3
"""Every public header compiles on its own: each include/strata/**/*.hpp (detail/ and impl/
left out: they are private) is compiled alone, as the only line of a unit, with -fsyntax-only,
two at a time. A header that leans on what another header happened to include before it, or
that is half of a two-file include loop, fails here by name.

  check_headers_alone.py --root SRC --cxx C++ [--cflag F ...] [--mpi-cflag F ...] [--jobs N]
                         [HEADER ...]

A header that fails for want of <mpi.h> (it includes it, itself or through another header) is
compiled again with the --mpi-cflag flags too, and skipped, saying so, when none are given.
Headers that refuse a compiler other than nvcc (`#if !defined(__CUDACC__)` then `#error`) are
skipped, saying so: tests that nvcc builds cover them. Exit 0 when every
compiled header compiles, 1 otherwise (each failure with its first diagnostics).
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

# What marks a header as nvcc's alone (CUDA includes under `#if STRATA_HAS_CUDA` do not).
CUDA_ONLY_MARK = re.compile(r'^\s*#\s*if\s*!\s*defined\s*\(\s*__CUDACC__\s*\)\s*\n\s*#\s*error', re.M)


def public_headers(include_dir):
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(include_dir, "strata")):
        dirnames[:] = sorted(d for d in dirnames if d not in ("detail", "impl"))
        for f in sorted(filenames):
            if f.endswith(".hpp"):
                out.append(os.path.relpath(os.path.join(dirpath, f), include_dir))
    return out


def compile_alone(header, cxx, flags, work):
    unit = os.path.join(work, header.replace("/", "__") + ".cpp")
    with open(unit, "w") as f:
        f.write('#include "%s"\n' % header)
    cmd = cxx + flags + ["-fsyntax-only", unit]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                           env=dict(os.environ, LC_ALL="C"))
    except subprocess.TimeoutExpired:
        return header, False, "timed out after 300 s"
    return header, p.returncode == 0, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--cxx", required=True, help="the compiler command (split like a shell)")
    ap.add_argument("--cflag", action="append", default=[])
    ap.add_argument("--mpi-cflag", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("headers", nargs="*", help="strata/... paths (default: every public header)")
    a = ap.parse_args()

    include_dir = os.path.join(a.root, "include")
    headers = a.headers or public_headers(include_dir)
    cxx = shlex.split(a.cxx)
    base = ["-std=c++20", "-I" + include_dir] + a.cflag
    jobs, skipped = [], []
    for h in headers:
        text = open(os.path.join(include_dir, h)).read()
        if CUDA_ONLY_MARK.search(text):
            skipped.append((h, "nvcc only"))
        else:
            jobs.append((h, base))

    def run(job):
        header, ok, log = compile_alone(job[0], cxx, job[1], work)
        if not ok and "mpi.h" in log and "No such file" in log:
            if not a.mpi_cflag:
                return header, None, "needs MPI, no --mpi-cflag given"
            header, ok, log = compile_alone(job[0], cxx, job[1] + a.mpi_cflag, work)
        return header, ok, log

    failed = []
    work = tempfile.mkdtemp()
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for header, ok, log in pool.map(run, jobs):
            if ok is None:
                skipped.append((header, log))
                continue
            print(("ok      " if ok else "FAILED  ") + header, flush=True)
            if not ok:
                failed.append((header, log))
    for h, why in skipped:
        print("skipped " + h + " (" + why + ")")
    for h, log in failed:
        print("\n---- %s does not compile alone ----\n%s" % (h, "\n".join(log.splitlines()[:25])))
    shutil.rmtree(work, ignore_errors=True)
    compiled = len(jobs) - len(failed) - sum(1 for _, why in skipped if why.startswith("needs MPI"))
    print("\n%d compiled alone, %d failed, %d skipped" % (compiled, len(failed), len(skipped)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
