#!/usr/bin/env python3
"""tools/strata_train run the way users and scripts run it, a few steps on a tiny MNIST-shaped
data set written here (IDX files; no download):

  * --help lists every flag mnist_cnn has, strata_train's own (--model, --dataset, --optimizer,
    --learning-rate, --momentum), and the models and datasets with their descriptions;
  * an unknown model or dataset, and the optimizer flags' mistakes, exit 2 naming the flag (and
    the choices), before any data is read;
  * one_device and mirrored over 2 replicas: the JSON names the model, its size, the dataset,
    its classes and the optimizer;
  * --dataset fashion_mnist: the table says Fashion-MNIST, the JSON has its class names, and
    --data defaults to data/fashion_mnist;
  * the optimizer flags reach the optimizer (JSON optimizer_config);
  * strata_train's defaults train what mnist_cnn trains, bit for bit (the same saved weights);
  * with --mpirun: parameter_server under --global-clipnorm, and under --precision mixed_float16,
    across 5 processes saves the bytes of the same job in one process;
  * with --mpirun: multi_worker_mirrored over 2 processes, one report naming the model; a rank
    started with another learning rate or dataset is refused, naming it;
  * with --mpirun: --model vit --tensor-parallel 2 over 2 processes (a shard each), 2 replicas
    of 2 shards over 4 (multi_worker_mirrored), and 2 pipeline stages of 2 shards over 4 (the
    messages between stages in halves, or whole: the same bits, half the bytes): one report and
    the whole model's figures; --scatter-gather off without pipeline x tensor refused; another
    process count or strategy refused; ranks with another split refused, named; a stalled shard named;
  * --model resnet: its recipe by default, --sync-batch-norm auto/on/off, and the flags'
    combinations a strategy cannot honour refused (exit 2);
  * --model vit: its size and recipe by default, on one device and mirrored over 2 replicas, and
    --sync-batch-norm on refused (it has no batch normalization).
  * --precision: float32 by default (the JSON says so, with no loss scale); tf32 trains what
    float32 trains on a host, bit for bit; mixed_bfloat16 trains and says so; mixed_float16
    reports its loss scale and skipped steps (mirrored, a pipeline, the hybrid, the parameter
    server); an unknown name is a usage error (exit 2) before any data is read, in strata_train
    and mnist_cnn; under --mpirun a rank with another --precision is refused, naming it.

  check_strata_train.py --strata-train PATH [--mnist-cnn PATH] [--mpirun PATH]

Standard library only; the helpers are tests/check_examples.py's.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_examples as ce  # noqa: E402 - beside this file

FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
SHORT = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "16", "--threads", "1", "--verbose", "0",
         "--device", "cpu"]


def flags_in_help(exe):
    """The --flags a program's --help lists (the first word of each option line)."""
    r = ce.run([exe, "--help"])
    return {line.split()[0].split(",")[-1] for line in r.stdout.splitlines() if line.startswith("  --") or line.startswith("  -h")}


def check_help(exe, mnist_cnn):
    r = ce.run([exe, "--help"])
    ce.check(r.returncode == 0, f"strata_train --help: exit {r.returncode}")
    for text in ("--model", "--dataset", "--optimizer", "--learning-rate", "--momentum", "--tensor-parallel", "Models", "Datasets",
                 "  cnn ", "the seed CNN", "  vit ", "a Vision Transformer", "  mnist ", "  fashion_mnist ", "Zalando"):
        ce.check(text in r.stdout, f"strata_train --help does not show {text!r}")
    if mnist_cnn:
        missing = flags_in_help(mnist_cnn) - flags_in_help(exe)
        ce.check(not missing, f"strata_train lacks mnist_cnn's flags {sorted(missing)}")


def check_usage_errors(exe, missing):
    # Refused before any data is read: the data directory does not exist here.
    for args, flag, choices in ((["--model", "no_such_model"], "--model", "cnn"),
                                (["--dataset", "cifar10"], "--dataset", "mnist, fashion_mnist"),
                                (["--optimizer", "adagrad"], "--optimizer", "rmsprop, adam, sgd")):
        if ce.bad_flag(exe, "strata_train", ["--data", missing] + args, flag):
            r = ce.run([exe, "--data", missing] + args)
            ce.check(choices in r.stderr, f"strata_train {' '.join(args)}: the error does not list {choices!r}: {r.stderr.strip()!r}")
    for args, flag in ((["--learning-rate", "0"], "--learning-rate"), (["--learning-rate", "-1"], "--learning-rate"),
                       (["--learning-rate", "nan"], "--learning-rate"), (["--momentum", "1"], "--momentum"),
                       (["--optimizer", "adam", "--momentum", "0.9"], "--momentum"),
                       (["--strategy", "pipeline", "--stages", "8"], "--stages")):
        ce.bad_flag(exe, "strata_train", ["--data", missing] + args, flag)
    ce.common_checks(exe, "strata_train", "--epochs")


