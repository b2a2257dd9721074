#!/usr/bin/env python3
"""Docs that cannot drift: every C++ listing of README.md and docs/*.md is compiled, the short
ones are run, and every quoted output is compared with what its program prints now.

  check_docs.py --root SRC --cxx C++ [--cflag F ...] [--ldflag F ...] [--mnist DIR]
                [--work DIR] [--regen] [FILE.md ...]

What a fenced ```cpp block is, by its info string:

  ```cpp                 a complete program: it has an `int main`. Compiled (-O0, the flags the
                         examples use) and linked. Run (in an empty temporary directory, 60 s at
                         most) unless it reads MNIST (calls load_mnist); it must exit 0.
  ```cpp fragment        a piece of a program: skipped.
  ```cpp compile-fail    a complete program that must NOT compile (shows a compile-time error).

A ```cpp block that has no `int main` and is not marked `fragment` fails the check, named by
file:line.

A quoted output is a fenced block whose line just above is a marker comment:

  <!-- output: SOURCE [| FILTER] ... -->

SOURCE is one of
  listing stdout|stderr   what the nearest complete ```cpp listing above it in the same file
                          prints when run (in an empty directory; a listing that reads MNIST
                          finds the data set at data/mnist there, and is compiled -O2 so that
                          training takes seconds, not hours)
  listing below stdout|stderr  the same for the nearest complete listing below it
  listing compile         the compiler's diagnostics for the nearest ```cpp compile-fail listing
                          above it (the listing is compiled as app.cpp, LC_ALL=C)
  compile PATH            the compiler's diagnostics for PATH (relative to the source root),
                          compiled from the source root
  after-listing CMD       the nearest listing above is run first, then the shell command CMD runs
                          in the same directory ($ROOT is the source root); its stdout
FILTERs, applied in order (the only ways a quoted output may differ from what is printed):
  mask-times              the figures that vary from run to run: "12s 25ms/step" becomes
                          "…s …ms/step" and "ETA: 3s" becomes "ETA: …s"
  grep REGEX              only the lines that match
  lines SPEC              only these 1-based lines (e.g. "1-3,5,8"); where lines are left out
                          between two kept ones, a line "..." (indented as the next) stands in
  gcc-brief               a compiler's diagnostics shortened: no "In file included from", notes
                          or source excerpts; of each error's chain
                          of "required from" lines the first and the last ("required from here")
                          are kept and the others become "..."; for the second and later errors
                          only "..." and the error line itself
  gcc-errors              only the "error:" lines
  file-names              the path that starts a line reduced to its file name
  relative-paths          the source root removed from paths
  wrap N                  lines longer than N characters broken at spaces, continued with 4 spaces
A block indented in the markdown (inside a list item) is compared after its indentation is
removed.

A SOURCE that needs MNIST (a listing that calls load_mnist) is compared only when asked for:
--mnist DIR (or STRATA_DOCS_MNIST_DIR) names the data set, as scripts/regen-docs does; the test
suite leaves those outputs out (they take tens of minutes) and says so per block. Listings that
include MultiWorkerMirrored are compiled with --mpi-cflag/--mpi-ldflag (skipped, saying so,
with --no-mpi) and run as a single process.

Trained figures are the same on every run of one machine (same seeds, same thread count, same
OpenBLAS): they are not masked.

--regen rewrites the quoted outputs in the markdown files instead of comparing them
(scripts/regen-docs). Exit status: 0 when everything passes, 1 otherwise (each failure names
file:line).
"""
import argparse
import concurrent.futures
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

FENCE = re.compile(r"^(\s*)```(.*)$")
MARKER = re.compile(r"^\s*<!--\s*output:\s*(.*?)\s*-->\s*$")
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

failures = []


def uses_mpi(source):
    """A listing of MultiWorkerMirrored (or the process group) needs MPI's flags."""
    return "multi_worker_mirrored.hpp" in source or "process_group.hpp" in source


def fail(where, what):
    failures.append(f"{where}: {what}")
    print(f"FAIL: {where}: {what}", flush=True)


class Block:
    def __init__(self, path, line, indent, info, body, end):
        self.path, self.line, self.indent, self.info, self.body, self.end = path, line, indent, info, body, end
        self.marker = None          # the output marker's text, for quoted outputs

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def kind(self):
        words = self.info.split()
        return words[1] if len(words) > 1 else ""

    @property
    def lang(self):
        return self.info.split()[0] if self.info.split() else ""

    def needs_mnist(self):
        return "load_mnist" in self.body


