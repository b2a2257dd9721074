#!/usr/bin/env python3
"""Runs the examples and benchmarks the way users and scripts do, and checks what they promise.

  check_examples.py --bin NAME=PATH [--bin NAME=PATH ...]

For every program given:
  * --help exits 0 and lists its flags; an unknown flag, a value that is not a decimal integer
    (junk, hex, overflow), or a value out of range exits 2 with "PROG: error:" and the flag's
    name on stderr -- never a traceback, a "terminate called", or a crash;
  * mistakes in the flags are reported before any data is read (mnist_cnn with a missing data
    directory still complains about the flag);
  * --json FILE writes strict JSON (no NaN/Infinity literals) with the field names that
    docs/, scripts/ and benchmarks/*.py read.
The MNIST examples train on a tiny MNIST-shaped data set written here (IDX files), so the test
needs no download. Benchmarks run once on tiny sizes: a smoke test, not a measurement.
Standard library only.
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_plot  # noqa: E402 - beside this file

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def run(cmd, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


def strict_json(path):
    """The parsed file; NaN, Infinity and -Infinity (valid Python, invalid JSON) are refused."""
    def refuse(name):
        raise ValueError(f"{path}: {name} is not JSON")
    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def write_idx(path, magic, dims, data):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(bytes(data))


def fake_mnist(directory, train=256, test=100):
    """Four MNIST-named IDX files of random 28x28 images and labels 0..9."""
    rng = random.Random(7)
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), 0x803, (n, 28, 28),
                  rng.randbytes(n * 28 * 28) if n > 1000 else [rng.randrange(256) for _ in range(n * 28 * 28)])
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), 0x801, (n,), [i % 10 for i in range(n)])


def bad_flag(exe, name, args, flag, env=None):
    """`args` must be refused: exit 2, "NAME: error:" and `flag` in stderr, nothing unexplained."""
    r = run([exe] + args, env)
    ok = check(r.returncode == 2, f"{name} {' '.join(args)}: exit {r.returncode}, expected 2 (stderr: {r.stderr.strip()!r})")
    ok &= check(f"{name}: error:" in r.stderr and flag in r.stderr,
                f"{name} {' '.join(args)}: stderr should say '{name}: error:' and name {flag}, got {r.stderr.strip()!r}")
    ok &= check("terminate called" not in r.stderr and "Traceback" not in r.stderr, f"{name}: unexplained failure")
    return ok


def help_lists(exe, name, flags, env=None):
    r = run([exe, "--help"], env)
    check(r.returncode == 0, f"{name} --help: exit {r.returncode}")
    for f in flags:
        check(f in r.stdout, f"{name} --help does not list {f}")


def common_checks(exe, name, int_flag, env=None):
    bad_flag(exe, name, ["--no-such-flag", "1"], "--no-such-flag", env)
    if int_flag:
        for junk in ("12x", "0x10", "1e3", "99999999999999999999999", " 5", ""):
            bad_flag(exe, name, [int_flag, junk], int_flag, env)


# --check-build: the build was set up with -Dcheck_build=true (scripts/test), and every program
# must say so on stderr when it starts and in its --json report (tools/cli.hpp); without it,
# neither may appear.
CHECK_BUILD = False
CHECK_BUILD_NOTE = "note: this build is the test suite's (meson -Dcheck_build=true"


def json_run(exe, name, args, fields, env=None, timeout=600, outputs=()):
    """Runs with --json in a fresh directory; `outputs` are further files (e.g. --plot) the
    run is expected to write there, checked by the caller through the returned directory."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "out.json")
        args = [a.replace("{dir}", d) for a in args]
        r = run([exe] + args + ["--json", path], env, timeout)
        if not check(r.returncode == 0, f"{name} {' '.join(args)}: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"):
            return None
        try:
            doc = strict_json(path)
        except Exception as e:  # noqa: BLE001 - any parse failure is the finding
            check(False, f"{name}: --json wrote invalid JSON: {e}")
            return None
        for f in fields:
            check(f in doc, f"{name}: JSON has no field {f!r} (has {sorted(doc)})")
        check((doc.get("check_build") is True) == CHECK_BUILD and ("check_build" in doc) == CHECK_BUILD,
              f"{name}: JSON's check_build is {doc.get('check_build')!r} in a build {'' if CHECK_BUILD else 'not '}for the checks")
        check((CHECK_BUILD_NOTE in r.stderr) == CHECK_BUILD,
              f"{name}: the check build's note {'missing from' if CHECK_BUILD else 'in'} its stderr: {r.stderr[:300]!r}")
        check(sorted(os.listdir(d)) == sorted(["out.json"] + [o for o, _ in outputs]),
              f"{name}: wrote {sorted(os.listdir(d))}, expected out.json and {[o for o, _ in outputs]} (temporary files left?)")
        for o, verify in outputs:
            if os.path.exists(os.path.join(d, o)):
                try:
                    verify(os.path.join(d, o), doc)
                except Exception as e:  # noqa: BLE001 - any failure is the finding
                    check(False, f"{name}: {o}: {e}")
        return doc