def check_runs(exe, data):
    fields = ["framework", "model", "model_params", "dataset", "classes", "optimizer", "learning_rate", "momentum",
              "optimizer_config", "device", "strategy", "replicas", "test_accuracy", "test_loss", "epoch_loss"]
    for args, replicas in (([], 1), (["--strategy", "mirrored", "--replicas", "2"], 2)):
        doc = ce.json_run(exe, "strata_train", ["--data", data] + SHORT + args, fields)
        if doc:
            ce.check(doc["model"] == "cnn" and doc["model_params"] == 121930 and doc["dataset"] == "mnist"
                     and doc["classes"] == [str(i) for i in range(10)] and doc["replicas"] == replicas
                     and doc["optimizer"] == "rmsprop" and doc["learning_rate"] == 0.001 and len(doc["epoch_loss"]) == 1,
                     f"strata_train {' '.join(args)} JSON: {doc}")
    # Fashion-MNIST from the directory given, then from its default directory.
    r = ce.run([exe, "--data", data, "--dataset", "fashion_mnist"] + SHORT)
    ce.check(r.returncode == 0 and "Fashion-MNIST: 256 training and 100 test images" in r.stdout
             and "fashion_mnist" in r.stdout, f"strata_train --dataset fashion_mnist: exit {r.returncode}, {r.stdout[-600:]!r} {r.stderr[-300:]!r}")
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run([exe, "--dataset", "fashion_mnist"] + SHORT, cwd=cwd, capture_output=True, text=True, timeout=120)
        ce.check(r.returncode == 1 and "data/fashion_mnist" in r.stderr,
                 f"strata_train --dataset fashion_mnist without its files: exit {r.returncode}, {r.stderr.strip()[-300:]!r}")
        os.makedirs(os.path.join(cwd, "data", "fashion_mnist"))
        ce.fake_mnist(os.path.join(cwd, "data", "fashion_mnist"))
        out = os.path.join(cwd, "out.json")
        r = subprocess.run([exe, "--dataset", "fashion_mnist", "--json", out] + SHORT, cwd=cwd, capture_output=True, text=True,
                           timeout=120)
        if ce.check(r.returncode == 0, f"strata_train --dataset fashion_mnist from data/fashion_mnist: exit {r.returncode}, {r.stderr[-300:]!r}"):
            doc = ce.strict_json(out)
            ce.check(doc["dataset"] == "fashion_mnist" and doc["classes"] == FASHION, f"strata_train fashion_mnist JSON: {doc}")
            ce.check("from data/fashion_mnist" in r.stdout, f"strata_train: the table does not name data/fashion_mnist: {r.stdout[-400:]!r}")
    # The optimizer flags reach the optimizer; each optimizer's default learning rate.
    for args, optimizer, lr, config in ((["--optimizer", "sgd", "--learning-rate", "0.05", "--momentum", "0.9"], "sgd", 0.05,
                                         "SGD(learning_rate=0.050000000000000003, momentum=0.90000000000000002, nesterov=false)"),
                                        (["--optimizer", "sgd"], "sgd", 0.01, "SGD(learning_rate=0.01,"),
                                        (["--optimizer", "adam", "--learning-rate", "0.002"], "adam", 0.002, "Adam(learning_rate=0.002"),
                                        (["--optimizer", "rmsprop", "--momentum", "0.5"], "rmsprop", 0.001, "RMSprop(learning_rate=0.001")):
        doc = ce.json_run(exe, "strata_train", ["--data", data] + SHORT + args, ["optimizer", "learning_rate", "optimizer_config"])
        if doc:
            ce.check(doc["optimizer"] == optimizer and doc["learning_rate"] == lr and doc["optimizer_config"].startswith(config),
                     f"strata_train {' '.join(args)}: JSON {doc['optimizer']}, {doc['learning_rate']}, {doc['optimizer_config']!r}")


