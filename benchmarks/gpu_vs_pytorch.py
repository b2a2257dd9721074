#!/usr/bin/python3
"""The seed CNN's training step on one GPU: strata (benchmarks/gpu_cnn) against PyTorch (issue 18).

On a machine with an NVIDIA GPU, from the repository root (a build configured with -Dcuda=enabled):

    meson compile -C build benchmarks/gpu_cnn
    python3 benchmarks/gpu_vs_pytorch.py --json gpu-vs-pytorch.json        # add --tf32 for TF32

Anywhere (a smoke run of this script: PyTorch on the CPU, strata's GPU binary reports no GPU):

    python3 benchmarks/gpu_vs_pytorch.py --device cpu --steps 2 --warmup 1 --reps 1

Model: tools/mnist_cnn.hpp's Net (121 930 parameters, asserted): Conv2D(32, 3x3, ReLU) ->
MaxPool(2) -> Conv2D(64, 3x3, ReLU) -> MaxPool(2) -> Flatten (NHWC order, as strata) ->
Dense(64, ReLU) -> Dense(10), sparse categorical cross-entropy from the logits, RMSprop lr 1e-3
(alpha 0.9, eps 1e-7: torch's update, eps outside the root; benchmarks/pytorch_mnist.py explains
the difference from Keras', which costs the same). FP32; --tf32 lets cuBLAS and cuDNN use TF32.

Data: one fixed synthetic batch of MNIST-shaped images (uniform [0, 1)) and labels 0..9, created
on the device, so no step copies input. (strata's gpu_cnn stages a host batch every step, since
its Model API takes host batches: through pinned memory, queued before the step; its output says so.)

PyTorch modes, each timed as --reps samples of --steps steps after --warmup steps, median reported:
  eager      the usual loop: zero_grad, forward, loss, backward, optimizer step
  compile    the same with the model wrapped by torch.compile (default mode)
  cudagraph  the whole step (forward, backward, optimizer step with capturable=True) captured
             once as a CUDA graph (torch.cuda.graph) and replayed
A mode that cannot run here (torch.compile before PyTorch 2.0, CUDA graphs without a CUDA
device) is reported as unavailable, with the reason, and its figures are null: never estimated.
On CUDA each sample is timed with CUDA events around the steps (after a synchronize); on the CPU
with time.perf_counter.

The record per batch size (printed as a table, and with --json FILE a list under "records"):
  gpu, driver                 nvidia-smi's name and driver version (null on --device cpu)
  batch
  strata_images_per_second    strata's step captured as a CUDA graph (gpu_cnn --cuda-graphs on,
                              the default: place/cuda_graph.hpp)
  strata_eager_images_per_second  its kernels launched one by one (--cuda-graphs off)
  pytorch_{eager,compile,cudagraph}_images_per_second
  *_step_ms                   milliseconds per step
  *_fraction_of_fp32_peak     FLOPs per image x images/s / the GPU's FP32 peak (table below)
  flops_per_image             2 x multiply-adds of the convolutions and dense layers: forward,
                              weight gradient, and data gradient for all but the first layer
                              (as strata's benchmarks/step_profile.cpp and gpu_cnn count)
  unavailable                 {mode: reason} for the modes that did not run
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# FP32 (non-tensor) peak in TFLOP/s, by GPU name, from NVIDIA's datasheets: "NVIDIA H100 Tensor
# Core GPU" datasheet (FP32: H100 SXM 67, H100 PCIe 51, H100 NVL 60 teraFLOPS) and "NVIDIA H200
# Tensor Core GPU" datasheet (FP32: H200 SXM 67, H200 NVL 60 teraFLOPS). Matched in order, first
# hit wins, against nvidia-smi's name (e.g. "NVIDIA H100 80GB HBM3" is the SXM part).
FP32_PEAK_TFLOPS = [
    ("H100 PCIe", 51.0),
    ("H100 NVL", 60.0),
    ("H100", 67.0),
    ("H200 NVL", 60.0),
    ("H200", 67.0),
]

MODES = ("eager", "compile", "cudagraph")


def fp32_peak_tflops(gpu_name):
    if not gpu_name:
        return None
    for key, peak in FP32_PEAK_TFLOPS:
        if key in gpu_name:
            return peak
    return None


def layer_flops():
    """Training FLOPs per image of the seed CNN, from its layer shapes."""
    def conv(h, w, k, cin, cout):  # valid padding, stride 1
        return 2.0 * (h - k + 1) * (w - k + 1) * k * k * cin * cout

    def dense(n_in, n_out):
        return 2.0 * n_in * n_out

    forward = [conv(28, 28, 3, 1, 32), conv(13, 13, 3, 32, 64), dense(5 * 5 * 64, 64), dense(64, 10)]
    # forward + weight gradient for every layer, data gradient for all but the first
    return sum(2 * f for f in forward) + sum(forward[1:])


def nvidia_smi():
    """(name, driver) of the first GPU, or (None, None)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, None
    try:
        r = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if r.returncode != 0 or not r.stdout.strip():
        return None, None
    name, _, driver = r.stdout.strip().splitlines()[0].partition(",")
    return name.strip(), driver.strip() or None


