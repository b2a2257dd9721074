#!/usr/bin/env python3
"""scripts/fetch-fashion-mnist end to end, on the .gz files of Debian's dataset-fashion-mnist.

- It decompresses the four files into a fresh folder, verified, leaving no staged file; a second
  run finds them and does nothing; a tampered file in the folder is noticed and replaced.
- Negative controls: a source whose labels were altered (a valid gzip of other bytes) fails the
  checksum, and a truncated gzip fails to decompress; both exit 1 naming the file, and leave no
  file in the folder, neither under a final name nor staged. A missing source says to install the
  package. Misuse exits 2.

Exit 77 (a skip for Meson) when the package is not installed, saying so.
"""
import argparse
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
SIZES = {"train-images-idx3-ubyte": 47040016, "train-labels-idx1-ubyte": 60008,
         "t10k-images-idx3-ubyte": 7840016, "t10k-labels-idx1-ubyte": 10008}
# Independent of the script's own table: the MD5s of the uncompressed files as third-party
# loaders publish them (torchvision-style raw_data tables).
MD5 = {"train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
       "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
       "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
       "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965"}

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(script, out, src=None, extra_env=None):
    env = dict(os.environ)
    if src is not None:
        env["FASHION_MNIST_SRC"] = src
    env.update(extra_env or {})
    args = [script] + ([out] if out is not None else [])
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


def md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="strata's source tree")
    ap.add_argument("--src", default=os.environ.get("FASHION_MNIST_SRC", "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    script = os.path.join(a.root, "scripts", "fetch-fashion-mnist")
    missing = [n for n in NAMES if not os.path.isfile(os.path.join(a.src, n + ".gz"))]
    if missing:
        print(f"skipped: {a.src} lacks {', '.join(n + '.gz' for n in missing)}: Debian's dataset-fashion-mnist "
              "is not installed (scripts/install-deps installs it)")
        return 77

    with tempfile.TemporaryDirectory(prefix="strata_fetch_fashion_") as tmp:
        # The real files.
        out = os.path.join(tmp, "out")
        r = run(script, out, a.src)
        check(r.returncode == 0, f"fetch into a fresh folder exits 0 (got {r.returncode}: {r.stderr.strip()})")
        check(sorted(os.listdir(out)) == sorted(NAMES), f"exactly the four files, nothing staged left: {os.listdir(out)}")
        for n in NAMES:
            p = os.path.join(out, n)
            check(os.path.getsize(p) == SIZES[n], f"{n}: {SIZES[n]} bytes")
            check(md5(p) == MD5[n], f"{n}: the published MD5 of the uncompressed file")
        r = run(script, out, a.src)
        check(r.returncode == 0 and "already present and verified" in r.stderr,
              f"a second run does nothing (got {r.returncode}: {r.stderr.strip()})")
        # A tampered file in the folder is noticed and replaced.
        with open(os.path.join(out, "t10k-labels-idx1-ubyte"), "r+b") as f:
            f.seek(100)
            f.write(b"\x07")
        r = run(script, out, a.src)
        check(r.returncode == 0 and "t10k-labels-idx1-ubyte is not the original file" in r.stderr,
              f"a tampered file is reported (got {r.returncode}: {r.stderr.strip()})")
        check(md5(os.path.join(out, "t10k-labels-idx1-ubyte")) == MD5["t10k-labels-idx1-ubyte"], "and replaced")

        # Negative control: a source whose training labels differ in one byte (a valid gzip).
        bad = os.path.join(tmp, "bad_src")
        os.mkdir(bad)
        for n in NAMES:
            os.symlink(os.path.join(os.path.abspath(a.src), n + ".gz"), os.path.join(bad, n + ".gz"))
        os.remove(os.path.join(bad, "train-labels-idx1-ubyte.gz"))
        with gzip.open(os.path.join(a.src, "train-labels-idx1-ubyte.gz"), "rb") as f:
            labels = bytearray(f.read())
        labels[8 + 1234] = (labels[8 + 1234] + 1) % 10  # another valid class: only the checksum can tell
        with gzip.open(os.path.join(bad, "train-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(labels)
        out2 = os.path.join(tmp, "out2")
        r = run(script, out2, bad)
        check(r.returncode == 1, f"a corrupted copy exits 1 (got {r.returncode})")
        check("train-labels-idx1-ubyte" in r.stderr and "failed verification" in r.stderr and "SHA-256" in r.stderr,
              f"naming the file and the checksum: {r.stderr.strip()}")
        check(os.listdir(out2) == [], f"and leaves nothing in the folder: {os.listdir(out2)}")

        # Negative control: a truncated gzip.
        os.remove(os.path.join(bad, "train-labels-idx1-ubyte.gz"))
        with open(os.path.join(a.src, "train-labels-idx1-ubyte.gz"), "rb") as f:
            blob = f.read()
        with open(os.path.join(bad, "train-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(blob[: len(blob) // 2])
        r = run(script, out2, bad)
        check(r.returncode == 1 and "cannot decompress" in r.stderr and "train-labels-idx1-ubyte.gz" in r.stderr,
              f"a truncated gzip exits 1 naming it (got {r.returncode}: {r.stderr.strip()})")
        check(os.listdir(out2) == [], f"and leaves nothing in the folder: {os.listdir(out2)}")

        # A previous good folder is not damaged by a failed run: the files stay the verified ones.
        r = run(script, out, bad)
        check(r.returncode == 0, "a failed source is not even read when the folder is complete")
        os.remove(os.path.join(out, "train-images-idx3-ubyte"))
        r = run(script, out, bad)
        check(r.returncode == 1, "a failed run into a folder missing one file exits 1")
        check(sorted(os.listdir(out)) == sorted(n for n in NAMES if n != "train-images-idx3-ubyte"),
              f"and leaves the folder as it was, without staged files: {os.listdir(out)}")

        # No source at all; misuse.
        r = run(script, os.path.join(tmp, "out3"), os.path.join(tmp, "nowhere"))
        check(r.returncode == 1 and "apt-get install dataset-fashion-mnist" in r.stderr,
              f"a missing source says how to install it (got {r.returncode}: {r.stderr.strip()})")
        check(not os.path.exists(os.path.join(tmp, "out3")), "and creates no folder")
        r = run(script, None, a.src)
        check(r.returncode == 2 and "usage" in r.stderr, f"no argument: usage, exit 2 (got {r.returncode})")

    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