def check_resnet(exe, data):
    """--model resnet: its recipe where no flag says otherwise, batch normalization synchronized
    where the strategy honours it (auto), and refused where it cannot be (exit 2)."""
    fields = ["model", "model_params", "non_trainable_params", "optimizer", "weight_decay", "lr_schedule", "warmup_epochs",
              "sync_batch_norm", "augment", "augment_pad", "learning_rate", "test_accuracy"]
    base = ["--data", data, "--model", "resnet", "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "16", "--threads", "1",
            "--verbose", "0", "--device", "cpu"]
    doc = ce.json_run(exe, "strata_train", base, fields)
    if doc:
        ce.check(doc["model"] == "resnet" and doc["model_params"] == 78042 and doc["non_trainable_params"] == 480
                 and doc["optimizer"] == "adamw" and doc["weight_decay"] == 0.01 and doc["lr_schedule"] == "cosine"
                 and doc["warmup_epochs"] == 1 and doc["learning_rate"] == 0.004 and doc["augment"] and doc["augment_pad"] == 1
                 and not doc["sync_batch_norm"], f"strata_train --model resnet (its recipe) JSON: {doc}")
    for args, synced in ((["--strategy", "mirrored", "--replicas", "2"], True),
                         (["--strategy", "mirrored", "--replicas", "2", "--sync-batch-norm", "off"], False),
                         (["--strategy", "central_storage", "--replicas", "2", "--sync-batch-norm", "on", "--augment", "off",
                           "--optimizer", "adam", "--lr-schedule", "constant", "--global-clipnorm", "1"], True),
                         # the hybrid syncs each micro-batch over its replicas when asked, not by default
                         (["--strategy", "hybrid", "--replicas", "2", "--micro-batches", "2"], False),
                         (["--strategy", "hybrid", "--replicas", "2", "--micro-batches", "2", "--sync-batch-norm", "on",
                           "--global-clipnorm", "1"], True),
                         # the servers sum their parts' squares, then each clips its shards by the whole norm
                         (["--strategy", "parameter_server", "--workers", "2", "--servers", "2", "--sync", "sync",
                           "--global-clipnorm", "1"], False)):
        doc = ce.json_run(exe, "strata_train", base + args, fields)
        if doc:
            ce.check(doc["sync_batch_norm"] == synced, f"strata_train resnet {' '.join(args)}: sync_batch_norm {doc['sync_batch_norm']}")
    missing = os.path.join(data, "no-such-dir")
    for args, flag in ((["--model", "resnet", "--strategy", "parameter_server", "--sync-batch-norm", "on"], "--sync-batch-norm"),
                       (["--model", "resnet", "--strategy", "pipeline", "--sync-batch-norm", "on"], "--sync-batch-norm"),
                       (["--model", "cnn", "--strategy", "mirrored", "--sync-batch-norm", "on"], "--sync-batch-norm"),
                       (["--model", "resnet", "--optimizer", "adam", "--weight-decay", "0.1"], "--weight-decay"),
                       (["--model", "cnn", "--warmup-epochs", "1"], "--warmup-epochs"),
                       (["--model", "cnn", "--augment-pad", "3"], "--augment-pad")):
        ce.bad_flag(exe, "strata_train", ["--data", missing] + args, flag)