def build_model(torch):
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3)
            self.conv2 = nn.Conv2d(32, 64, 3)
            self.fc1 = nn.Linear(5 * 5 * 64, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            f = torch.nn.functional
            x = f.max_pool2d(f.relu(self.conv1(x)), 2)
            x = f.max_pool2d(f.relu(self.conv2(x)), 2)
            x = x.permute(0, 2, 3, 1).flatten(1)  # NHWC order, as strata's Flatten
            return self.fc2(f.relu(self.fc1(x)))

    net = Net()
    n = sum(p.numel() for p in net.parameters())
    assert n == 121930, n
    return net


def make_optimizer(torch, params, capturable=False):
    kw = dict(lr=1e-3, alpha=0.9, eps=1e-7)
    if capturable:
        kw.update(foreach=True, capturable=True)  # raises TypeError where RMSprop cannot be captured
    return torch.optim.RMSprop(params, **kw)


class Timer:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sample(self, fn, steps):
        """Seconds per step of `steps` calls of fn."""
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - t0) / steps


def run_pytorch_mode(torch, mode, device, batch, a):
    """Seconds per step (median of --reps samples) of one PyTorch mode, or raises Unavailable."""
    torch.manual_seed(a.seed)
    x = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    net = build_model(torch).to(device)
    f = torch.nn.functional
    timer = Timer(torch, device)

    if mode == "eager" or mode == "compile":
        model = net
        if mode == "compile":
            if not hasattr(torch, "compile"):
                raise Unavailable(f"torch.compile does not exist in PyTorch {torch.__version__} (it came with 2.0)")
            model = torch.compile(net)
        opt = make_optimizer(torch, net.parameters())

        def step():
            opt.zero_grad(set_to_none=True)
            loss = f.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
    else:  # cudagraph
        if device.type != "cuda":
            raise Unavailable("CUDA graphs (torch.cuda.graph) need a CUDA device; this run is on " + device.type)
        try:
            opt = make_optimizer(torch, net.parameters(), capturable=True)
        except TypeError as e:
            raise Unavailable(f"RMSprop in PyTorch {torch.__version__} cannot be captured: {e}") from e
        # Warm up on a side stream (cuBLAS/cuDNN handles and the optimizer state), as the PyTorch
        # documentation's whole-network capture does, then capture one step.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                f.cross_entropy(net(x), y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = f.cross_entropy(net(x), y)
            static_loss.backward()
            opt.step()

        def step():
            graph.replay()
            return static_loss

    loss = None
    for _ in range(a.warmup):
        loss = step()
    samples = [timer.sample(step, a.steps) for _ in range(a.reps)]
    loss = step()
    if not torch.isfinite(loss.detach()).item():
        raise RuntimeError(f"PyTorch {mode}: the loss is not finite")
    return statistics.median(samples)


class Unavailable(Exception):
    pass