def mnist_cnn_more(exe, data, missing):
    """ParameterServer flags, --load, output paths checked at start, and Ctrl-C."""
    import signal
    import time
    # Parameter-server flags: mistakes before any data is read; meaningless flags refused.
    for args, flag in ((["--strategy", "parameter_server", "--sync", "ksync"], "--k"),
                       (["--strategy", "parameter_server", "--sync", "sync", "--k", "2"], "--k"),
                       (["--strategy", "parameter_server", "--workers", "2", "--sync", "kasync", "--k", "3"], "--k"),
                       (["--strategy", "parameter_server", "--sync", "kasync", "--k", "1", "--staleness", "2"], "--staleness"),
                       (["--strategy", "parameter_server", "--straggler", "exp:"], "--straggler"),
                       (["--strategy", "parameter_server", "--straggler", "slow:5:2"], "--straggler"),
                       (["--strategy", "parameter_server", "--clock", "wall"], "--clock"),
                       (["--strategy", "parameter_server", "--replicas", "2"], "--replicas"),
                       (["--strategy", "mirrored", "--workers", "2"], "--workers"),
                       (["--strategy", "pipeline", "--replicas", "2"], "--replicas"),
                       (["--strategy", "pipeline", "--stages", "8"], "--stages"),
                       (["--strategy", "hybrid", "--schedule", "zigzag"], "--schedule"),
                       (["--stages", "3"], "--stages"),
                       (["--epochs", "0"], "--epochs"),
                       (["--load", os.path.join(missing, "x.safetensors")], "--load"),
                       (["--save", os.path.join(missing, "w.safetensors")], "--save"),
                       (["--json", "/"], "--json"),
                       (["--plot", os.path.join(missing, "p.svg")], "--plot")):
        bad_flag(exe, "mnist_cnn", ["--data", missing] + args, flag)
    # Pipeline and hybrid (issue 21) train and say how they were cut.
    for args in (["--strategy", "pipeline", "--stages", "3", "--micro-batches", "3", "--schedule", "1f1b"],
                 ["--strategy", "hybrid", "--replicas", "2", "--stages", "2", "--micro-batches", "2"]):
        doc = json_run(exe, "mnist_cnn", ["--data", data, "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "16",
                                          "--verbose", "0"] + args, ["strategy", "replicas", "pipeline", "test_accuracy"])
        if doc:
            check(doc["pipeline"]["stages"] == int(args[args.index("--stages") + 1]), f"mnist_cnn {args}: pipeline field {doc['pipeline']}")
    r = run([exe, "--data", missing, "--threads", "999", "--epochs", "1"])
    check("warning: --threads 999" in r.stderr, f"mnist_cnn --threads 999: no warning ({r.stderr.strip()!r})")
    # Every sync mode trains on the parameter server (virtual clock) and reports its counts.
    for sync, extra in (("sync", []), ("ksync", ["--k", "1"]), ("kbatch_sync", ["--k", "2"]), ("kasync", ["--k", "1"]),
                        ("kbatch_async", ["--k", "2"]), ("async", ["--staleness", "1"])):
        doc = json_run(exe, "mnist_cnn", ["--data", data, "--strategy", "parameter_server", "--workers", "2", "--servers", "2",
                                          "--shards", "2", "--sync", sync, "--straggler", "exp:5", "--clock", "virtual",
                                          "--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "16", "--verbose", "0"] + extra,
                       ["updates", "cancelled", "dropped", "staleness_max", "staleness_mean", "seconds", "wall_seconds", "sync"])
        if doc:
            check(doc["updates"] == 3 and doc["sync"] == sync and doc["seconds"] > 0, f"mnist_cnn --sync {sync} JSON: {doc}")
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "w.safetensors")
        # Ctrl-C: the step in progress ends, --save is written, exit 130 with a line saying where.
        p = subprocess.Popen([exe, "--data", data, "--epochs", "1000", "--batch-size", "8", "--threads", "1", "--verbose", "0",
                              "--save", ckpt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        check(p.returncode == 130, f"mnist_cnn after SIGINT: exit {p.returncode}, expected 130 ({err.strip()[-300:]!r})")
        check("interrupted by SIGINT" in out and ckpt in out, f"mnist_cnn after SIGINT printed {out.strip()[-300:]!r}")
        check(os.path.exists(ckpt), "mnist_cnn after SIGINT: --save file missing")
        check(not [f for f in os.listdir(d) if ".tmp." in f], f"mnist_cnn after SIGINT left temporary files: {os.listdir(d)}")
        # --load with --epochs 0 evaluates the checkpoint; with more epochs it goes on from it.
        if os.path.exists(ckpt):
            doc = json_run(exe, "mnist_cnn", ["--data", data, "--load", ckpt, "--epochs", "0", "--verbose", "0"],
                           ["test_accuracy", "test_loss"])
            if doc:
                check(doc["epoch_loss"] == [] and 0 <= doc["test_accuracy"] <= 1, f"mnist_cnn --epochs 0 --load: {doc}")


def mnist_cnn_backup(exe, data):
    """--backup-dir: a run killed with SIGKILL after a backup, relaunched with the same flags,
    resumes from the backup and saves weights bitwise equal to an uninterrupted run's."""
    import signal
    import time
    with tempfile.TemporaryDirectory() as d:
        # 12 epochs of 24 steps: the kill below lands about 0.05 s after the first backup, and the
        # run must still be training then, on a fast machine too (3 epochs left only ~0.07 s here).
        common = ["--data", data, "--epochs", "12", "--steps-per-epoch", "24", "--batch-size", "8", "--threads", "1",
                  "--verbose", "0"]
        straight = os.path.join(d, "straight.safetensors")
        r = run([exe] + common + ["--save", straight])
        if not check(r.returncode == 0, f"mnist_cnn uninterrupted: exit {r.returncode} ({r.stderr.strip()[-300:]!r})"):
            return
        backup_dir = os.path.join(d, "backup")
        backup = os.path.join(backup_dir, "backup.safetensors")
        resumed = os.path.join(d, "resumed.safetensors")
        flags = common + ["--backup-dir", backup_dir, "--backup-every-steps", "5", "--save", resumed]
        p = subprocess.Popen([exe] + flags, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(backup) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.05)  # a few more steps: killed part-way through, maybe mid-write of the next backup
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not check(os.path.exists(backup) and not os.path.exists(resumed),
                     f"mnist_cnn --backup-dir: killed too late or no backup written (exit {p.returncode}, "
                     f"backup dir {os.listdir(backup_dir) if os.path.isdir(backup_dir) else 'missing'})"):
            return
        r = run([exe] + flags)
        check(r.returncode == 0, f"mnist_cnn relaunched with --backup-dir: exit {r.returncode} ({r.stderr.strip()[-300:]!r})")
        check("resumed from the backup" in r.stdout, f"mnist_cnn relaunched did not resume: {r.stdout.strip()[-300:]!r}")
        with open(straight, "rb") as a, open(resumed, "rb") as b:
            check(a.read() == b.read(), "mnist_cnn killed and resumed: weights differ from the uninterrupted run's")
        check(os.listdir(backup_dir) == [], f"mnist_cnn --backup-dir left {os.listdir(backup_dir)} after training ended")
        bad_flag(exe, "mnist_cnn", ["--data", data, "--backup-every-steps", "5"], "--backup-every-steps")


def catches(pid, sig):
    """Whether process `pid` has a handler for `sig` (Linux: SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except OSError:
        pass
    return False


def descendants(pid):
    """The process ids below `pid` (Linux: the parent field of /proc/*/stat)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parent.items() if p in frontier]
        found += kids
        frontier = kids
    return found


def mnist_cnn_hardening(exe, data, missing):
    """Hardening (issue 23, second round), as users and scripts meet it: each case below says what
    once went wrong."""
    import resource
    import signal
    import time
    ps = ["--data", data, "--strategy", "parameter_server", "--workers", "2", "--epochs", "1", "--steps-per-epoch", "3",
          "--batch-size", "8", "--threads", "1", "--verbose", "0"]
    # More workers or replicas than threads the machine can run are refused before the data is
    # read (--workers 1000 once grew to 24 GB until the kernel killed it).
    for args, flag in ((["--strategy", "parameter_server", "--workers", "1000"], "--workers 1000"),
                       (["--strategy", "mirrored", "--replicas", "1024"], "--replicas 1024")):
        if 16 * (os.cpu_count() or 1) >= 1000:
            break  # a machine of 63 hardware threads or more runs that many
        r = run([exe, "--data", missing] + args)
        check(r.returncode == 2 and flag + ": at most " in r.stderr and "hardware threads" in r.stderr,
              f"mnist_cnn {' '.join(args)}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    # --straggler "": says the value is empty and lists the forms (not `cannot read """"`).
    r = run([exe, "--data", missing, "--strategy", "parameter_server", "--straggler", ""])
    check(r.returncode == 2 and "--straggler: empty value; expected none | slow:WORKER:FACTOR | exp:MEAN_MS | "
          "sexp:SHIFT_MS:MEAN_MS" in r.stderr and '""' not in r.stderr,
          f"mnist_cnn --straggler '': exit {r.returncode}, stderr {r.stderr.strip()!r}")
    # Straggler durations out of range (a factor of 1e12 once overflowed the wait into no wait).
    for spec, says in (("slow:1:1e12", "FACTOR must be a finite number >= 1 and <= 1e+06"),
                       ("exp:1e12", "MEAN_MS must be a finite number > 0 and <= 8.64e+07"),
                       ("sexp:1e12:5", "SHIFT_MS must be a finite number >= 0 and <= 8.64e+07")):
        r = run([exe, "--data", missing, "--strategy", "parameter_server", "--straggler", spec])
        check(r.returncode == 2 and "--straggler" in r.stderr and says in r.stderr and '"' + spec + '"' in r.stderr,
              f"mnist_cnn --straggler {spec}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    # --timeout-ms reaches the parameter server: worker 1 sleeps ~1e5 times its compute time,
    # --sync sync waits for it, and the run fails naming it after 500 ms (not 60 s).
    t0 = time.monotonic()
    r = run([exe] + ps + ["--sync", "sync", "--straggler", "slow:1:100000", "--clock", "real", "--timeout-ms", "500"], timeout=120)
    took = time.monotonic() - t0
    check(r.returncode == 1 and "1 of 2 did not finish" in r.stderr and "within 500 ms" in r.stderr and took < 30,
          f"mnist_cnn parameter_server --timeout-ms 500: exit {r.returncode} after {took:.1f} s, stderr {r.stderr.strip()[-300:]!r}")
    # Ctrl-C ends an injected straggler delay: the step ends, --save is written, exit 130.
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "ps.safetensors")
        p = subprocess.Popen([exe] + ps + ["--sync", "sync", "--straggler", "slow:1:100000", "--clock", "real",
                                           "--timeout-ms", "600000", "--save", ckpt],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not catches(p.pid, signal.SIGINT) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until StopOnSignal is installed (fit is about to start)
        time.sleep(1)  # the first step's worker 1 is asleep for minutes
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        took = time.monotonic() - t0
        check(p.returncode == 130 and "interrupted by SIGINT" in out and took < 20,
              f"mnist_cnn parameter_server, SIGINT during a straggler's delay: exit {p.returncode} after {took:.1f} s "
              f"({out.strip()[-200:]!r} {err.strip()[-300:]!r})")
        check(os.path.exists(ckpt), "mnist_cnn parameter_server after SIGINT: --save file missing")
    # Under Open MPI's mpirun a Ctrl-C reaches the processes as SIGTERM (mpirun turns SIGINT into
    # SIGTERM for every process and exits 1 itself): the report says so, and the process exits 143.
    mpirun = shutil.which("mpirun")
    if mpirun:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none")
        p = subprocess.Popen([mpirun, "-np", "1", exe, "--data", data, "--strategy", "multi_worker_mirrored", "--epochs", "1000",
                              "--batch-size", "8", "--threads", "1", "--verbose", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while not any(catches(c, signal.SIGINT) and catches(c, signal.SIGTERM) for c in descendants(p.pid)) \
                and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the process under mpirun has installed StopOnSignal
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        check("interrupted by SIGTERM" in out and "mpirun sends SIGTERM to every process when it gets SIGINT" in out
              and "this process exits 143" in out,
              f"mpirun mnist_cnn, Ctrl-C: the report does not say how the signal arrived ({out.strip()[-400:]!r} {err.strip()[-300:]!r})")
    # --json: a path under a regular file is named as such, before any data is read.
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "file")
        open(f, "w").close()
        r = run([exe, "--data", missing, "--json", os.path.join(f, "out.json")])
        check(r.returncode == 2 and f"{f} is not a directory" in r.stderr,
              f"mnist_cnn --json FILE/out.json: exit {r.returncode}, stderr {r.stderr.strip()!r}")
        # A write that fails (here the file size limit: EFBIG, as ENOSPC on a full disk) says the
        # system's reason, and leaves no temporary file.
        def small_files():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
        out = os.path.join(d, "out.json")
        r = subprocess.run([exe, "--data", data, "--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "8",
                            "--threads", "1", "--verbose", "0", "--json", out],
                           capture_output=True, text=True, timeout=300, preexec_fn=small_files)
        check(r.returncode == 1 and "cannot write the JSON report" in r.stderr and os.strerror(27) in r.stderr,
              f"mnist_cnn --json over the file size limit: exit {r.returncode}, stderr {r.stderr.strip()!r} "
              f"(expected the reason, {os.strerror(27)!r})")
        check(sorted(os.listdir(d)) == ["file"], f"mnist_cnn --json failure left {sorted(os.listdir(d))}")
    # A signal after fit is not swallowed: SIGTERM during the final evaluation (a test set large
    # enough to take seconds on one thread) ends the process at once, and --save was written before it.
    with tempfile.TemporaryDirectory() as big, tempfile.TemporaryDirectory() as d:
        fake_mnist(big, train=64, test=30000)
        backup_dir = os.path.join(d, "backup")
        backup = os.path.join(backup_dir, "backup.safetensors")
        ckpt = os.path.join(d, "final.safetensors")
        p = subprocess.Popen([exe, "--data", big, "--epochs", "2", "--steps-per-epoch", "1", "--batch-size", "8", "--threads", "1",
                              "--verbose", "0", "--backup-dir", backup_dir, "--save", ckpt],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(backup) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # epoch 1 ended: its backup
        while os.path.exists(backup) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # fit returned: its backup is removed, the final evaluation begins
        soon = time.monotonic() + 1
        while catches(p.pid, signal.SIGTERM) and p.poll() is None and time.monotonic() < soon:
            time.sleep(0.005)  # until the handlers are released (--save written)
        running = p.poll() is None
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        took = time.monotonic() - t0
        if check(running, "mnist_cnn: the run ended before the final evaluation could be signalled"):
            check(p.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM) and took < 1.0,
                  f"mnist_cnn, SIGTERM during the final evaluate: exit {p.returncode} after {took:.2f} s, expected to end at "
                  f"once with SIGTERM ({out.strip()[-200:]!r} {err.strip()[-300:]!r})")
            check(os.path.exists(ckpt) and not [f for f in os.listdir(d) if ".tmp" in f],
                  f"mnist_cnn, SIGTERM during the final evaluate: --save missing or temporary files ({os.listdir(d)})")
def mnist_cnn_output_targets(exe, data):
    """Output targets (issue 41): a --save, --json or --plot that is a FIFO, a socket or (as root)
    a device node of our own, and names longer than the file system allows, are refused before
    the data is read (exit 2, the flag and what was found named), and the node is left as it was.
    Once a FIFO or device was replaced by a regular file after training (as root, `--json
    /dev/null` would have replaced /dev/null), and a name too long failed only after training."""
    import socket
    import stat
    with tempfile.TemporaryDirectory() as d:
        missing = os.path.join(d, "no-such-data")  # refused before the data would be read
        nodes = []
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        nodes.append((fifo, "found a FIFO"))
        sock_path = os.path.join(d, "sock")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(sock_path)
        nodes.append((sock_path, "found a socket"))
        if os.geteuid() == 0:
            dev = os.path.join(d, "null")
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
            nodes.append((dev, "found a character device"))
        for node, found in nodes:
            before = os.lstat(node)
            for flag in ("--save", "--json", "--plot"):
                r = run([exe, "--data", missing, "--epochs", "1", flag, node], timeout=60)
                check(r.returncode == 2 and f"{flag} {node}" in r.stderr and found in r.stderr,
                      f"mnist_cnn {flag} {node}: exit {r.returncode}, expected 2 naming it and {found!r}: {r.stderr.strip()!r}")
                after = os.lstat(node)
                check((after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), f"mnist_cnn {flag} {node}: the node was replaced")
            for flag in ("--tensorboard", "--backup-dir"):
                r = run([exe, "--data", missing, "--epochs", "1", flag, node], timeout=60)
                check(r.returncode == 2 and flag in r.stderr, f"mnist_cnn {flag} {node}: exit {r.returncode}: {r.stderr.strip()!r}")
        sock.close()
        name_max = os.pathconf(d, "PC_NAME_MAX")
        long_name = os.path.join(d, "n" * (name_max + 1))
        for flag in ("--save", "--json", "--plot"):
            r = run([exe, "--data", missing, "--epochs", "1", flag, long_name], timeout=60)
            check(r.returncode == 2 and flag in r.stderr and f"at most {name_max} bytes" in r.stderr,
                  f"mnist_cnn {flag} NAME_MAX+1 bytes: exit {r.returncode}, expected 2 naming NAME_MAX: {r.stderr.strip()[-300:]!r}")
        for flag in ("--tensorboard", "--backup-dir"):
            r = run([exe, "--data", missing, "--epochs", "1", flag, os.path.join(long_name, "logs")], timeout=60)
            check(r.returncode == 2 and flag in r.stderr and "NAME_MAX" in r.stderr,
                  f"mnist_cnn {flag} with a component of NAME_MAX+1 bytes: exit {r.returncode}: {r.stderr.strip()[-300:]!r}")
        deep = d
        while len(deep) < 4096:
            deep = os.path.join(deep, "d" * 100)
        r = run([exe, "--data", missing, "--epochs", "1", "--json", os.path.join(deep, "x.json")], timeout=60)
        check(r.returncode == 2 and "--json" in r.stderr, f"mnist_cnn --json past PATH_MAX: exit {r.returncode}: {r.stderr.strip()[-300:]!r}")
        # The negative control: a name of exactly NAME_MAX bytes is taken, trained and written.
        ok_name = os.path.join(d, "j" * name_max)
        r = run([exe, "--data", data, "--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "8", "--threads", "1",
                 "--verbose", "0", "--json", ok_name], timeout=300)
        check(r.returncode == 0 and os.path.isfile(ok_name), f"mnist_cnn --json of NAME_MAX bytes: exit {r.returncode}: {r.stderr[-300:]!r}")
        check(not [f for f in os.listdir(d) if ".tmp" in f], f"mnist_cnn output targets: temporary files left: {os.listdir(d)}")


def backup_position(path):
    """(epoch, batches) a backup was taken at, from its safetensors metadata."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n)).get("__metadata__", {})
    return int(meta["backup_epoch"]), int(meta["backup_batches"])


def killed_after_first_backup(cmd, backup):
    """Runs `cmd` until `backup` exists, then SIGKILL: the position it holds."""
    import signal
    import time
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(backup) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return backup_position(backup) if os.path.exists(backup) else None


def mnist_cnn_backup_issue41(exe, data):
    """--backup-dir (issue 41): a backup resumed with --backup-force under fewer --steps-per-epoch
    than it had done in its epoch is the ValueError docs/fault_tolerance.md promises (it once
    resumed at "30/20"); a pipeline backup is refused under another --stages, --micro-batches or
    --schedule, naming it (it once resumed without a word, then not bit for bit)."""
    with tempfile.TemporaryDirectory() as d:
        backup_dir = os.path.join(d, "backup")
        backup = os.path.join(backup_dir, "backup.safetensors")
        base = ["--data", data, "--epochs", "3", "--batch-size", "8", "--threads", "1", "--verbose", "0",
                "--backup-dir", backup_dir, "--backup-every-steps", "6"]
        at = killed_after_first_backup([exe] + base + ["--steps-per-epoch", "30"], backup)
        if check(at is not None, "mnist_cnn --backup-dir: no backup before the kill"):
            r = run([exe] + base + ["--steps-per-epoch", "5", "--backup-force"], timeout=300)
            if at[1] > 5:
                check(r.returncode == 1 and f"expected at most steps_per_epoch = 5 batches done in an epoch, found {at[1]}" in r.stderr
                      and "ValueError" not in r.stdout and "test accuracy" not in r.stdout,
                      f"mnist_cnn --backup-force with fewer steps per epoch than the backup's {at}: exit {r.returncode}, "
                      f"stdout {r.stdout.strip()[-200:]!r}, stderr {r.stderr.strip()[-300:]!r}")
                check(os.path.exists(backup), "mnist_cnn --backup-force refused: the backup was removed")
            else:
                print(f"note: the backup was taken at {at}, within 5 steps: the refusal could not be checked this time")
        for f in os.listdir(backup_dir) if os.path.isdir(backup_dir) else []:
            os.remove(os.path.join(backup_dir, f))
        pipe = base + ["--steps-per-epoch", "30", "--strategy", "pipeline", "--stages", "2", "--micro-batches", "2",
                       "--schedule", "gpipe"]
        at = killed_after_first_backup([exe] + pipe, backup)
        if check(at is not None, "mnist_cnn pipeline --backup-dir: no backup before the kill"):
            def changed(flag, value):
                args = list(pipe)
                args[args.index(flag) + 1] = value
                return args
            for flag, value, says in (("--stages", "3", "stages: the backup has 2, this run 3"),
                                      ("--micro-batches", "3", "micro-batches: the backup has 2, this run 3"),
                                      ("--schedule", "1f1b", "schedule: the backup has gpipe, this run 1f1b")):
                r = run([exe] + changed(flag, value), timeout=300)
                check(r.returncode == 1 and says in r.stderr and "test accuracy" not in r.stdout,
                      f"mnist_cnn pipeline backup resumed with {flag} {value}: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")
            # The negative control: the same flags resume it.
            r = run([exe] + pipe, timeout=300)
            check(r.returncode == 0 and "resumed from the backup" in r.stdout,
                  f"mnist_cnn pipeline backup with the same flags: exit {r.returncode}, stdout {r.stdout.strip()[-200:]!r}")


def mnist_cnn_backup_guards(exe, data):
    """--backup-dir keyed to its run: a backup made with other flags is refused naming each
    (--backup-force resumes it), a second live run on the directory is refused naming the
    first one's pid, and a dangling backup link is an error, not a fresh start."""
    import signal
    import time
    with tempfile.TemporaryDirectory() as d:
        backup_dir = os.path.join(d, "backup")
        backup = os.path.join(backup_dir, "backup.safetensors")
        def flags(batch="8", seed="42", precision=None):
            return (["--data", data, "--epochs", "3", "--steps-per-epoch", "24", "--batch-size", batch, "--seed", seed,
                     "--threads", "1", "--verbose", "0", "--backup-dir", backup_dir, "--backup-every-steps", "5"]
                    + (["--precision", precision] if precision else []))
        p = subprocess.Popen([exe] + flags(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(backup) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not check(os.path.exists(backup), "mnist_cnn --backup-dir: no backup written before the kill"):
            return
        for changed, expected in (({"batch": "4"}, "batch size: the backup has 8, this run 4"),
                                  ({"seed": "7"}, "seed: the backup has 42, this run 7"),
                                  ({"precision": "mixed_bfloat16"}, "precision: the backup has (not set), this run mixed_bfloat16")):
            r = run([exe] + flags(**changed), timeout=120)
            check(r.returncode == 1 and expected in r.stderr and backup_dir in r.stderr,
                  f"mnist_cnn resumed a backup with {changed}: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")
            check(os.path.exists(backup), f"mnist_cnn with {changed}: the refused backup was removed")
        r = run([exe] + flags(batch="4") + ["--backup-force"], timeout=300)
        check(r.returncode == 0 and "resumed from the backup" in r.stdout and "batch size: the backup has 8, this run 4" in r.stderr,
              f"mnist_cnn --backup-force: exit {r.returncode}, stdout {r.stdout.strip()[-200:]!r}, stderr {r.stderr.strip()[-300:]!r}")

        # Two live runs on one directory: the second is refused, naming the first's pid.
        long_run = [exe, "--data", data, "--epochs", "1000", "--steps-per-epoch", "24", "--batch-size", "8", "--threads", "1",
                    "--verbose", "0", "--backup-dir", backup_dir]
        p = subprocess.Popen(long_run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            lock = os.path.join(backup_dir, "lock")
            deadline = time.monotonic() + 60
            while p.poll() is None and time.monotonic() < deadline:
                if os.path.exists(lock) and open(lock).read().strip() == str(p.pid):
                    break
                time.sleep(0.01)
            r = run(long_run, timeout=120)
            check(r.returncode == 1 and f"in use by another run (process {p.pid}" in r.stderr and backup_dir in r.stderr,
                  f"mnist_cnn on a backup dir in use: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")
            check(p.poll() is None, "mnist_cnn: the first run on the backup dir stopped when a second one started")
        finally:
            p.kill()
            p.wait()

        # A dangling backup link: an error naming it, not a fresh start.
        for f in os.listdir(backup_dir):
            os.remove(os.path.join(backup_dir, f))
        os.symlink(os.path.join(d, "moved-away.safetensors"), backup)
        r = run([exe] + flags(), timeout=120)
        check(r.returncode == 1 and backup in r.stderr and "does not exist" in r.stderr and "test accuracy" not in r.stdout,
              f"mnist_cnn with a dangling backup link: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")
        bad_flag(exe, "mnist_cnn", ["--data", data, "--backup-force"], "--backup-force")


def mnist_cnn_launcher(exe, data):
    """A one-process strategy started by a parallel launcher with more than one process is refused
    (issue 22: never N silent copies). The launcher is simulated by its environment here
    (check_multi_worker.py starts real mpirun jobs); a Slurm batch script outside srun
    (SLURM_NTASKS only) is one process and trains."""
    quick = ["--data", data, "--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "8", "--verbose", "0"]
    for var, launcher in (("OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"), ("PMI_SIZE", "mpiexec (PMI"),
                          ("SLURM_STEP_NUM_TASKS", "srun (Slurm)")):
        # parameter_server is one job across the processes: 3 are not 1 + 1 server + 2 workers.
        r = run([exe, "--strategy", "parameter_server"] + quick, env={var: "3"})
        check(r.returncode == 2 and ("1 coordinator, 1 server(s) and 2 worker(s) need 4 processes (mpirun -np 4), found 3"
                                     in r.stderr or "across processes needs MPI, and this build has none" in r.stderr)
              and f"started 3 processes ({var}=3)" in r.stderr,
              f"mnist_cnn --strategy parameter_server with {var}=3: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")
        for strategy in ("one_device", "mirrored", "central_storage"):
            r = run([exe, "--strategy", strategy] + quick, env={var: "3"})
            check(r.returncode == 2 and f"--strategy {strategy} trains in one process, but {launcher}" in r.stderr
                  and f"started 3 processes ({var}=3)" in r.stderr and "test accuracy" not in r.stdout,
                  f"mnist_cnn --strategy {strategy} with {var}=3: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")
    # srun started 2 tasks but the MPI library was not initialised through Slurm's PMI (each
    # process sees MPI_COMM_WORLD of 1): multi_worker_mirrored stops before the data is read.
    srun_env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    r = run([exe, "--strategy", "multi_worker_mirrored"] + quick, env=srun_env, timeout=120)
    if "this build has no MPI" not in r.stderr:
        check(r.returncode == 1 and "MPI sees 1 process (MPI_COMM_WORLD has 1 rank), but srun (Slurm) started 2 processes "
              "(SLURM_STEP_NUM_TASKS=2)" in r.stderr and "srun --mpi=pmix" in r.stderr and "MNIST:" not in r.stdout,
              f"mnist_cnn under srun without PMI: exit {r.returncode}, {r.stderr.strip()[-400:]!r}")
    r = run([exe] + quick, env={"SLURM_NTASKS": "4", "OMPI_COMM_WORLD_SIZE": "1"})
    check(r.returncode == 0 and "test accuracy" in r.stdout,
          f"mnist_cnn in a batch script (SLURM_NTASKS=4, one process): exit {r.returncode}, {r.stderr.strip()[-300:]!r}")


def mnist_cnn_inputs(exe, data):
    """Bad inputs are refused before training, naming the file and what is wrong (issue 23): MNIST
    files of another image size or shape, an out-of-range label, a checkpoint holding a NaN."""
    import shutil
    for dims, says in (((16, 32, 32), "images are 32x32, the model expects 28x28"),
                       ((16, 14, 56), "images are 14x56, the model expects 28x28")):
        with tempfile.TemporaryDirectory() as d:
            fake_mnist(d)
            write_idx(os.path.join(d, "train-images-idx3-ubyte"), 0x803, dims, [0] * (dims[0] * dims[1] * dims[2]))
            r = run([exe, "--data", d, "--epochs", "1", "--steps-per-epoch", "1", "--verbose", "0"])
            check(r.returncode == 1 and says in r.stderr and "train-images-idx3-ubyte" in r.stderr,
                  f"mnist_cnn on {dims[1]}x{dims[2]} images: exit {r.returncode}, stderr {r.stderr.strip()[-300:]!r}")
    with tempfile.TemporaryDirectory() as d:
        fake_mnist(d)
        write_idx(os.path.join(d, "t10k-labels-idx1-ubyte"), 0x801, (100,), [i % 10 if i != 3 else 12 for i in range(100)])
        r = run([exe, "--data", d, "--epochs", "1", "--steps-per-epoch", "1", "--verbose", "0"])
        check(r.returncode == 1 and "the label at index 3 is 12" in r.stderr and "t10k-labels-idx1-ubyte" in r.stderr
              and "Epoch" not in r.stdout,
              f"mnist_cnn with a bad test label: exit {r.returncode}, stdout {r.stdout[-200:]!r}, stderr {r.stderr.strip()[-300:]!r}")
    # A checkpoint with one NaN weight (4 bytes overwritten in place) is refused at --load.
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "w.safetensors")
        r = run([exe, "--data", data, "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "16", "--verbose", "0",
                 "--save", ckpt])
        check(r.returncode == 0 and os.path.exists(ckpt), f"mnist_cnn --save: exit {r.returncode}, {r.stderr.strip()[-200:]!r}")
        if os.path.exists(ckpt):
            raw = bytearray(open(ckpt, "rb").read())
            n = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8:8 + n])
            begin = header["dense_1/kernel"]["data_offsets"][0]
            raw[8 + n + begin + 4 * 5: 8 + n + begin + 4 * 6] = struct.pack("<f", float("nan"))
            bad = os.path.join(d, "nan.safetensors")
            open(bad, "wb").write(bytes(raw))
            r = run([exe, "--data", data, "--epochs", "2", "--steps-per-epoch", "1", "--verbose", "0", "--load", bad])
            check(r.returncode == 1 and "'dense_1/kernel' holds nan at index 5" in r.stderr,
                  f"mnist_cnn --load with a NaN weight: exit {r.returncode}, stderr {r.stderr.strip()[-300:]!r}")


def check_devices(exe):
    """examples/devices: every section in the JSON; with a GPU, section 7's facts (its GPU half)."""
    common_checks(exe, "devices", None)
    doc = json_run(exe, "devices", [], ["physical_devices", "logical_devices", "placement_log", "memory_growth",
                                        "fixed_limit", "soft_placement", "gpus"])
    if doc:
        gpus = doc["gpus"]
        listed = [d for d in doc["physical_devices"] if d["kind"] == "GPU"]
        if "none" in gpus:
            # No GPU (or no CUDA in the build): the section says why, and none is listed.
            check(gpus["none"] != "" and not listed, f"devices without a GPU: {gpus}, listed {listed}")
        else:
            # A GPU: two logical GPUs with their own streams and limits (1024 and 512 MiB), the
            # placement log naming them, the 600 MiB request over GPU:1's limit refused with
            # the device and the limit named, the fixed limit reserved whole, and every GPU
            # hidden by set_visible_devices({}).
            names = [d["name"] for d in gpus["logical_gpus"]]
            check(listed and names == ["/device:GPU:0", "/device:GPU:1"] and gpus["distinct_streams"],
                  f"devices: logical GPUs {gpus.get('logical_gpus')}")
            check([d["memory_limit"] for d in gpus["logical_gpus"]] == [1024 << 20, 512 << 20],
                  f"devices: GPU limits {gpus['logical_gpus']}")
            check(any("/device:GPU:0" in l for l in gpus["placement_log"]) and
                  any("/device:GPU:1" in l for l in gpus["placement_log"]), f"devices: GPU placement {gpus['placement_log']}")
            check("/device:GPU:1" in gpus["over_limit_error"] and "512" in gpus["over_limit_error"],
                  f"devices: over-limit error {gpus['over_limit_error']!r}")
            check(gpus["fixed_limit"]["on_entry"]["reserved"] == 256 << 20, f"devices: fixed GPU limit {gpus['fixed_limit']}")
            check(gpus["with_gpus_hidden"] and all("GPU" not in n for n in gpus["with_gpus_hidden"]),
                  f"devices: GPUs hidden {gpus['with_gpus_hidden']}")


def check_gpu_cnn(exe):
    """benchmarks/gpu_cnn: flags; without a GPU exit 77 saying so, with one a JSON row per batch size."""
    help_lists(exe, "gpu_cnn", ["--batch-size", "--warmup", "--steps", "--reps", "--seed", "--cuda-graphs", "--json"])
    common_checks(exe, "gpu_cnn", "--steps")
    bad_flag(exe, "gpu_cnn", ["--batch-size", "128,0"], "--batch-size")
    bad_flag(exe, "gpu_cnn", ["--cuda-graphs", "maybe"], "--cuda-graphs")
    r = run([exe, "--steps", "2", "--warmup", "1", "--reps", "1", "--batch-size", "16"])
    if r.returncode == 77:
        check("no usable GPU" in r.stdout and "nothing measured" in r.stdout, f"gpu_cnn without a GPU: {r.stdout!r}")
    else:
        doc = json_run(exe, "gpu_cnn", ["--steps", "2", "--warmup", "1", "--reps", "1", "--batch-size", "16"],
                       ["benchmark", "machine", "gpu", "flops_per_image", "cuda_graphs", "rows"])
        if doc:
            check(len(doc["rows"]) == 1 and doc["rows"][0]["batch"] == 16, f"gpu_cnn rows: {doc['rows']}")
            # Graphs on (the default): both timed steps were replays, or the run would have failed.
            check(doc["cuda_graphs"] == "on" and doc["rows"][0]["graph_replays"] == 2, f"gpu_cnn graphs: {doc}")


def mnist_cnn_device(exe, data, missing):
    """--device auto|cpu|gpu: a GPU-only request without a GPU (or without CUDA in the build) is a
    clear error before the data is read, never a silent fallback; auto says where it trained.
    Where a GPU is usable, the GPU runs are checked instead (one_device; mirrored over 2 logical
    GPUs carved from one with a memory limit)."""
    short = ["--data", data, "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32", "--threads", "1", "--verbose", "0"]
    bad_flag(exe, "mnist_cnn", ["--data", missing, "--device", "tpu"], "--device")
    bad_flag(exe, "mnist_cnn", ["--data", missing, "--device", "gpu", "--logical-gpus", "0"], "--logical-gpus")
    r = run([exe, "--data", missing, "--device", "cpu", "--logical-gpus", "2"])
    check(r.returncode == 2 and "--logical-gpus is a GPU flag" in r.stderr,
          f"mnist_cnn --device cpu --logical-gpus 2: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    probe = run([exe] + short + ["--device", "gpu"])
    no_gpu = ("--device gpu: no usable GPU here" in probe.stderr or "--device gpu: this build of mnist_cnn has no CUDA" in probe.stderr)
    if probe.returncode != 0:
        check(probe.returncode == 2 and no_gpu and "mnist_cnn: error:" in probe.stderr,
              f"mnist_cnn --device gpu without a GPU: exit {probe.returncode}, stderr {probe.stderr.strip()!r}")
        # The same before any data is read, and for every GPU flag.
        for args in (["--device", "gpu"], ["--logical-gpus", "2"], ["--gpu-memory-mb", "512"],
                     ["--device", "gpu", "--strategy", "parameter_server"]):
            r = run([exe, "--data", missing] + args)
            check(r.returncode == 2 and ("no usable GPU here" in r.stderr or "has no CUDA" in r.stderr),
                  f"mnist_cnn {' '.join(args)} without a GPU: exit {r.returncode}, stderr {r.stderr.strip()!r}")
        doc = json_run(exe, "mnist_cnn", short + ["--device", "auto"], ["device", "device_name"])
        if doc:
            check(doc["device"] == "cpu" and doc["device_name"] != "", f"mnist_cnn --device auto without a GPU: {doc}")
        return
    # A GPU is here: --device gpu trained; auto picks it; the table and JSON name it.
    check("device" in probe.stdout and "gpu (" in probe.stdout, f"mnist_cnn --device gpu: table {probe.stdout[-800:]!r}")
    doc = json_run(exe, "mnist_cnn", short + ["--device", "auto"], ["device", "device_name"])
    if doc:
        check(doc["device"] == "gpu" and doc["device_name"] != "", f"mnist_cnn --device auto with a GPU: {doc}")
    doc = json_run(exe, "mnist_cnn", short + ["--device", "gpu", "--strategy", "mirrored", "--logical-gpus", "2",
                                              "--gpu-memory-mb", "2048"], ["device", "replicas"])
    if doc:
        check(doc["device"] == "gpu" and doc["replicas"] == 2, f"mnist_cnn mirrored over 2 logical GPUs: {doc}")
    doc = json_run(exe, "mnist_cnn", short + ["--device", "gpu", "--strategy", "parameter_server", "--workers", "2",
                                              "--sync", "sync"], ["device", "updates"])
    if doc:
        check(doc["device"] == "gpu" and doc["updates"] == 2, f"mnist_cnn parameter_server on the GPU: {doc}")
    r = run([exe] + short + ["--device", "gpu", "--strategy", "multi_worker_mirrored"])
    check(r.returncode == 2 and "does not train on the GPU" in r.stderr,
          f"mnist_cnn --device gpu --strategy multi_worker_mirrored: exit {r.returncode}, stderr {r.stderr.strip()!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", action="append", default=[], help="NAME=PATH of a built example or benchmark")
    p.add_argument("--only-hardening", action="store_true", help="only mnist_cnn_hardening (quick iteration)")
    p.add_argument("--only-gpu", action="store_true",
                   help="only the checks that differ where a GPU is: mnist_cnn --device, devices, gpu_cnn (a short device run)")
    p.add_argument("--check-build", action="store_true", help="the build was set up with -Dcheck_build=true")
    a = p.parse_args()
    global CHECK_BUILD
    CHECK_BUILD = a.check_build
    bins = dict(b.split("=", 1) for b in a.bin)
    if a.only_gpu:
        with tempfile.TemporaryDirectory() as data:
            fake_mnist(data)
            if "mnist_cnn" in bins:
                mnist_cnn_device(bins["mnist_cnn"], data, os.path.join(data, "no-such-dir"))
            if "devices" in bins:
                check_devices(bins["devices"])
            if "gpu_cnn" in bins:
                check_gpu_cnn(bins["gpu_cnn"])
        print(f"{len(failures)} failure(s)" if failures else "all checks passed")
        return 1 if failures else 0
    if a.only_hardening:
        with tempfile.TemporaryDirectory() as data:
            fake_mnist(data)
            mnist_cnn_hardening(bins["mnist_cnn"], data, os.path.join(data, "no-such-dir"))
            mnist_cnn_output_targets(bins["mnist_cnn"], data)
            mnist_cnn_inputs(bins["mnist_cnn"], data)
        print(f"{len(failures)} failure(s)" if failures else "all checks passed")
        return 1 if failures else 0
    mpi_env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader"}

    with tempfile.TemporaryDirectory() as data:
        fake_mnist(data)
        missing = os.path.join(data, "no-such-dir")

        if "mnist_cnn" in bins:
            exe = bins["mnist_cnn"]
            help_lists(exe, "mnist_cnn", ["--data", "--epochs", "--steps-per-epoch", "--batch-size", "--threads", "--seed",
                                          "--strategy", "--replicas", "--save", "--json", "--verbose", "--plot", "--tensorboard",
                                          "--backup-dir", "--backup-every-steps", "--device", "--logical-gpus",
                                          "--gpu-memory-mb", "--precision"])
            common_checks(exe, "mnist_cnn", "--epochs")
            # Flag mistakes come before the data is read: the data directory does not exist here.
            for args, flag in ((["--batch-size", "0"], "--batch-size"), (["--replicas", "2"], "--replicas"),
                               (["--strategy", "ring"], "--strategy"), (["--steps-per-epoch", "0"], "--steps-per-epoch"),
                               (["--verbose", "3"], "--verbose"), (["--seed", "-1"], "--seed"),
                               (["--threads", "-2"], "--threads")):
                bad_flag(exe, "mnist_cnn", ["--data", missing] + args, flag)
            r = run([exe, "--data", missing, "--epochs", "1"])
            check(r.returncode == 1 and "mnist_cnn: error:" in r.stderr and "no-such-dir" in r.stderr,
                  f"mnist_cnn with a missing data directory: exit {r.returncode}, stderr {r.stderr.strip()!r}")
            def verify_plot(path, doc):
                plots = check_plot.read_plots(path)
                series = {}
                for _, s, _ in plots:
                    series.update(s)
                for key, name in (("epoch_loss", "train loss"), ("epoch_accuracy", "train accuracy"),
                                  ("epoch_val_accuracy", "validation accuracy")):
                    got = [y for _, y, _, _ in series.get(name, [])]
                    if got != doc[key]:
                        raise ValueError(f"series {name!r} holds {got}, the JSON's {key} is {doc[key]}")
            def verify_tensorboard(path, doc):
                # Decoded by tests/check_tensorboard.py (Google's protobuf), in its own process:
                # it may need Debian's /usr/bin/python3.
                r = run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_tensorboard.py"),
                         "--logdir", path, "--tags", "epoch_loss", "epoch_accuracy", "epoch_lr",
                         "--validation-tags", "epoch_loss", "epoch_accuracy", "--epochs", "2"])
                if r.returncode != 0:
                    raise ValueError(r.stderr.strip() or r.stdout.strip())
            doc = json_run(exe, "mnist_cnn", ["--data", data, "--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "32",
                                              "--threads", "1", "--verbose", "0", "--plot", "{dir}/curves.svg",
                                              "--tensorboard", "{dir}/logs"],
                           ["framework", "device", "device_name", "strategy", "replicas", "threads", "epochs", "batch_size", "steps_per_epoch", "seed",
                            "test_accuracy", "test_loss", "train_images_per_second", "test_images_per_second", "seconds",
                            "epoch_loss", "epoch_accuracy", "epoch_val_accuracy", "epoch_train_seconds"],
                           outputs=[("curves.svg", verify_plot), ("logs", verify_tensorboard)])
            if doc:
                check(doc["epochs"] == 2 and len(doc["epoch_loss"]) == 2 and doc["steps_per_epoch"] == 2,
                      f"mnist_cnn JSON: {doc}")
                check(doc["test_images_per_second"] > 0, f"mnist_cnn JSON: test_images_per_second {doc['test_images_per_second']}")
            mnist_cnn_more(exe, data, missing)
            mnist_cnn_device(exe, data, missing)
            mnist_cnn_backup(exe, data)
            mnist_cnn_hardening(exe, data, missing)
            mnist_cnn_output_targets(exe, data)
            mnist_cnn_backup_guards(exe, data)
            mnist_cnn_backup_issue41(exe, data)
            mnist_cnn_inputs(exe, data)
            mnist_cnn_launcher(exe, data)

        if "custom_training_loop" in bins:
            exe = bins["custom_training_loop"]
            help_lists(exe, "custom_training_loop", ["--data", "--epochs", "--replicas", "--json"])
            common_checks(exe, "custom_training_loop", "--replicas")
            bad_flag(exe, "custom_training_loop", ["--data", missing, "--replicas", "0"], "--replicas")
            json_run(exe, "custom_training_loop", ["--data", data, "--replicas", "2", "--threads", "1", "--steps-per-epoch", "2",
                                                   "--batch-size", "32"],
                     ["strategy", "replicas", "test_accuracy", "test_loss", "train_images_per_second", "epoch_loss"])

    if "linear_regression" in bins:
        exe = bins["linear_regression"]
        common_checks(exe, "linear_regression", "--epochs")
        bad_flag(exe, "linear_regression", ["--epochs", "0"], "--epochs")
        doc = json_run(exe, "linear_regression", ["--epochs", "40"], ["epochs", "weight", "bias", "final_loss"])
        if doc:
            check(abs(doc["weight"] - 1) < 0.05 and abs(doc["bias"]) < 0.05, f"linear_regression did not learn y = x: {doc}")
        # Octal and hex are not read behind the user's back: "010" is ten.
        doc = json_run(exe, "linear_regression", ["--epochs", "010"], ["epochs"])
        if doc:
            check(doc["epochs"] == 10, f"linear_regression --epochs 010 ran {doc['epochs']} epochs, expected 10")

    if "custom_layer" in bins:
        exe = bins["custom_layer"]
        common_checks(exe, "custom_layer", "--epochs")
        doc = json_run(exe, "custom_layer", ["--epochs", "15"], ["layer", "epochs", "num_params", "epoch_loss", "final_loss", "alpha"])
        if doc:
            # The network with the user-defined layer learns: the loss falls tenfold and more.
            check(doc["final_loss"] < doc["epoch_loss"][0] / 10, f"custom_layer did not learn: {doc['epoch_loss']}")
            check(sorted(doc["alpha"]) == ["p_re_lu/alpha", "p_re_lu_1/alpha"], f"custom_layer alpha: {doc['alpha']}")
        # The same network with a user-defined loss (examples/huber.hpp) learns too.
        doc = json_run(exe, "custom_layer", ["--epochs", "15", "--loss", "huber"], ["loss", "epoch_loss", "final_loss"])
        if doc:
            check(doc["loss"] == "huber", f"custom_layer --loss huber reports loss {doc['loss']}")
            check(doc["final_loss"] < doc["epoch_loss"][0] / 10, f"custom_layer --loss huber did not learn: {doc['epoch_loss']}")

    if "tensor_basics" in bins:
        exe = bins["tensor_basics"]
        common_checks(exe, "tensor_basics", None)
        doc = json_run(exe, "tensor_basics", [], ["rows", "sum_of_probabilities", "column_sums"])
        if doc:
            check(abs(doc["sum_of_probabilities"] - 4) < 1e-4, f"tensor_basics: {doc}")

    if "devices" in bins:
        check_devices(bins["devices"])

    if "pipeline_dense" in bins:
        exe = bins["pipeline_dense"]
        common_checks(exe, "pipeline_dense", "--stages")
        bad_flag(exe, "pipeline_dense", ["--stages", "5"], "--stages")
        bad_flag(exe, "pipeline_dense", ["--schedule", "zigzag"], "--schedule")
        doc = json_run(exe, "pipeline_dense", ["--stages", "2", "--epochs", "1", "--examples", "256", "--micro-batches", "3"],
                       ["model_params", "devices", "memory_limit_bytes", "one_device_error", "pipeline"])
        if doc:
            # The point of the program: one device's limit is too small, two stages fit.
            err = doc["one_device_error"] or ""
            check("/device:CPU:0" in err and "memory limit" in err and "requested" in err,
                  f"pipeline_dense: OneDevice's error does not name the device, limit and request: {err!r}")
            stages = doc["pipeline"]["per_stage"]
            check(len(stages) == 2 and all(0 < s["peak_bytes"] <= s["limit_bytes"] for s in stages),
                  f"pipeline_dense: stage memory not within the limits: {stages}")

    if "vit_tensor_parallel" in bins:
        exe = bins["vit_tensor_parallel"]
        common_checks(exe, "vit_tensor_parallel", "--replicas")
        bad_flag(exe, "vit_tensor_parallel", ["--shards", "3"], "--shards")
        for shards, replicas in (("2", "1"), ("4", "2")):
            doc = json_run(exe, "vit_tensor_parallel", ["--shards", shards, "--replicas", replicas, "--examples", "64", "--batch-size", "16"],
                           ["model_params", "shards", "replicas", "per_shard", "split", "unsplit", "max_relative_weight_difference"])
            if doc:
                # The point of the program: the split model trains as the unsplit one (float32
                # rounding apart), its shards on their own logical devices, each holding memory.
                diff = doc["max_relative_weight_difference"]
                check(0 <= diff <= 1e-4, f"vit_tensor_parallel --shards {shards}: the split and unsplit models differ by {diff}")
                per = doc["per_shard"]
                check(len(per) == int(shards) and len({s["device"] for s in per}) == int(shards) and all(s["peak_bytes"] > 0 for s in per),
                      f"vit_tensor_parallel --shards {shards}: shards not each on a device of their own with memory: {per}")
                check(abs(doc["split"]["test_loss"] - doc["unsplit"]["test_loss"]) <= 1e-4 * abs(doc["unsplit"]["test_loss"]),
                      f"vit_tensor_parallel --shards {shards}: test losses differ: {doc['split']} vs {doc['unsplit']}")

    quick = ["--reps", "1", "--warmup", "0"]
    if "bench_reduce" in bins:
        exe = bins["bench_reduce"]
        common_checks(exe, "bench_reduce", "--reps")
        bad_flag(exe, "bench_reduce", ["--sizes", "1,x"], "--sizes")
        bad_flag(exe, "bench_reduce", ["--min-time", "nan"], "--min-time")
        bad_flag(exe, "bench_reduce", ["--min-time", "-1"], "--min-time")
        doc = json_run(exe, "bench_reduce", quick + ["--threads", "1", "--min-time", "0", "--sizes", "1"],
                       ["benchmark", "machine", "threads", "reps", "warmup", "min_time_s", "conventions", "rows"])
        if doc:
            check(doc["rows"] and "sum_gbps" in doc["rows"][0], f"bench_reduce rows: {doc['rows']}")
    if "bench_gemm" in bins:
        exe = bins["bench_gemm"]
        common_checks(exe, "bench_gemm", "--threads")
        bad_flag(exe, "bench_gemm", ["--pause", "x"], "--pause")
        doc = json_run(exe, "bench_gemm", quick + ["--threads", "1", "--min-time", "0", "--pause", "0", "--only", "square256"],
                       ["benchmark", "machine", "blas_warning", "threads", "reps", "rows"])
        if doc:
            check(len(doc["rows"]) == 1 and doc["rows"][0]["name"] == "square256", f"bench_gemm rows: {doc['rows']}")
    if "bench_allreduce" in bins:
        exe = bins["bench_allreduce"]
        common_checks(exe, "bench_allreduce", "--reps")
        bad_flag(exe, "bench_allreduce", ["--algorithms", "ring,tree"], "--algorithms")
        bad_flag(exe, "bench_allreduce", ["--participants", "2,0"], "--participants")
        doc = json_run(exe, "bench_allreduce", quick + ["--sizes-mb", "0.0625", "--participants", "2", "--algorithms", "direct"],
                       ["benchmark", "machine", "conventions", "rows"])
        if doc:
            row = doc["rows"][0]
            check(row["algorithm"] == "direct" and row["time_over_ring"] is None, f"bench_allreduce row: {row}")
    if "bench_hier_model" in bins:
        # It needs 2 declared hosts of 2 or more processes: alone, it says so (mpirun -np 4 runs it).
        r = run([bins["bench_hier_model"], "--reps", "1"], mpi_env, timeout=120)
        check(r.returncode == 2 and "expected an even number of processes >= 4, found 1" in r.stderr,
              f"bench_hier_model alone: exit {r.returncode}, {r.stderr.strip()[-300:]!r}")
    if "bench_mpi_allreduce" in bins:
        exe = bins["bench_mpi_allreduce"]
        common_checks(exe, "bench_mpi_allreduce", "--reps", mpi_env)
        json_run(exe, "bench_mpi_allreduce", quick + ["--sizes-mb", "0.0625"], ["benchmark", "machine", "rows"], mpi_env)
    if "bench_all_gather" in bins:  # one process here (every part its own); mpirun -np 2 measures
        exe = bins["bench_all_gather"]
        common_checks(exe, "bench_all_gather", "--reps", mpi_env)
        bad_flag(exe, "bench_all_gather", ["--sizes-mb", "1,x"], "--sizes-mb", mpi_env)
        doc = json_run(exe, "bench_all_gather", quick + ["--sizes-mb", "0.0625"], ["benchmark", "machine", "processes", "rows"], mpi_env)
        if doc:
            methods = [r["method"] for r in doc["rows"]]
            check(doc["processes"] == 1 and methods == ["MPI_Allgatherv", "strata shm sum", "strata shm gather", "strata mpi sum",
                                                        "strata mpi gather"], f"bench_all_gather rows: {doc['rows']}")

    if "gpu_cnn" in bins:  # nvcc; measures only where a GPU is, exits 77 (nothing measured) elsewhere
        check_gpu_cnn(bins["gpu_cnn"])
    if "bench_pingpong" in bins:  # needs 2 processes to measure; flags are checked on one
        common_checks(bins["bench_pingpong"], "bench_pingpong", "--reps", mpi_env)
        bad_flag(bins["bench_pingpong"], "bench_pingpong", ["--sizes-bytes", "8,0"], "--sizes-bytes", mpi_env)
    if "mwm_step" in bins:
        exe = bins["mwm_step"]
        common_checks(exe, "mwm_step", "--replicas", mpi_env)
        bad_flag(exe, "mwm_step", ["--transport", "tcp"], "--transport", mpi_env)
        doc = json_run(exe, "mwm_step", ["--replicas", "2", "--batch", "16", "--steps", "1", "--reps", "1", "--transport", "mpi"],
                       ["processes", "replicas", "step_seconds", "compute_seconds", "apply_seconds"], mpi_env)
        if doc:
            check(doc["processes"] == 1 and doc["replicas"] == 2 and doc["step_seconds"] > 0, f"mwm_step: {doc}")
    if "cost_model" in bins:
        exe = bins["cost_model"]
        common_checks(exe, "cost_model", "--reps")
        bad_flag(exe, "cost_model", ["--mwm-transport", "tcp"], "--mwm-transport")

        def verify_scaling_plot(path, doc):
            names = set()
            for _, s, _ in check_plot.read_plots(path):
                names.update(s)
            if not {"ring", "tree", "hierarchical"} <= names:
                raise ValueError(f"series {sorted(names)}")

        doc = json_run(exe, "cost_model", ["--reps", "1", "--steps", "1", "--batch", "16", "--replicas", "1,2", "--mpirun", "",
                                           "--mpirun-n", "", "--plot-dir", "{dir}"],
                       ["benchmark", "machine", "in_process", "compute", "check", "scaling", "bucket_sweep"],
                       outputs=[("scaling_efficiency.svg", verify_scaling_plot), ("scaling_bucket_sweep.svg", verify_scaling_plot),
                                ("scaling_check.svg", lambda path, doc: None)])
        if doc:
            check(doc["cross_process"] is None and [r["replicas"] for r in doc["check"]] == [1, 2, 2],
                  f"cost_model check rows: {doc['check']}")
            check(all(0 < e <= 1 for s in doc["scaling"] for e in s["efficiency"]), "cost_model: efficiencies outside (0, 1]")

    print(f"{len(failures)} failure(s)" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