def check_vit(exe, data):
    """--model vit: its size and recipe where no flag says otherwise, one device and mirrored over
    2 replicas (a couple of steps each), and --sync-batch-norm on refused (no batch norm)."""
    fields = ["model", "model_params", "non_trainable_params", "optimizer", "weight_decay", "lr_schedule", "warmup_epochs",
              "augment", "learning_rate", "replicas", "epoch_loss", "test_accuracy"]
    base = ["--data", data, "--model", "vit"] + SHORT
    for args, replicas in (([], 1), (["--strategy", "mirrored", "--replicas", "2"], 2)):
        doc = ce.json_run(exe, "strata_train", base + args, fields)
        if doc:
            ce.check(doc["model"] == "vit" and doc["model_params"] == 138890 and doc["non_trainable_params"] == 0
                     and doc["optimizer"] == "adamw" and doc["weight_decay"] == 0.05 and doc["lr_schedule"] == "cosine"
                     and doc["warmup_epochs"] == 1 and doc["learning_rate"] == 0.001 and not doc["augment"]
                     and doc["replicas"] == replicas and len(doc["epoch_loss"]) == 1,
                     f"strata_train --model vit {' '.join(args)} JSON: {doc}")
    ce.bad_flag(exe, "strata_train", ["--data", os.path.join(data, "no-such-dir"), "--model", "vit", "--strategy", "mirrored",
                                      "--sync-batch-norm", "on"], "--sync-batch-norm")
    # --tensor-parallel N: the attention layers split by heads and the MLPs column-then-row over
    # N logical devices, alone and under mirrored replicas. The split model holds the same
    # variables and draws the same initial values: it trains like the whole one on the same
    # batches, to the order of the sums over the shards.
    fields = ["tensor_parallel", "replicas", "epoch_loss", "test_loss", "test_accuracy"]
    whole = {r: ce.json_run(exe, "strata_train", base + (["--strategy", "mirrored", "--replicas", str(r)] if r > 1 else []), fields)
             for r in (1, 2)}
    for args, shards, replicas in ((["--tensor-parallel", "2"], 2, 1),
                                   (["--tensor-parallel", "4", "--strategy", "mirrored", "--replicas", "2"], 4, 2)):
        doc = ce.json_run(exe, "strata_train", base + args, fields)
        ref = whole[replicas]
        if doc and ref:
            close = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(doc["epoch_loss"] + [doc["test_loss"]],
                                                                    ref["epoch_loss"] + [ref["test_loss"]]))
            ce.check(doc["tensor_parallel"] == shards and doc["replicas"] == replicas and close,
                     f"strata_train --model vit {' '.join(args)}: JSON {doc} against the whole model's {ref}")
    r = ce.run([exe] + base + ["--tensor-parallel", "2", "--verbose", "2"])
    ce.check(r.returncode == 0 and re.search(r"^tensor parallel +2 shards", r.stdout, re.M) is not None,
             f"strata_train --tensor-parallel 2: the table does not say so: {r.stdout[-800:]!r}")
    missing = os.path.join(data, "no-such-dir")
    for args in (["--model", "cnn", "--tensor-parallel", "2"],              # no split form
                 ["--model", "vit", "--tensor-parallel", "3"],              # compiled for 2 and 4
                 ["--model", "vit", "--tensor-parallel", "2", "--strategy", "central_storage", "--replicas", "2"],
                 ["--model", "vit", "--tensor-parallel", "2", "--device", "gpu"]):
        ce.bad_flag(exe, "strata_train", ["--data", missing] + args, "--tensor-parallel")
    # Messages in parts only between stages split over processes.
    for args in (["--scatter-gather", "off"], ["--model", "vit", "--tensor-parallel", "2", "--scatter-gather", "off"],
                 ["--strategy", "pipeline", "--scatter-gather", "off"]):
        ce.bad_flag(exe, "strata_train", ["--data", missing] + args, "--scatter-gather")


