#!/usr/bin/env python3
"""Independent decoder of strata's TensorBoard event files (strata/io/tensorboard.hpp).

  check_tensorboard.py FILE...        decode each event file and print its events
  check_tensorboard.py --writer EXE   run the doctest binary EXE's test case "tensorboard: python
                                      sample" with STRATA_TENSORBOARD_SAMPLE set to a directory,
                                      then check what it wrote against SAMPLE below
  check_tensorboard.py --logdir DIR --tags TAG... [--validation-tags TAG...] --epochs N
                                      check a log directory written by the TensorBoard callback
                                      (used on mnist_cnn --tensorboard DIR)

It shares nothing with the C++ writer: the TFRecord framing and CRC-32C are read from their
description (CRC in pure Python, checked against the catalogue's check value), and the Event and
Summary messages are decoded by Google's protobuf library (Debian's python3-protobuf) from
message declarations copied from TensorBoard's event.proto and summary.proto (the fields used
here, with their numbers and types). Exit status 0 when all checks pass, 1 otherwise.
"""
import math
import os
import struct
import subprocess
import sys
import tempfile


def _protobuf():
    """Google's protobuf, from this Python or else Debian's /usr/bin/python3 (which has
    python3-protobuf when scripts/install-deps ran); the script re-runs itself there."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: F401
        return descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system) and \
                not os.environ.get("CHECK_TENSORBOARD_REEXEC"):
            os.environ["CHECK_TENSORBOARD_REEXEC"] = "1"
            os.execv(system, [system] + sys.argv)
        sys.exit("check_tensorboard: needs Python's protobuf (Debian: python3-protobuf; scripts/install-deps installs it)")


descriptor_pb2, descriptor_pool, message_factory = _protobuf()


class EventError(Exception):
    pass


# ---- CRC-32C (Castagnoli), reflected polynomial 0x82F63B78 -------------------------------------

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "CRC-32C check value"


# ---- Event and Summary, declared from TensorBoard's .proto files --------------------------------
# tensorboard/compat/proto/event.proto:
#   message Event { double wall_time = 1; int64 step = 2;
#                   oneof what { string file_version = 3; bytes graph_def = 4; Summary summary = 5; ... } }
# tensorboard/compat/proto/summary.proto:
#   message Summary { message Value { string node_name = 7; string tag = 1;
#                                     oneof value { float simple_value = 2; ... } }
#                     repeated Value value = 1; }

def _messages():
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="strata_check_event.proto", package="tensorboard", syntax="proto3")
    summary = fd.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    value.field.add(name="node_name", number=7, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    value.field.add(name="obsolete_old_style_histogram", number=3, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL,
                    oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorboard.Summary.Value")
    event = fd.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="graph_def", number=4, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=0,
                    type_name=".tensorboard.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    factory = message_factory.MessageFactory(pool)
    return factory.GetPrototype(pool.FindMessageTypeByName("tensorboard.Event"))


Event = _messages()


def read_events(path):
    """The Events of a file, each CRC verified; EventError on any defect."""
    with open(path, "rb") as f:
        blob = f.read()
    events, at = [], 0
    while at < len(blob):
        if len(blob) - at < 12:
            raise EventError(f"{path}: {len(blob) - at} stray bytes at offset {at}")
        header = blob[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if length_crc != masked(crc32c(header)):
            raise EventError(f"{path}: record at {at}: length CRC {length_crc:#x}, expected {masked(crc32c(header)):#x}")
        data = blob[at + 12:at + 12 + length]
        if len(data) != length or len(blob) < at + 16 + length:
            raise EventError(f"{path}: record at {at} is cut short")
        (data_crc,) = struct.unpack("<I", blob[at + 12 + length:at + 16 + length])
        if data_crc != masked(crc32c(data)):
            raise EventError(f"{path}: record at {at}: data CRC {data_crc:#x}, expected {masked(crc32c(data)):#x}")
        e = Event()
        e.ParseFromString(data)
        if e.SerializeToString() != data:
            raise EventError(f"{path}: record at {at} does not re-encode to the same bytes (unknown fields?)")
        events.append(e)
        at += 16 + length
    if not events:
        raise EventError(f"{path}: no events")
    first = events[0]
    if first.WhichOneof("what") != "file_version" or first.file_version != "brain.Event:2":
        raise EventError(f"{path}: the first event is not file_version 'brain.Event:2': {first}")
    now = __import__("time").time()
    for e in events:
        if not (1.5e9 < e.wall_time < now + 60):
            raise EventError(f"{path}: wall_time {e.wall_time} is not a time of this era")
    return events


def scalars(events):
    """{tag: [(step, value)]} of the summary events."""
    out = {}
    for e in events[1:]:
        if e.WhichOneof("what") != "summary":
            raise EventError(f"an event that is not a summary: {e}")
        for v in e.summary.value:
            if v.WhichOneof("value") != "simple_value":
                raise EventError(f"tag {v.tag!r} holds no simple_value")
            out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def check_name(path):
    name = os.path.basename(path)
    parts = name.split(".")
    if not name.startswith("events.out.tfevents.") or not (parts[3].isdigit() and len(parts[3]) == 10):
        raise EventError(f"{path}: not named events.out.tfevents.<10-digit time>.<host>...")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# What the C++ test case "tensorboard: python sample" writes (tests/test_tensorboard.cpp): a
# file from EventFileWriter, and a TensorBoard callback's log dir after two epochs of logs.
SAMPLE_WRITER = {"loss": [(0, 1.5), (1, 0.25), (-3, 1e-30)], "weird tag/with spaces é": [(1 << 40, -2.0)]}
SAMPLE_CALLBACK = {
    "train": {"epoch_loss": [(0, 0.9), (1, 0.5)], "epoch_accuracy": [(0, 0.7), (1, 0.8)], "epoch_lr": [(0, 1e-5), (1, 5e-6)],
              "batch_loss": [(2, 1.0), (4, 0.8), (6, 0.6), (8, 0.4)]},
    "validation": {"epoch_loss": [(0, 0.6), (1, 0.55)], "epoch_accuracy": [(0, 0.75), (1, 0.78)]},
}


def compare(path, got, want):
    if sorted(got) != sorted(want):
        raise EventError(f"{path}: tags {sorted(got)}, expected {sorted(want)}")
    for tag, points in want.items():
        expect = [(s, f32(v)) for s, v in points]
        if got[tag] != expect:
            raise EventError(f"{path}: tag {tag!r}: {got[tag]}, expected {expect}")


def only_file(directory):
    files = [f for f in os.listdir(directory) if "tfevents" in f]
    if len(files) != 1:
        raise EventError(f"{directory}: {len(files)} event files ({files}), expected 1")
    path = os.path.join(directory, files[0])
    check_name(path)
    return path


def check_sample(d):
    path = only_file(os.path.join(d, "writer"))
    compare(path, scalars(read_events(path)), SAMPLE_WRITER)
    for sub, want in SAMPLE_CALLBACK.items():
        path = only_file(os.path.join(d, "callback", sub))
        compare(path, scalars(read_events(path)), want)
    print(f"{d}: event files decode as expected")


def check_logdir(d, tags, val_tags, epochs):
    for sub, want in (("train", tags), ("validation", val_tags)):
        if not want:
            continue
        path = only_file(os.path.join(d, sub))
        got = scalars(read_events(path))
        for t in want:
            steps = [s for s, _ in got.get(t, [])]
            if steps != list(range(epochs)):
                raise EventError(f"{path}: tag {t!r} at steps {steps}, expected 0..{epochs - 1}")
            if not all(math.isfinite(v) for _, v in got[t]):
                raise EventError(f"{path}: tag {t!r} holds non-finite values {got[t]}")
    print(f"{d}: tags present for {epochs} epochs")


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "--writer":
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, STRATA_TENSORBOARD_SAMPLE=d)
                run = subprocess.run([argv[2], "--test-case=tensorboard: python sample"], env=env, capture_output=True,
                                     text=True)
                if run.returncode != 0:
                    raise EventError(f"{argv[2]} did not write the sample (exit status {run.returncode})\n{run.stdout}")
                check_sample(d)
            return 0
        if len(argv) > 1 and argv[1] == "--logdir":
            import argparse
            p = argparse.ArgumentParser()
            p.add_argument("--logdir", required=True)
            p.add_argument("--tags", nargs="*", default=[])
            p.add_argument("--validation-tags", nargs="*", default=[])
            p.add_argument("--epochs", type=int, required=True)
            a = p.parse_args(argv[1:])
            check_logdir(a.logdir, a.tags, a.validation_tags, a.epochs)
            return 0
        if len(argv) < 2 or argv[1].startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        for path in argv[1:]:
            for e in read_events(path):
                print(f"{path}: step {e.step} wall_time {e.wall_time:.3f} {e.WhichOneof('what')}: "
                      f"{[(v.tag, v.simple_value) for v in e.summary.value] if e.HasField('summary') else e.file_version}")
        return 0
    except EventError as e:
        print(f"check_tensorboard: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
