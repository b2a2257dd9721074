"""What the PyTorch sides of the benchmarks share (benchmarks/pytorch_mnist.py,
benchmarks/pytorch_resnet.py, benchmarks/pytorch_vit.py): Keras's Glorot-uniform initialisation,
Keras's AdamW update and CosineDecay schedule, the IDX reader, the evaluation pass and the
machine's description. Import it after the thread-count environment is set (the scripts set it
before torch loads)."""
import math
import os
import platform
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


def load_idx(directory, split, fetch, prog):
    """(images NCHW float32 in [0, 1], labels int64) of `split` ("train" or "t10k") from the four
    MNIST-format IDX files in `directory`; a missing file names `fetch`, the script that gets them."""
    def read(path, magic, dims):
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            sys.exit(f"{prog}: cannot read {path}: {e.strerror}. Fetch the files with {fetch} "
                     f"{os.path.dirname(path) or '.'} or pass --data DIR.")
        header = 4 + 4 * dims
        found = struct.unpack(">I", raw[:4])[0]
        if found != magic:
            sys.exit(f"{prog}: {path}: expected IDX magic 0x{magic:08x}, found 0x{found:08x}")
        shape = struct.unpack(">" + "I" * dims, raw[4:header])
        return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)

    images = read(os.path.join(directory, f"{split}-images-idx3-ubyte"), 0x00000803, 3)
    labels = read(os.path.join(directory, f"{split}-labels-idx1-ubyte"), 0x00000801, 1)
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)  # NCHW
    return x, torch.from_numpy(labels.astype(np.int64))


class KerasAdamW:
    """keras.optimizers.AdamW: w -= w*wd*lr; m, v as Adam; w -= lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+eps)."""

    def __init__(self, params, weight_decay, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        self.params = [p for p in params]
        self.wd, self.b1, self.b2, self.eps = weight_decay, beta_1, beta_2, epsilon
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        alpha = lr * math.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            p.mul_(1 - self.wd * lr)
            m.add_(p.grad - m, alpha=1 - self.b1)
            v.add_(p.grad * p.grad - v, alpha=1 - self.b2)
            p.addcdiv_(m, v.sqrt().add_(self.eps), value=-alpha)


def cosine_lr(step, warmup_steps, decay_steps, target):
    """Keras' CosineDecay(initial 0, decay_steps, alpha 0, warmup_target, warmup_steps)."""
    if step < warmup_steps:
        return target * step / warmup_steps
    s = min(step - warmup_steps, decay_steps)
    return target * 0.5 * (1 + math.cos(math.pi * s / decay_steps))


def keras_glorot_uniform_(weight, generator):
    """Glorot-uniform with Keras' fans. torch layouts: conv [out, in, kh, kw], linear [out, in]."""
    if weight.dim() == 4:
        out_c, in_c, kh, kw = weight.shape
        fan_in, fan_out = kh * kw * in_c, kh * kw * out_c
    else:
        fan_out, fan_in = weight.shape
    limit = (6.0 / (fan_in + fan_out)) ** 0.5
    with torch.no_grad():
        weight.uniform_(-limit, limit, generator=generator)


def evaluate(model, x, y, batch):
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            logits = model(x[i:i + batch])
            loss_sum += F.cross_entropy(logits, y[i:i + batch], reduction="sum").item()
            correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return loss_sum / x.shape[0], correct / x.shape[0]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