def check_precision(exe, mnist_cnn, data):
    """--precision: each policy a few steps on the tiny data set, and its usage errors."""
    missing = os.path.join(data, "no-such-dir")
    for prog, name in ((exe, "strata_train"), (mnist_cnn, "mnist_cnn")):
        if not prog:
            continue
        if ce.bad_flag(prog, name, ["--data", missing, "--precision", "float8"], "--precision"):
            r = ce.run([prog, "--data", missing, "--precision", "float8"])
            ce.check("float32, tf32, mixed_bfloat16, mixed_float16" in r.stderr and "'float8'" in r.stderr,
                     f"{name} --precision float8: the error does not list the policies: {r.stderr.strip()!r}")
    fields = ["precision", "strategy", "replicas", "epoch_loss", "test_accuracy", "test_loss"]
    doc = ce.json_run(exe, "strata_train", ["--data", data] + SHORT, fields)
    if doc:
        ce.check(doc["precision"] == "float32" and "loss_scale" not in doc and "skipped_steps" not in doc,
                 f"strata_train (default precision) JSON: {doc}")
    doc = ce.json_run(exe, "strata_train", ["--data", data, "--precision", "mixed_bfloat16"] + SHORT, fields)
    if doc:
        ce.check(doc["precision"] == "mixed_bfloat16" and "loss_scale" not in doc and len(doc["epoch_loss"]) == 1
                 and doc["epoch_loss"][0] is not None and 0 < doc["epoch_loss"][0] < 10 and doc["test_loss"] is not None,
                 f"strata_train --precision mixed_bfloat16 JSON: {doc}")
    doc = ce.json_run(exe, "strata_train", ["--data", data, "--precision", "mixed_float16", "--strategy", "mirrored",
                                            "--replicas", "2"] + SHORT, fields + ["loss_scale", "skipped_steps", "optimizer_iterations"])
    if doc:
        # 2 steps from the initial scale 2^15: each skipped step halves it; the others are applied.
        skipped = doc["skipped_steps"]
        ce.check(doc["precision"] == "mixed_float16" and doc["replicas"] == 2 and isinstance(skipped, int)
                 and 0 <= skipped <= 2 and doc["optimizer_iterations"] == 2 - skipped
                 and doc["loss_scale"] == 32768.0 / 2 ** skipped and len(doc["epoch_loss"]) == 1,
                 f"strata_train --precision mixed_float16 --strategy mirrored JSON: {doc}")
    # ... and a pipeline's stages, which sum their gradients' squares before any applies, and the
    # hybrid, its copies too: one decision a step, the same counts as above.
    # ... and the parameter server's servers, which sum their parts' squares before any applies.
    for args in (["--strategy", "pipeline"], ["--strategy", "hybrid", "--replicas", "2", "--micro-batches", "2"],
                 ["--strategy", "parameter_server", "--workers", "2", "--servers", "2", "--sync", "sync", "--clock", "virtual"]):
        doc = ce.json_run(exe, "strata_train", ["--data", data, "--precision", "mixed_float16"] + args + SHORT,
                          fields + ["loss_scale", "skipped_steps", "optimizer_iterations"])
        if doc:
            skipped = doc["skipped_steps"]
            ce.check(doc["precision"] == "mixed_float16" and isinstance(skipped, int) and 0 <= skipped <= 2
                     and doc["optimizer_iterations"] == 2 - skipped and doc["loss_scale"] == 32768.0 / 2 ** skipped,
                     f"strata_train --precision mixed_float16 {' '.join(args)} JSON: {doc}")
    # tf32 is float32 on a host: the same weights after the same steps.
    with tempfile.TemporaryDirectory() as d:
        saved = {}
        for policy in ("float32", "tf32"):
            path = os.path.join(d, policy + ".safetensors")
            r = ce.run([exe, "--data", data, "--precision", policy, "--save", path] + SHORT)
            if ce.check(r.returncode == 0 and f"{'precision':<28} {policy}\n" in r.stdout,
                        f"strata_train --precision {policy}: exit {r.returncode}, {r.stdout[-400:]!r} {r.stderr[-300:]!r}"):
                with open(path, "rb") as f:
                    saved[policy] = f.read()
        if len(saved) == 2:
            ce.check(saved["float32"] == saved["tf32"], "strata_train --precision tf32 and float32 saved different weights on a host")


def check_same_as_mnist_cnn(exe, mnist_cnn, data):
    """strata_train's defaults are mnist_cnn's program: the same weights after the same steps."""
    with tempfile.TemporaryDirectory() as d:
        saved = {}
        for name, prog, extra in (("mnist_cnn", mnist_cnn, []), ("strata_train", exe, ["--model", "cnn", "--dataset", "mnist"])):
            path = os.path.join(d, name + ".safetensors")
            r = ce.run([prog, "--data", data, "--seed", "5", "--save", path] + SHORT + extra)
            if ce.check(r.returncode == 0, f"{name} --save: exit {r.returncode}, {r.stderr[-300:]!r}"):
                with open(path, "rb") as f:
                    saved[name] = f.read()
        if len(saved) == 2:
            ce.check(saved["mnist_cnn"] == saved["strata_train"], "strata_train --model cnn --dataset mnist and mnist_cnn saved different weights")