def run_strata(a, batch, graphs):
    """(seconds per step, None) from benchmarks/gpu_cnn (its step captured as a CUDA graph, or its
    kernels launched one by one: --cuda-graphs on|off), or (None, reason)."""
    if not os.path.exists(a.strata):
        return None, f"{a.strata} is not built (meson compile -C build benchmarks/gpu_cnn, in a -Dcuda=enabled build)"
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "strata.json")
        cmd = [a.strata, "--batch-size", str(batch), "--warmup", str(a.warmup), "--steps", str(a.steps),
               "--reps", str(a.reps), "--seed", str(a.seed), "--cuda-graphs", "on" if graphs else "off", "--json", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 77:
            return None, r.stdout.strip() or "gpu_cnn: no usable GPU"
        if r.returncode != 0:  # reported as unavailable, with gpu_cnn's reason; the other rows still run
            lines = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()
            return None, f"{' '.join(cmd[:1])} exited {r.returncode}: {lines[-1]}"
        with open(out) as fh:
            doc = json.load(fh)
    expected = layer_flops()
    if abs(doc["flops_per_image"] - expected) > 1e-6 * expected:
        raise RuntimeError(f"gpu_cnn counts {doc['flops_per_image']} FLOPs per image, this script {expected}")
    return doc["rows"][0]["step_seconds"], None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where PyTorch runs (cpu: a smoke run)")
    p.add_argument("--batch-size", type=int, action="append", help="batch sizes (repeat; default 128 and 1024)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before timing each mode")
    p.add_argument("--steps", type=int, default=100, help="steps per timed sample")
    p.add_argument("--reps", type=int, default=3, help="timed samples per figure; the median is reported")
    p.add_argument("--tf32", action="store_true", help="let cuBLAS and cuDNN use TF32 (default: FP32 throughout)")
    p.add_argument("--modes", default=",".join(MODES), help="PyTorch modes, comma-separated: " + ", ".join(MODES))
    p.add_argument("--strata", default="build/benchmarks/gpu_cnn", help="strata's gpu_cnn binary")
    p.add_argument("--threads", type=int, default=0, help="PyTorch CPU threads (0: its default)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", default="", help="also write the records to FILE")
    a = p.parse_args()
    batches = a.batch_size or [128, 1024]
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r} (choose from {', '.join(MODES)})")
    if min(batches) < 1 or a.steps < 1 or a.reps < 1 or a.warmup < 0:
        p.error("--batch-size, --steps and --reps must be >= 1, --warmup >= 0")

    try:
        import torch
    except ImportError:
        sys.exit("gpu_vs_pytorch: PyTorch is not installed for " + sys.executable + " (Debian: python3-torch)")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_vs_pytorch: --device cuda, but PyTorch sees no CUDA device; nothing measured "
              "(--device cpu runs the script end to end on the CPU)")
        return 77
    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        torch.backends.cudnn.benchmark = True

    gpu, driver = nvidia_smi() if device.type == "cuda" else (None, None)
    peak = fp32_peak_tflops(gpu)
    flops = layer_flops()
    print(f"gpu_vs_pytorch: the seed CNN's training step; PyTorch {torch.__version__} on {a.device}"
          f"{' (' + gpu + ', driver ' + str(driver) + ')' if gpu else ''}; {'TF32 allowed' if a.tf32 else 'FP32'}")
    print(f"{flops:.0f} FLOPs per image per step; FP32 peak: "
          f"{str(peak) + ' TFLOP/s' if peak else 'unknown for this device (fractions are null)'}")
    print(f"{a.warmup} warm-up steps, median of {a.reps} samples of {a.steps} steps\n")

    records = []
    for batch in batches:
        rec = {"gpu": gpu, "driver": driver, "device": a.device, "batch": batch, "tf32": a.tf32,
               "torch": torch.__version__, "flops_per_image": flops, "fp32_peak_tflops": peak, "unavailable": {}}

        def put(prefix, seconds):
            ips = batch / seconds if seconds else None
            rec[f"{prefix}_images_per_second"] = ips
            rec[f"{prefix}_step_ms"] = seconds * 1e3 if seconds else None
            rec[f"{prefix}_fraction_of_fp32_peak"] = flops * ips / (peak * 1e12) if ips and peak else None

        for prefix, graphs in (("strata", True), ("strata_eager", False)):
            seconds, why = run_strata(a, batch, graphs)
            put(prefix, seconds)
            if why:
                rec["unavailable"][prefix] = why
        for m in MODES:
            if m not in modes:
                put(f"pytorch_{m}", None)
                rec["unavailable"][m] = "not requested (--modes)"
                continue
            try:
                put(f"pytorch_{m}", run_pytorch_mode(torch, m, device, batch, a))
            except Unavailable as e:
                put(f"pytorch_{m}", None)
                rec["unavailable"][m] = str(e)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        records.append(rec)

        print(f"batch {batch}")
        print(f"  {'system':<24} {'ms/step':>10} {'images/s':>12} {'of FP32 peak':>13}")
        for prefix, label in [("strata", "strata (CUDA graph)"), ("strata_eager", "strata (no graph)")] + \
                [(f"pytorch_{m}", f"pytorch {m}") for m in MODES]:
            ips = rec[f"{prefix}_images_per_second"]
            if ips is None:
                key = prefix if prefix.startswith("strata") else prefix[len("pytorch_"):]
                print(f"  {label:<24} unavailable: {rec['unavailable'].get(key, '')}")
            else:
                frac = rec[f"{prefix}_fraction_of_fp32_peak"]
                print(f"  {label:<24} {rec[prefix + '_step_ms']:>10.3f} {ips:>12.0f} "
                      f"{(f'{100 * frac:.2f}%' if frac is not None else 'n/a'):>13}")
        sys.stdout.flush()

    if a.json:
        doc = {"benchmark": "gpu_vs_pytorch", "python": platform.python_version(), "records": records}
        tmp = a.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=2, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, a.json)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
