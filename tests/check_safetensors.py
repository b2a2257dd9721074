#!/usr/bin/env python3
"""Independent check that strata's safetensors files follow the format.

A reader written from the format description alone, with only the standard library (struct and
json), so that it shares no code and no assumption with the C++ writer:

  check_safetensors.py FILE...       validate each file and print its tensors and metadata
  check_safetensors.py --writer EXE  run the doctest binary EXE's test case
                                     "safetensors: python sample" with STRATA_SAFETENSORS_SAMPLE
                                     set, then validate the file it wrote and compare every
                                     tensor and metadata value with SAMPLE below

Exit status: 0 when every check passes, 1 with a message on stderr otherwise.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

DTYPES = {  # name: (bytes per element, struct code or None when Python has no matching code)
    "BOOL": (1, "?"), "U8": (1, "B"), "I8": (1, "b"), "U16": (2, "H"), "I16": (2, "h"),
    "F16": (2, "e"), "BF16": (2, None), "U32": (4, "I"), "I32": (4, "i"), "F32": (4, "f"),
    "U64": (8, "Q"), "I64": (8, "q"), "F64": (8, "d"), "F8_E4M3": (1, None), "F8_E5M2": (1, None),
}

# What the C++ test case "safetensors: python sample" writes (tests/test_safetensors.cpp).
SAMPLE = {
    "tensors": {
        "weights/f32": ("F32", [2, 3], [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]),
        "weights/f64": ("F64", [3], [0.1, -2.5, 1e300]),
        "counts/i32": ("I32", [2, 2], [-2147483648, -1, 0, 2147483647]),
        "step": ("I64", [], [1234567890123]),
        "empty": ("F32", [0], []),
    },
    "metadata": {"format": "strata-test", "unicode": "\u00e9\u2713 \"quoted\"\n"},
}


class FormatError(Exception):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise FormatError(f"duplicate key {key!r} in the header")
        seen[key] = value
    return seen


def read_safetensors(path):
    """Returns (tensors, metadata); tensors maps name -> (dtype, shape, list of values or bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"file is {len(blob)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise FormatError(f"header length {n} exceeds the {len(blob) - 8} bytes after it")
    raw = blob[8:8 + n]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"header is not UTF-8: {e}") from None
    if not text.startswith("{"):
        raise FormatError("header does not start with '{'")
    if text.rstrip(" ") != text.rstrip():
        raise FormatError("header padding must be spaces only")
    header = json.loads(text, object_pairs_hook=_no_duplicates)
    if (8 + n) % 8 != 0:
        raise FormatError(f"data buffer starts at byte {8 + n}, not 8-byte aligned (strata always pads)")
    data = blob[8 + n:]

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("__metadata__ must map strings to strings")

    spans = []
    tensors = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"tensor {name!r}: expected exactly dtype, shape, data_offsets; found {entry!r}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise FormatError(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FormatError(f"tensor {name!r}: bad shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)):
            raise FormatError(f"tensor {name!r}: bad data_offsets {offsets!r}")
        begin, end = offsets
        size, code = DTYPES[dtype]
        count = math.prod(shape)
        if end - begin != count * size:
            raise FormatError(f"tensor {name!r}: {dtype} {shape} needs {count * size} bytes, offsets cover {end - begin}")
        if begin % size != 0:
            raise FormatError(f"tensor {name!r}: offset {begin} is not aligned to its {size}-byte elements")
        spans.append((begin, end, name))
        chunk = data[begin:end]
        values = list(struct.unpack(f"<{count}{code}", chunk)) if code else chunk
        tensors[name] = (dtype, shape, values)

    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise FormatError(f"tensor {name!r} begins at {begin}, expected {at} (gap or overlap)")
        at = end
    if at != len(data):
        raise FormatError(f"tensors cover {at} bytes but the data buffer has {len(data)}")
    return tensors, metadata


def compare_with_sample(tensors, metadata):
    expected = SAMPLE["tensors"]
    if set(tensors) != set(expected):
        raise FormatError(f"tensor names {sorted(tensors)} differ from the sample's {sorted(expected)}")
    for name, (dtype, shape, values) in expected.items():
        got = tensors[name]
        if got[0] != dtype or got[1] != shape:
            raise FormatError(f"tensor {name!r}: expected {dtype} {shape}, found {got[0]} {got[1]}")
        if list(got[2]) != values:
            raise FormatError(f"tensor {name!r}: expected values {values}, found {list(got[2])}")
    if metadata != SAMPLE["metadata"]:
        raise FormatError(f"metadata {metadata!r} differs from the sample's {SAMPLE['metadata']!r}")


def main(argv):
    if len(argv) == 3 and argv[1] == "--writer":
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sample.safetensors")
            env = dict(os.environ, STRATA_SAFETENSORS_SAMPLE=path)
            run = subprocess.run([argv[2], "--test-case=safetensors: python sample"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
            if run.returncode != 0 or not os.path.exists(path):
                sys.stderr.write(run.stdout)
                raise FormatError(f"{argv[2]} did not write the sample (exit status {run.returncode})")
            tensors, metadata = read_safetensors(path)
            compare_with_sample(tensors, metadata)
            print(f"ok: the C++ sample matches ({len(tensors)} tensors, {len(metadata)} metadata keys)")
        return 0
    if len(argv) < 2 or argv[1].startswith("-"):
        sys.stderr.write(__doc__)
        return 2
    for path in argv[1:]:
        tensors, metadata = read_safetensors(path)
        print(f"{path}: {len(tensors)} tensors, metadata {metadata}")
        for name, (dtype, shape, _) in tensors.items():
            print(f"  {name}: {dtype} {shape}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (FormatError, OSError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
        sys.stderr.write(f"check_safetensors: {e}\n")
        sys.exit(1)
