#!/usr/bin/env python3
"""mnist_cnn --strategy pipeline | hybrid run by mpirun, one stage per process, the way users
run it:

  * 2 processes (2 stages, 1F1B, 4 micro-batches) train one job: one report (rank 0's), one
    --json file, and the figures of the same pipeline in one process, bit for bit;
  * 4 processes (hybrid, 2 replicas x 2 stages) save with --save the bytes the same flags save
    in one process;
  * 3 stages, stage 1 stopped (SIGSTOP): the job ends non-zero after 2 timeouts, its neighbours
    naming stage 1 (rank 1) and the micro-batch (or, stopped at a sum over the stages, the sum
    naming rank 1 alone after 3); killed (SIGKILL): the job ends within seconds;
  * 3 processes for 2 stages are refused on every rank, naming the count needed;
  * ranks started with other flags (mpirun's `A : B` form): another --seed, --batch-size,
    --stages, --micro-batches, --schedule, training-set size, or --json / --plot /
    --tensorboard on a rank that is not rank 0 (which writes every file): refused on every
    rank within seconds, naming the setting and which rank has what (issue 41: they once
    trained to garbage, or dropped the file, with exit status 0);
  * a stop agreed by every rank at a step boundary (issue 41): SIGTERM to rank 1 alone of a
    2-stage pipeline writes --save and every rank exits 143 (it once ended with a message
    mismatch and no file); SIGINT to mpirun itself (Open MPI: SIGTERM to the ranks 1 s later,
    SIGKILL 1 s after that) writes --save, 3 times in a row.

  check_pipeline_processes.py --mpirun PATH --mnist-cnn PATH

The data is a tiny MNIST-shaped set written here. Standard library only.
"""
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_examples import check, strict_json  # noqa: E402 - beside this file
from check_examples import fake_mnist  # noqa: E402
from check_multi_worker import end_job, env, fault, mpi_job, ranks_of, refused_on_every_rank, verdict  # noqa: E402