def parse(path, rel):
    """The fenced blocks of a markdown file, with the output marker above each one."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), m.group(2).strip()
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j])
        b = Block(rel, i + 1, indent, info, body, j + 1)
        k = i - 1
        mm = MARKER.match(lines[k]) if k >= 0 else None
        if mm:
            b.marker = mm.group(1)
        blocks.append(b)
        i = j + 1
    return blocks


# ---------------------------------------------------------------- compiling and running
class Builder:
    def __init__(self, a):
        self.a = a
        self.cache = os.path.join(a.work, "cache")
        os.makedirs(self.cache, exist_ok=True)
        h = hashlib.sha256()
        for d, _, fs in sorted(os.walk(os.path.join(a.root, "include"))):
            for f in sorted(fs):
                p = os.path.join(d, f)
                h.update(p.encode())
                h.update(open(p, "rb").read())
        h.update(repr((a.cxx, a.cflag, a.ldflag)).encode())
        self.headers = h.hexdigest()
        self.pch_lock = threading.Lock()
        self.pch_dir = None  # made on the first listing compiled with the compiled part

    def precompiled(self, cflags):
        """A folder holding strata/strata.hpp.gch, the umbrella precompiled with `cflags` (the
        listings' flags with the compiled part, at -O0), made once per state of the headers.
        Put before the include folder, g++ uses it only where `#include <strata/strata.hpp>` is
        a unit's first line and its flags match (otherwise it reads the header as usual): a
        listing that forgot the include still fails, as it would for a reader. It saves about
        1 to 1.5 s of the 2.5 to 4 s each such listing takes to compile, against 5 s to make it
        (docs/building.md, "A precompiled header")."""
        with self.pch_lock:
            if self.pch_dir is None:
                d = os.path.join(self.a.work, "pch-" + self.key("", repr(cflags), "pch"))
                gch = os.path.join(d, "strata", "strata.hpp.gch")
                if not os.path.exists(gch):
                    for old in os.listdir(self.a.work):  # an older state's
                        if old.startswith("pch-"):
                            shutil.rmtree(os.path.join(self.a.work, old), ignore_errors=True)
                    os.makedirs(os.path.dirname(gch), exist_ok=True)
                    cmd = shlex.split(self.a.cxx) + cflags + ["-x", "c++-header",
                                                              os.path.join(self.a.root, "include", "strata", "strata.hpp"),
                                                              "-o", gch + ".tmp"]
                    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
                    if r.returncode != 0:  # then every listing parses the header itself
                        print(f"note: no precompiled header ({r.stderr[-300:]})", flush=True)
                        self.pch_dir = ""
                        return self.pch_dir
                    os.replace(gch + ".tmp", gch)
                self.pch_dir = d
            return self.pch_dir

    def key(self, source, opt, what):
        return hashlib.sha256((self.headers + opt + what + source).encode()).hexdigest()[:24]

    def build(self, source, opt="-O0", part=False):
        """(exe path or None, diagnostics, seconds); cached by source, flags and headers. With
        `part`, the listing is compiled with strata's compiled parts (--part-* flags)."""
        a = self.a
        part = part and bool(a.part_cflag)
        k = self.key(source, opt + (" part" + repr((a.part_cflag, a.part_ldflag)) if part else ""), "exe")
        exe = os.path.join(self.cache, k)
        if os.path.exists(exe):
            return exe, "", 0.0
        d = tempfile.mkdtemp(dir=a.work)
        src = os.path.join(d, "app.cpp")
        open(src, "w").write(source + "\n")
        mpi = uses_mpi(source)
        cflags = a.cflag + (a.part_cflag if part else []) + (a.mpi_cflag + (a.part_mpi_cflag if part else []) if mpi else [])
        # The MPI part's library before libstrata, which it uses, and both before the BLAS and MPI.
        ldflags = ((a.part_mpi_ldflag if part and mpi else []) + (a.part_ldflag if part else []) + a.ldflag +
                   (a.mpi_ldflag if mpi else []))
        pch = []
        if part and not mpi and opt == "-O0":
            d_pch = self.precompiled(cflags + [opt])
            pch = ["-I" + d_pch] if d_pch else []
        cmd = shlex.split(a.cxx) + pch + cflags + [opt, "app.cpp", "-o", "app"] + ldflags
        t = time.time()
        r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
        secs = time.time() - t
        if r.returncode != 0:
            shutil.rmtree(d, ignore_errors=True)
            return None, r.stderr, secs
        os.replace(os.path.join(d, "app"), exe)
        shutil.rmtree(d, ignore_errors=True)
        return exe, r.stderr, secs

    def diagnostics(self, source_path, cwd, name):
        """(exit status, the compiler's diagnostics) of a syntax-only compile."""
        cmd = shlex.split(self.a.cxx) + self.a.cflag + ["-fsyntax-only", name]
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
        return r.returncode, r.stderr

    def run(self, exe, mnist, timeout, then=None):
        """(exit status, stdout, stderr) of exe run in an empty directory (data/mnist linked in
        when given); `then` is a shell command run afterwards in the same directory."""
        with tempfile.TemporaryDirectory(dir=self.a.work) as d:
            if mnist:
                os.makedirs(os.path.join(d, "data"))
                os.symlink(os.path.abspath(mnist), os.path.join(d, "data", "mnist"))
            env = dict(os.environ, STRATA_QUIET_BLAS="1", LC_ALL="C")
            try:
                r = subprocess.run([exe], cwd=d, capture_output=True, text=True, timeout=timeout, env=env)
            except subprocess.TimeoutExpired:
                return None, "", f"timed out after {timeout} s"
            if then and r.returncode == 0:
                t = subprocess.run(then, shell=True, cwd=d, capture_output=True, text=True, timeout=timeout,
                                   env=dict(env, ROOT=self.a.root))
                return t.returncode, t.stdout, t.stderr
            return r.returncode, r.stdout, r.stderr


# ---------------------------------------------------------------- filters
def mask_times(text):
    text = re.sub(r"- \d+s \d+(?:ms|us)/step", "- …s …ms/step", text)
    return re.sub(r"ETA: \d+s", "ETA: …s", text)


def base(path):
    return os.path.basename(path)


DIAG = re.compile(r"^(\S+?):(\d+:\d+:)?\s(.*)$")


def shorten_path(line):
    m = re.match(r"^([^\s:]+)(:.*)$", line)
    if m and "/" in m.group(1):
        return base(m.group(1)) + m.group(2)
    return line


def gcc_lines(text):
    """Diagnostic lines only: no include chains, notes or source excerpts."""
    out = []
    for l in text.split("\n"):
        if not l.strip() or l.startswith("In file included from") or l.startswith("                 from "):
            continue
        if re.match(r"^\s*\d*\s*\|", l):
            continue
        if ": note: " in l:
            continue
        out.append(l)
    return out


def gcc_brief(text):
    out = []
    chain = []
    errors = 0
    for l in gcc_lines(text):
        if ": error: " in l:
            if errors == 0:
                out.extend(chain[:2])
                if len(chain) > 3:
                    out.append("...")
                if len(chain) > 2:
                    out.append(chain[-1])
            else:
                out.append("...")
            out.append(l)
            errors += 1
            chain = []
        else:
            chain.append(l)
    return "\n".join(out)


def gcc_errors(text):
    return "\n".join(l for l in gcc_lines(text) if ": error: " in l)


def select_lines(text, spec):
    lines = text.split("\n")
    keep = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            keep.extend(range(int(a), int(b) + 1))
        else:
            keep.append(int(part))
    out = []
    prev = None
    for n in keep:
        if n > len(lines):
            break
        if prev is not None and n != prev + 1:
            line = lines[n - 1]
            out.append(line[:len(line) - len(line.lstrip())] + "...")
        out.append(lines[n - 1])
        prev = n
    return "\n".join(out)


def wrap(text, width):
    out = []
    for l in text.split("\n"):
        if len(l) <= width:
            out.append(l)
        else:
            out.extend(textwrap.wrap(l, width, subsequent_indent="    ", break_on_hyphens=False, break_long_words=False))
    return "\n".join(out)


def apply_filters(text, filters, root):
    for f in filters:
        words = f.split(None, 1)
        name, arg = words[0], (words[1] if len(words) > 1 else "")
        if name == "mask-times":
            text = mask_times(text)
        elif name == "grep":
            text = "\n".join(l for l in text.split("\n") if re.search(arg, l))
        elif name == "lines":
            text = select_lines(text, arg)
        elif name == "gcc-brief":
            text = gcc_brief(text)
        elif name == "gcc-errors":
            text = gcc_errors(text)
        elif name == "file-names":
            text = "\n".join(shorten_path(l) for l in text.split("\n"))
        elif name == "relative-paths":
            text = text.replace(root.rstrip("/") + "/", "")
        elif name == "wrap":
            text = wrap(text, int(arg))
        else:
            raise ValueError(f"unknown filter {name!r}")
    return "\n".join(l.rstrip() for l in text.strip("\n").split("\n"))


# ---------------------------------------------------------------- the check
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True)
    p.add_argument("--cxx", required=True, help="the compiler command (split like a shell)")
    p.add_argument("--cflag", action="append", default=[])
    p.add_argument("--ldflag", action="append", default=[])
    p.add_argument("--mpi-cflag", action="append", default=[], help="for listings that include MultiWorkerMirrored")
    p.add_argument("--mpi-ldflag", action="append", default=[])
    # strata's compiled parts (docs/building.md, "Header-only, or with the compiled part"): the
    # listings of every file but those named by --header-only are compiled with these flags
    # added, linking libstrata (and libstrata_mpi), as the project's own programs are. That
    # halves their compile time (the README program: 6.6 s against 12.8 s at -O0); the
    # header-only form of the same code is compiled by the README's listings, the *_header_only
    # tests and the package tests.
    p.add_argument("--part-cflag", action="append", default=[])
    p.add_argument("--part-ldflag", action="append", default=[])
    p.add_argument("--part-mpi-cflag", action="append", default=[])
    p.add_argument("--part-mpi-ldflag", action="append", default=[])
    p.add_argument("--header-only", action="append", default=[], metavar="FILE.md",
                   help="compile this file's listings header-only even when --part-cflag is given")
    p.add_argument("--no-mpi", action="store_true", help="this build has no MPI: listings that need it are skipped, saying so")
    # The programs that train on MNIST take minutes to tens of minutes: their outputs are checked
    # when asked for (scripts/regen-docs --check, or --mnist / STRATA_DOCS_MNIST_DIR), not by the
    # default suite, which still compiles them.
    p.add_argument("--mnist", default=os.environ.get("STRATA_DOCS_MNIST_DIR", ""))
    p.add_argument("--work", default="", help="directory for the compiled listings (a cache); default: a temporary one")
    p.add_argument("--regen", action="store_true", help="rewrite the quoted outputs instead of comparing them")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    a.root = os.path.abspath(a.root)
    start = time.time()
    tmp = None
    if not a.work:
        tmp = tempfile.mkdtemp(prefix="strata-docs-")
        a.work = tmp
    os.makedirs(a.work, exist_ok=True)
    a.work = os.path.abspath(a.work)
    have_mnist = bool(a.mnist) and all(os.path.exists(os.path.join(a.mnist, f)) for f in MNIST_FILES)

    files = a.files or ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(a.root, "docs")) if f.endswith(".md"))
    docs = {f: parse(os.path.join(a.root, f), f) for f in files}
    builder = Builder(a)

    # 1. Classify the C++ listings; find the listing each quoted output comes from.
    programs, compile_fail = [], []
    for f, blocks in docs.items():
        for b in blocks:
            if b.lang not in ("cpp", "c++"):
                continue
            if b.kind == "fragment":
                continue
            if b.kind == "compile-fail":
                compile_fail.append(b)
            elif b.kind:
                fail(b.where, f"unknown listing kind {b.kind!r} (use ```cpp, ```cpp fragment or ```cpp compile-fail)")
            elif not re.search(r"\bint\s+main\s*\(", b.body):
                fail(b.where, "a ```cpp listing without int main(): complete it, or mark it ```cpp fragment")
            else:
                programs.append(b)

    quoted = []   # (block, source, filters, listing)
    for f, blocks in docs.items():
        last_program = last_fail = None
        for n, b in enumerate(blocks):
            if b.lang in ("cpp", "c++") and b.kind == "" and b in programs:
                last_program = b
            if b.lang in ("cpp", "c++") and b.kind == "compile-fail":
                last_fail = b
            if b.marker is None:
                continue
            parts = [s.strip() for s in b.marker.split("|")]
            src, filters = parts[0], parts[1:]
            listing = last_fail if src == "listing compile" else last_program if src.startswith(("listing", "after-listing")) else None
            if src.startswith("listing below "):
                src = "listing " + src[len("listing below "):]
                listing = next((c for c in blocks[n + 1:] if c in programs), None)
            if src.startswith(("listing", "after-listing")) and listing is None:
                fail(b.where, f"output marker {src!r}, but no listing above it")
                continue
            quoted.append((b, src, filters, listing))

    # 2. Compile every listing (-O0), in parallel; run the short ones.
    print(f"{len(programs)} complete listings, {len(compile_fail)} compile-fail listings, {len(quoted)} quoted outputs "
          f"in {len(files)} files; MNIST {'at ' + a.mnist if have_mnist else 'absent'}", flush=True)
    results = {}

    def build_and_run(b):
        if a.no_mpi and uses_mpi(b.body):
            return b, None, "SKIP-NO-MPI", 0.0, None
        exe, diag, secs = builder.build(b.body, "-O0", part=b.path not in a.header_only)
        if exe is None:
            return b, None, diag, secs, None
        run = None
        if not b.needs_mnist():
            run = builder.run(exe, None, 60)
        return b, exe, diag, secs, run

    def must_fail(b):
        with tempfile.TemporaryDirectory(dir=a.work) as d:
            open(os.path.join(d, "app.cpp"), "w").write(b.body + "\n")
            status, diag = builder.diagnostics(None, d, "app.cpp")
        return b, status, diag

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for b, exe, diag, secs, run in pool.map(build_and_run, programs):
            if diag == "SKIP-NO-MPI":
                print(f"skip: {b.where}: it needs MPI and this build has none (install libopenmpi-dev, reconfigure)", flush=True)
                continue
            if exe is None:
                fail(b.where, "the listing does not compile:\n" + diag[-4000:])
                continue
            note = f" ({secs:.1f} s)" if secs else " (cached)"
            if run is None:
                print(f"ok: {b.where} compiles{note}; not run (reads MNIST)", flush=True)
            elif run[0] != 0:
                fail(b.where, f"the listing exits {run[0]}:\n{run[1][-2000:]}\n{run[2][-2000:]}")
            else:
                print(f"ok: {b.where} compiles{note} and runs", flush=True)
            results[b] = run
        for b, status, diag in pool.map(must_fail, compile_fail):
            if status == 0:
                fail(b.where, "a ```cpp compile-fail listing compiles")
            else:
                print(f"ok: {b.where} fails to compile, as it should", flush=True)
            results[b] = (status, "", diag)

    # 3. The quoted outputs.
    new_text = {}   # file -> {block line: new body}
    for b, src, filters, listing in quoted:
        needs_mnist = listing is not None and listing.needs_mnist()
        if needs_mnist and not have_mnist:
            print(f"skip: {b.where}: its output comes from {listing.where}, which reads MNIST, and the data set is not "
                  f"there (scripts/fetch-mnist data/mnist, or STRATA_MNIST_DIR)", flush=True)
            continue
        try:
            if src in ("listing stdout", "listing stderr") or src.startswith("after-listing "):
                run = results.get(listing) if not needs_mnist else None
                if run is None or src.startswith("after-listing "):
                    exe, diag, _ = builder.build(listing.body, "-O2" if needs_mnist else "-O0",
                                                 part=listing.path not in a.header_only)
                    if exe is None:
                        fail(b.where, f"{listing.where} does not compile")
                        continue
                    then = src[len("after-listing "):] if src.startswith("after-listing ") else None
                    run = builder.run(exe, a.mnist if needs_mnist else None, 3600 if needs_mnist else 60, then)
                    if run[0] != 0:
                        fail(b.where, f"{src}: exit {run[0]}: {run[2][-2000:]}")
                        continue
                text = run[2] if src == "listing stderr" else run[1]
            elif src == "listing compile":
                text = results[listing][2]
            elif src.startswith("compile "):
                status, text = builder.diagnostics(None, a.root, src[len("compile "):].strip())
                if status == 0:
                    fail(b.where, f"{src}: it compiles")
                    continue
            else:
                fail(b.where, f"unknown output source {src!r}")
                continue
            got = apply_filters(text, filters, a.root)
        except ValueError as e:
            fail(b.where, str(e))
            continue
        want = "\n".join(l.rstrip() for l in b.body.strip("\n").split("\n"))
        if a.regen:
            if got != want:
                new_text.setdefault(b.path, {})[b.line] = (b, got)
                print(f"regenerated: {b.where}", flush=True)
            else:
                print(f"unchanged: {b.where}", flush=True)
        elif got != want:
            import difflib
            diff = "\n".join(difflib.unified_diff(want.split("\n"), got.split("\n"), "quoted", "printed now", lineterm=""))
            fail(b.where, f"the quoted output differs from what '{b.marker}' prints now "
                          f"(scripts/regen-docs rewrites it):\n{diff}")
        else:
            print(f"ok: {b.where} matches what '{b.marker}' prints", flush=True)

    if a.regen:
        for f, changes in new_text.items():
            path = os.path.join(a.root, f)
            lines = open(path, encoding="utf-8").read().split("\n")
            for line in sorted(changes, reverse=True):
                b, got = changes[line]
                body = [(b.indent + l) if l else "" for l in got.split("\n")]
                lines[b.line:b.end - 1] = body
            open(path, "w", encoding="utf-8").write("\n".join(lines))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s) in {time.time() - start:.0f} s" if failures else
          f"all docs checks passed in {time.time() - start:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