def check_mpirun(exe, mpirun, data):
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        r = ce.run([mpirun, "-np", "2", exe, "--data", data, "--strategy", "multi_worker_mirrored", "--replicas", "1",
                    "--json", out] + SHORT, env, timeout=300)
        if ce.check(r.returncode == 0, f"mpirun -np 2 strata_train multi_worker_mirrored: exit {r.returncode}, {r.stderr[-600:]!r}"):
            doc = ce.strict_json(out)
            ce.check(doc["model"] == "cnn" and doc["replicas"] == 2 and r.stdout.count("test accuracy") == 1,
                     f"mpirun strata_train: JSON {doc}, {r.stdout.count('test accuracy')} reports")
    # The dataset and the optimizer are among the settings every rank must share.
    common = [exe, "--data", data, "--strategy", "multi_worker_mirrored", "--replicas", "1"] + SHORT
    for extra, named in ((["--learning-rate", "0.002"], "optimizer: rank 0 has RMSprop(learning_rate=0.001), rank 1 has RMSprop("),
                         (["--dataset", "fashion_mnist"], "--dataset: rank 0 has mnist, rank 1 has fashion_mnist"),
                         (["--precision", "mixed_bfloat16"], "--precision: rank 0 has float32, rank 1 has mixed_bfloat16")):
        r = ce.run([mpirun, "-np", "1"] + common + [":", "-np", "1"] + common + extra, env, timeout=300)
        ce.check(r.returncode != 0 and named in r.stderr,
                 f"mpirun strata_train, {' '.join(extra)} on rank 1 only: exit {r.returncode}, {r.stderr[-600:]!r}")
    # Synchronized batch normalization too: the same network on every rank, or a named refusal.
    resnet = common + ["--model", "resnet"]
    r = ce.run([mpirun, "-np", "1"] + resnet + ["--sync-batch-norm", "on", ":", "-np", "1"] + resnet + ["--sync-batch-norm", "off"],
               env, timeout=300)
    ce.check(r.returncode != 0 and r.stderr.count("--sync-batch-norm: rank 0 has on, rank 1 has off") == 2,
             f"mpirun strata_train resnet, --sync-batch-norm on and off: exit {r.returncode}, {r.stderr[-600:]!r}")
    # The hybrid across 4 processes (2 replicas x 2 stages), each micro-batch's statistics summed
    # over the replicas' ranks of its stage.
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "hybrid.json")
        r = ce.run([mpirun, "-np", "4", exe, "--data", data, "--model", "resnet", "--strategy", "hybrid", "--replicas", "2",
                    "--stages", "2", "--micro-batches", "2", "--sync-batch-norm", "on", "--json", out] + SHORT, env, timeout=300)
        if ce.check(r.returncode == 0, f"mpirun -np 4 strata_train resnet hybrid --sync-batch-norm on: exit {r.returncode}, "
                                       f"{r.stderr[-600:]!r}"):
            doc = ce.strict_json(out)
            ce.check(doc["sync_batch_norm"] and doc["replicas"] == 2 and r.stdout.count("test accuracy") == 1,
                     f"mpirun strata_train resnet hybrid: JSON {doc}, {r.stdout.count('test accuracy')} reports")
    # --tensor-parallel 2 across 2 processes (rank j shard j of every split layer): one report,
    # and the whole model's figures on the same batches, to the order of the sums; a launcher of
    # another size, or another strategy, refused on every rank.
    vit = [exe, "--data", data, "--model", "vit"] + SHORT
    with tempfile.TemporaryDirectory() as d:
        out, whole = os.path.join(d, "tp.json"), os.path.join(d, "whole.json")
        ref = ce.run(vit + ["--json", whole], timeout=300)
        r = ce.run([mpirun, "-np", "2"] + vit + ["--tensor-parallel", "2", "--verbose", "2", "--json", out], env, timeout=300)
        if ce.check(r.returncode == 0 and ref.returncode == 0,
                    f"mpirun -np 2 strata_train vit --tensor-parallel 2: exit {r.returncode}, {r.stderr[-600:]!r}"):
            doc, base = ce.strict_json(out), ce.strict_json(whole)
            close = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(doc["epoch_loss"] + [doc["test_loss"]],
                                                                    base["epoch_loss"] + [base["test_loss"]]))
            ce.check(doc["tensor_parallel"] == 2 and doc["tensor_parallel_across_processes"] and close
                     and r.stdout.count("test accuracy") == 1 and "2 shards (MPI processes" in r.stdout,
                     f"mpirun strata_train vit --tensor-parallel 2: JSON {doc} against the whole model's {base}, "
                     f"{r.stdout.count('test accuracy')} reports")
        # Data x tensor: 2 replicas (multi_worker_mirrored) of 2 shards over 4 processes.
        r = ce.run([mpirun, "-np", "4"] + vit + ["--tensor-parallel", "2", "--strategy", "multi_worker_mirrored", "--replicas", "1",
                                                 "--json", out], env, timeout=300)
        if ce.check(r.returncode == 0, f"mpirun -np 4 strata_train vit --tensor-parallel 2 multi_worker_mirrored: exit {r.returncode}, "
                                       f"{r.stderr[-600:]!r}"):
            doc = ce.strict_json(out)
            close = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(doc["epoch_loss"] + [doc["test_loss"]],
                                                                    base["epoch_loss"] + [base["test_loss"]]))
            ce.check(doc["replicas"] == 2 and doc["tensor_parallel"] == 2 and close and r.stdout.count("test accuracy") == 1,
                     f"mpirun -np 4 strata_train vit --tensor-parallel 2 multi_worker_mirrored: JSON {doc} against {base}")
        # Pipeline x tensor: 2 stages of 2 shards over 4 processes (ranks 0, 1 stage 0), the
        # messages between the stages in halves gathered on arrival (--scatter-gather on, the
        # default) or whole: the same figures to the bit in as many messages, half the bytes; and
        # the whole model's figures to the order of the sums.
        piped = {}
        for sg in ("on", "off"):
            r = ce.run([mpirun, "-np", "4"] + vit + ["--tensor-parallel", "2", "--strategy", "pipeline", "--stages", "2",
                                                     "--scatter-gather", sg, "--json", out], env, timeout=300)
            if ce.check(r.returncode == 0 and r.stdout.count("test accuracy") == 1,
                        f"mpirun -np 4 strata_train vit --tensor-parallel 2 --strategy pipeline --scatter-gather {sg}: exit "
                        f"{r.returncode}, {r.stdout.count('test accuracy')} reports, {r.stderr[-600:]!r}"):
                piped[sg] = ce.strict_json(out)
        if len(piped) == 2 and ref.returncode == 0:
            on, off, base = piped["on"]["pipeline"], piped["off"]["pipeline"], ce.strict_json(whole)
            close = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(piped["on"]["epoch_loss"] + [piped["on"]["test_loss"]],
                                                                    base["epoch_loss"] + [base["test_loss"]]))
            ce.check(close and piped["on"]["epoch_loss"] == piped["off"]["epoch_loss"]
                     and piped["on"]["test_loss"] == piped["off"]["test_loss"] and on["scatter_gather"] and not off["scatter_gather"]
                     and on["messages_sent"] == off["messages_sent"] > 0
                     and 2 * on["message_bytes_sent"] == off["message_bytes_sent"] > 0,
                     f"mpirun -np 4 strata_train vit --tensor-parallel 2 --strategy pipeline: JSON {piped} against {base}")
    for np_, extra, named in (("2", ["--tensor-parallel", "4"], "needs one process per shard (mpirun -np 4), found 2"),
                              ("2", ["--tensor-parallel", "2", "--strategy", "mirrored", "--replicas", "2"], "not mirrored"),
                              ("6", ["--tensor-parallel", "2", "--strategy", "pipeline", "--stages", "2"],
                               "1 replica(s) × 2 stages × 2 shards need 4 processes (mpirun -np 4"),
                              ("2", ["--tensor-parallel", "2", "--strategy", "multi_worker_mirrored", "--replicas", "2"],
                               "one replica per process (--replicas 1)")):
        r = ce.run([mpirun, "-np", np_] + vit + extra, env, timeout=300)
        ce.check(r.returncode != 0 and named in r.stderr,
                 f"mpirun -np {np_} strata_train vit {' '.join(extra)}: exit {r.returncode}, {r.stderr[-600:]!r}")
    # Pipeline x tensor with the messages in parts on ranks 0-1 and whole on ranks 2-3: each
    # shard's pipeline would send parts where whole messages are expected; refused on every rank.
    pt = vit + ["--tensor-parallel", "2", "--strategy", "pipeline", "--stages", "2"]
    r = ce.run([mpirun, "-np", "2"] + pt + ["--scatter-gather", "on", ":", "-np", "2"] + pt + ["--scatter-gather", "off"], env,
               timeout=300)
    ce.check(r.returncode != 0 and "scatter_gather: rank 0 has on, rank 2 has off" in r.stderr
             and "scatter_gather: rank 1 has on, rank 3 has off" in r.stderr,
             f"mpirun strata_train vit pipeline x tensor, --scatter-gather on and off: exit {r.returncode}, {r.stderr[-600:]!r}")
    # Ranks started with another split: named on every rank when they join.
    mw = ["--strategy", "multi_worker_mirrored", "--replicas", "1"]
    r = ce.run([mpirun, "-np", "1"] + vit + mw + ["--tensor-parallel", "2", ":", "-np", "1"] + vit + mw, env, timeout=300)
    ce.check(r.returncode != 0 and r.stderr.count("--tensor-parallel: rank 0 has 2, rank 1 has 1") == 2,
             f"mpirun strata_train vit, --tensor-parallel 2 on rank 0 only: exit {r.returncode}, {r.stderr[-600:]!r}")
    # A shard that stalls (SIGSTOP) mid-training: the other names it within the deadline, in the
    # sum it waited in (a split layer's, or the step's stop agreement between two steps), and the
    # job ends.
    import check_multi_worker as cmw
    rc, secs, err = cmw.fault(mpirun, exe, data, "stall", timeout_ms=3000, np=2, victim_rank=1,
                              strategy=("--model", "vit", "--tensor-parallel", "2"))
    if rc is not None:
        named = [line for line in err.splitlines() if "rank 1 of 2 did not arrive within 3000 ms" in line]
        ce.check(rc != 0 and named and not any("rank 0 of 2 did not arrive" in line for line in err.splitlines()),
                 f"mpirun -np 2 strata_train vit --tensor-parallel 2, rank 1 stopped: exit {rc} after {secs:.1f} s, "
                 f"{[line for line in err.splitlines() if 'error' in line]!r}")
    # ParameterServer across 5 processes (coordinator, 2 servers, 2 workers) under global_clipnorm:
    # each server sends its part's sum of squares, the coordinator the whole back, and every
    # server clips its shards by the whole norm; the bytes of the same job in one process, and
    # not those of the unclipped job (the clip acts).
    ps = [exe, "--data", data, "--strategy", "parameter_server", "--workers", "2", "--servers", "2", "--sync", "sync",
          "--clock", "virtual", "--epochs", "2", "--steps-per-epoch", "4", "--batch-size", "8", "--verbose", "0", "--threads", "1"]
    with tempfile.TemporaryDirectory() as d:
        saved = {name: os.path.join(d, name + ".safetensors") for name in ("one", "many", "unclipped")}
        for name in ("one16", "many16"):
            saved[name] = os.path.join(d, name + ".safetensors")
        mixed = ["--precision", "mixed_float16"]
        runs = {"one": (ps + ["--global-clipnorm", "0.05", "--save", saved["one"]], None),
                "many": ([mpirun, "-np", "5"] + ps + ["--global-clipnorm", "0.05", "--timeout-ms", "20000", "--save", saved["many"]], env),
                "unclipped": (ps + ["--save", saved["unclipped"]], None),
                # the job's loss scale, each job's divisor and the servers' one decision per update
                "one16": (ps + mixed + ["--save", saved["one16"]], None),
                "many16": ([mpirun, "-np", "5"] + ps + mixed + ["--timeout-ms", "20000", "--save", saved["many16"]], env)}
        for name, (cmd, e) in runs.items():
            r = ce.run(cmd, e, timeout=300)
            ce.check(r.returncode == 0 and os.path.exists(saved[name]),
                     f"strata_train parameter_server ({name}): exit {r.returncode}, {r.stderr[-600:]!r}")
        # A rank started with another clip norm: every rank refuses at compile, naming the optimizer.
        r = ce.run([mpirun, "-np", "4"] + ps + ["--global-clipnorm", "0.05", "--timeout-ms", "20000", ":", "-np", "1"] + ps +
                   ["--timeout-ms", "20000"], env, timeout=300)
        ce.check(r.returncode != 0 and r.stderr.count("the ranks disagree on compile's settings: optimizer: ranks 0, 1, 2, 3 have") == 5,
                 f"parameter_server, --global-clipnorm on ranks 0-3 only: exit {r.returncode}, {r.stderr[-800:]!r}")
        if all(os.path.exists(f) for f in saved.values()):
            read = {name: open(f, "rb").read() for name, f in saved.items()}
            ce.check(read["one"] == read["many"], "parameter_server --global-clipnorm across 5 processes saved other bytes than in one")
            ce.check(read["one"] != read["unclipped"], "parameter_server --global-clipnorm 0.05 saved the unclipped job's bytes")
            ce.check(read["one16"] == read["many16"], "parameter_server --precision mixed_float16 across 5 processes saved other "
                                                      "bytes than in one")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--strata-train", required=True)
    p.add_argument("--mnist-cnn")
    p.add_argument("--mpirun")
    p.add_argument("--check-build", action="store_true", help="the build was set up with -Dcheck_build=true")
    a = p.parse_args()
    ce.CHECK_BUILD = a.check_build
    exe = os.path.abspath(a.strata_train)  # some runs change the working directory
    with tempfile.TemporaryDirectory() as data:
        ce.fake_mnist(data)
        check_help(exe, a.mnist_cnn)
        check_usage_errors(exe, os.path.join(data, "no-such-dir"))
        check_runs(exe, data)
        check_resnet(exe, data)
        check_vit(exe, data)
        check_precision(exe, a.mnist_cnn, data)
        if a.mnist_cnn:
            check_same_as_mnist_cnn(exe, a.mnist_cnn, data)
        if a.mpirun:
            check_mpirun(exe, a.mpirun, data)
    print(f"{len(ce.failures)} failure(s)" if ce.failures else "all checks passed")
    return 1 if ce.failures else 0


if __name__ == "__main__":
    sys.exit(main())