def signal_stop(mpirun, exe, data, d, how, n):
    """A 2-stage pipeline training for long, stopped by SIGTERM to rank 1 alone (how = "rank1")
    or by SIGINT to mpirun (how = "mpirun", Ctrl-C): --save must be written, and with SIGTERM to
    rank 1 every rank must exit 143 (mpirun then exits 143 too, the first non-zero status)."""
    save = os.path.join(d, f"stop_{how}_{n}.safetensors")
    # A test set of MNIST's size: the validation pass it takes once ran on a stopped epoch and
    # outlasted Open MPI's grace (SIGKILL 1 s after SIGTERM), so the model was lost.
    big = os.path.join(d, "mnist_big_test")
    if not os.path.isdir(big):
        os.mkdir(big)
        fake_mnist(big, train=256, test=10000)
    cmd = [mpirun, "-np", "2", exe, "--data", big, "--strategy", "pipeline", "--stages", "2", "--micro-batches", "2",
           "--epochs", "100000", "--batch-size", "12", "--verbose", "2", "--threads", "1", "--save", save]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    # Rank 0's stdout is read on a thread, and the signal waits for its "Epoch 2/" line: a whole
    # epoch has run. A fixed 2 s sleep here ended, under meson test's MALLOC_PERTURB_ (every
    # allocation touches its pages: a slow start), before training began, and the job exited 1
    # without --save; waiting for "Epoch 1/" (printed before the first step) failed the same
    # way: a stop during the pipeline's first step is not saved (a known gap, docs/fault_tolerance.md).
    lines, errs, training = [], [], threading.Event()

    def read_stdout():
        for line in p.stdout:
            lines.append(line)
            if line.startswith("Epoch 2/"):  # a whole epoch of steps has run
                training.set()

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: errs.extend(p.stderr), daemon=True)]
    for r in readers:
        r.start()
    try:
        ranks, deadline = {}, time.time() + 60
        while len(ranks) < 2 and p.poll() is None and time.time() < deadline:
            ranks = ranks_of(p.pid, os.path.basename(exe))
            time.sleep(0.1)
        if not check(len(ranks) == 2, f"pipeline stop ({how}): the 2 processes did not start"):
            return
        if not check(training.wait(timeout=120), f"pipeline stop ({how}): training did not begin within 120 s"):
            return
        os.kill(ranks[1] if how == "rank1" else p.pid, signal.SIGTERM if how == "rank1" else signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            check(False, f"pipeline stop ({how}): still running 60 s after the signal (a hang)")
            return
        for r in readers:
            r.join(timeout=10)
        out, err = "".join(lines), "".join(errs)
        check(os.path.exists(save), f"pipeline stop ({how}, run {n}): --save was not written: exit {p.returncode}: "
                                    f"{out[-300:]!r} {err[-1200:]!r}")
        check("interrupted by SIGTERM" in out, f"pipeline stop ({how}, run {n}): rank 0 did not report the stop: {out[-300:]!r}")
        check("did not answer" not in err and "sent another message" not in err,
              f"pipeline stop ({how}, run {n}): the stages did not stop together: {err[-1200:]!r}")
        if how == "rank1":
            # Each rank's own status: mpirun reports the first non-zero one; a rank that did not
            # take the stop would exit 1 (an error) first, or hang.
            check(p.returncode == 143 and "Exit code:    1\n" not in err,
                  f"pipeline stop (SIGTERM to rank 1): exit {p.returncode}, expected 143 from every rank: {err[-800:]!r}")
    finally:
        end_job(p, list(ranks_of(p.pid, os.path.basename(exe)).values()))


def disagreeing_ranks(mpirun, exe, data, d):
    """Pipeline (2 processes) and hybrid (4) whose last rank has other flags: refused on every
    rank, naming the setting and who has what, before training."""
    small = os.path.join(d, "mnist_small")
    os.mkdir(small)
    fake_mnist(small, train=128)
    common = [exe, "--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "24", "--verbose", "0", "--threads", "1",
              "--timeout-ms", "20000"]
    pipe = ["--data", data, "--strategy", "pipeline", "--stages", "2", "--micro-batches", "2"]
    out = os.path.join(d, "rank1")
    cases = [
        ("--seed", pipe, pipe + ["--seed", "7"], "--seed: rank 0 has 42, rank 1 has 7"),
        ("--batch-size", pipe, pipe + ["--batch-size", "12"], "--batch-size: rank 0 has 24, rank 1 has 12"),
        ("--stages", pipe, pipe + ["--stages", "3"], "stages: rank 0 has 2, rank 1 has 3"),
        ("--micro-batches", pipe, pipe + ["--micro-batches", "3"], "micro_batches: rank 0 has 2, rank 1 has 3"),
        ("--schedule", pipe, pipe + ["--schedule", "1f1b"], "schedule: rank 0 has GPipe, rank 1 has 1F1B"),
        ("training images", pipe, ["--data", small] + pipe[2:], "training images: rank 0 has 256, rank 1 has 128"),
        ("--json on rank 1 only", pipe, pipe + ["--json", out + ".json"], "--json: rank 0 has (none), rank 1 has " + out + ".json"),
        ("--plot on rank 1 only", pipe, pipe + ["--plot", out + ".svg"], "--plot: rank 0 has (none), rank 1 has " + out + ".svg"),
        ("--tensorboard on rank 1 only", pipe, pipe + ["--tensorboard", out], "--tensorboard: rank 0 has (none), rank 1 has " + out),
    ]
    for name, a, b, expected in cases:
        refused_on_every_rank(mpirun, common, 1, 1, f"pipeline {name}", a, b, expected)
    check(not [f for f in os.listdir(d) if f.startswith("rank1")], f"pipeline: a refused rank wrote {os.listdir(d)}")
    hybrid = ["--data", data, "--strategy", "hybrid", "--replicas", "2", "--stages", "2", "--micro-batches", "2"]
    for name, b, expected in (("--seed", hybrid + ["--seed", "7"], "--seed: ranks 0, 1, 2 have 42, rank 3 has 7"),
                              ("training images", ["--data", small] + hybrid[2:],
                               "training images: ranks 0, 1, 2 have 256, rank 3 has 128")):
        refused_on_every_rank(mpirun, common, 3, 1, f"hybrid {name}", hybrid, b, expected)


def main():
    with mpi_job() as (args, d, data):
        exe = args.mnist_cnn
        common = ["--data", data, "--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "24", "--verbose", "0",
                  "--threads", "1"]

        def both(np, flags, name):
            """The same flags in one process and under mpirun -np NP: (one, many) reports, or None."""
            out = {}
            for where, cmd in (("one", [exe]), ("many", [args.mpirun, "-np", str(np), exe])):
                j, s = os.path.join(d, f"{name}_{where}.json"), os.path.join(d, f"{name}_{where}.safetensors")
                r = subprocess.run(cmd + common + flags + ["--json", j, "--save", s], capture_output=True, text=True,
                                   env=env(), timeout=300)
                if not check(r.returncode == 0, f"{name} ({where}): exit {r.returncode}: {r.stderr[-800:]!r}"):
                    return None
                check(r.stdout.count("test accuracy") == 1,
                      f"{name} ({where}): the report must be printed once: {r.stdout.count('test accuracy')} times")
                with open(s, "rb") as f:
                    out[where] = (strict_json(j), f.read())
            check(not [f for f in os.listdir(d) if ".tmp." in f], f"temporary files left: {os.listdir(d)}")
            return out

        got = both(2, ["--strategy", "pipeline", "--stages", "2", "--micro-batches", "4", "--schedule", "1f1b"], "pipeline")
        if got:
            one, many = got["one"][0], got["many"][0]
            for k in ("test_loss", "test_accuracy", "epoch_loss", "epoch_accuracy"):
                check(one[k] == many[k], f"pipeline across 2 processes: {k} {many[k]} against {one[k]} in one process")
            # The same pipeline; across processes also what rank 0 sent stage 1 (whole messages:
            # no tensor-parallel shards to part them among), in one process nothing crosses.
            settings = ("stages", "micro_batches", "schedule")
            check({k: one["pipeline"][k] for k in settings} == {k: many["pipeline"][k] for k in settings}
                  and "messages_sent" not in one["pipeline"] and many["pipeline"]["messages_sent"] > 0
                  and many["pipeline"]["message_bytes_sent"] > 0 and many["pipeline"]["scatter_gather"] is False,
                  f"pipeline across 2 processes: pipeline {many['pipeline']} against {one['pipeline']} in one process")
            check(got["one"][1] == got["many"][1], "pipeline across 2 processes saved other bytes than in one process")

        got = both(4, ["--strategy", "hybrid", "--replicas", "2", "--stages", "2", "--micro-batches", "2"], "hybrid")
        if got:
            check(got["many"][0]["replicas"] == 2, f"hybrid across 4 processes: {got['many'][0]}")
            check(got["one"][1] == got["many"][1], "hybrid across 4 processes saved other bytes than in one process")

        # Stage 1 of 3 stopped (SIGSTOP): its neighbours wait 2 timeouts (two stages on that side),
        # then name it; the job ends non-zero. Killed: the launcher ends the job.
        stages = ("--strategy", "pipeline", "--stages", "3", "--micro-batches", "2")
        rc, seconds, err = fault(args.mpirun, exe, data, "stall", np=3, victim_rank=1, strategy=stages)
        if rc is not None:
            check(rc != 0, "pipeline stall: the job exited 0")
            check(seconds < 2 * 3 + 30, f"pipeline stall: the job took {seconds:.1f} s after the stall to end")
            # Stopped between micro-batches, its neighbours name it (2 timeouts: the stages on
            # that side); stopped just before a sum over the stages that every other rank already
            # reached, the sum names it alone after 3 timeouts (the stages). Never a live rank.
            # A warning at half a timeout may list a rank then itself waiting for the stalled one
            # (rank 2 inside its receive while rank 0 is at a sum): only the errors must name it alone.
            errors = "\n".join(line for line in err.splitlines() if "warning:" not in line)
            named = ("stage 1 (rank 1) did not answer within 6000 ms" in errors and "micro-batch" in errors) or \
                "rank 1 of 3 did not arrive within 9000 ms" in errors
            check(named and "ranks 1, 2" not in errors and "rank 2 of 3 did not arrive" not in errors,
                  f"pipeline stall: no error naming stage 1 (rank 1) alone (and the micro-batch): {err[-1500:]!r}")
        rc, seconds, err = fault(args.mpirun, exe, data, "kill", np=3, victim_rank=1, strategy=stages)
        if rc is not None:
            check(rc != 0 and seconds < 30, f"pipeline kill: exit {rc} after {seconds:.1f} s")

        disagreeing_ranks(args.mpirun, exe, data, d)

        signal_stop(args.mpirun, exe, data, d, "rank1", 0)
        for n in range(3):  # not a race won once: Ctrl-C keeps the model every time
            signal_stop(args.mpirun, exe, data, d, "mpirun", n)

        r = subprocess.run([args.mpirun, "-np", "3", exe] + common + ["--strategy", "pipeline", "--stages", "2"],
                           capture_output=True, text=True, env=env(), timeout=120)
        need = "1 replica(s) × 2 stages need 2 processes (mpirun -np 2"
        check(r.returncode != 0 and r.stderr.count(need) == 3,
              f"mpirun -np 3 for 2 stages: exit {r.returncode}, refusals {r.stderr.count(need)} of 3: {r.stderr[-600:]!r}")
    return verdict("pipeline across processes")


if __name__ == "__main__":
    sys.exit(main())
