#!/usr/bin/python3
"""PyTorch side of the ResNet comparison: strata_train's `resnet`, the same recipe, in PyTorch.

Run with the system Python that has PyTorch (Debian's python3-torch), from the repository root:

    /usr/bin/python3 benchmarks/pytorch_resnet.py --dataset fashion_mnist --epochs 15 --threads 2 --json resnet-pytorch.json
    /usr/bin/python3 benchmarks/pytorch_resnet.py --dataset fashion_mnist --evaluate-strata resnet.safetensors

The model (78 042 variables, of which 480 moving statistics are not trained; asserted) is strata_train's `resnet`
(tools/strata_train_models.hpp, docs/second_model.md), layer for layer:

    Input(28, 28, 1), pixels / 255
    stem:    Conv2D(16, 3x3, same, no bias) -> BatchNormalization -> ReLU                 28x28x16
    stage 1: Residual[Conv 16 -> BN -> ReLU -> Conv 16 -> BN] + x -> ReLU                28x28x16
    stage 2: Residual[Conv 32 /2 -> BN -> ReLU -> Conv 32 -> BN] + Conv1x1 32 /2 (x) -> ReLU   14x14x32
    stage 3: Residual[Conv 64 /2 -> BN -> ReLU -> Conv 64 -> BN] + Conv1x1 64 /2 (x) -> ReLU     7x7x64
    GlobalAveragePooling2D -> Dense(10, softmax)

Keras' "same" padding for a stride-2 3x3 convolution of an even image pads one row and column
after the image and none before (pad_total = 1: floor(1/2) before); PyTorch's padding=1 would pad
before too and shift every window, so the stride-2 convolutions here pad explicitly (0, 1, 0, 1).
Batch normalization as strata_train's resnet has it: momentum 0.9 (PyTorch's momentum=0.1), epsilon 1e-3;
PyTorch keeps the unbiased variance as its running variance where Keras (and strata) keep the
biased one, which changes only the moving statistics, by a factor n/(n-1) with n = batch x H x W
(>= 6272 here).

Recipe (strata_train's defaults for resnet): AdamW with Keras' update (decoupled decay
w -= w*wd*lr before Adam's step, epsilon outside the root after bias correction folded into the
rate), learning rate by Keras' CosineDecay with linear warm-up, batch 128, reshuffled every epoch;
augmentation: zero padding by --pad pixels and a random crop back to 28x28, and (Fashion-MNIST)
a random horizontal flip.

--evaluate-strata FILE loads a strata checkpoint (safetensors, as `strata_train --save` writes
it: Keras' names and layouts, moving statistics included) into this model and prints its test
accuracy: PyTorch reproducing strata's figure is the check that the two compute the same model.

Timing: "train images/s" counts the training steps (augmentation, forward, backward, update),
never the evaluation after each epoch.
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_args import checked, threads_before_torch  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=["mnist", "fashion_mnist"], default="fashion_mnist")
    p.add_argument("--data", default="", help="directory with the four IDX files (default: data/<dataset>)")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps-per-epoch", type=int, default=0, help="stop each epoch after N steps (0: the whole set)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=4e-3, help="the warm-up's target, the cosine's start")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--pad", type=int, default=1, help="augmentation: zero padding before the random crop (0: none)")
    p.add_argument("--flip", choices=["auto", "on", "off"], default="auto", help="auto: on for fashion_mnist only")
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--evaluate-strata", default="", help="a strata checkpoint to load and evaluate (no training)")
    p.add_argument("--json", default="", help="write the results to this JSON file")
    a = p.parse_args()
    if not a.data:
        a.data = os.path.join("data", a.dataset)
    if a.pad < 0 or a.pad >= 28:
        p.error("--pad must be in [0, 27]")
    return checked(p, a)


ARGS = parse_args()
THREADS = threads_before_torch(ARGS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as tnn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pytorch_common import evaluate, keras_glorot_uniform_, load_idx, train_recipe  # noqa: E402

EXPECTED_PARAMETERS = 78_042      # strata's count: trainable and moving statistics
EXPECTED_NON_TRAINABLE = 480


def load(split):
    fetch = "scripts/fetch-fashion-mnist" if ARGS.dataset == "fashion_mnist" else "scripts/fetch-mnist"
    return load_idx(ARGS.data, split, fetch, "pytorch_resnet")


def bn(c):
    return tnn.BatchNorm2d(c, eps=1e-3, momentum=0.1)


class SameConv(tnn.Module):
    """Keras' Conv2D(filters, 3, strides, padding="same", use_bias=False)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        self.conv = tnn.Conv2d(cin, cout, 3, stride=stride, padding=1 if stride == 1 else 0, bias=False)

    def forward(self, x):
        if self.stride == 2:
            x = F.pad(x, (0, 1, 0, 1))  # Keras' same padding: none before, one after
        return self.conv(x)


class Block(tnn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = SameConv(cin, cout, stride), bn(cout)
        self.conv2, self.bn2 = SameConv(cout, cout, 1), bn(cout)
        self.projection = tnn.Conv2d(cin, cout, 1, stride=stride, bias=False) if stride != 1 or cin != cout else None

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.projection(x) if self.projection is not None else x))


class ResNet(tnn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.stem_bn = SameConv(1, 16, 1), bn(16)
        self.stage1, self.stage2, self.stage3 = Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2)
        self.dense = tnn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        x = self.stage3(self.stage2(self.stage1(x)))
        return self.dense(x.mean(dim=(2, 3)))  # logits; softmax lives in the loss

    # strata's variable names (Keras' within each block), in strata's flat order, and the
    # torch tensor each one is.
    def strata_names(self):
        out = [("conv2d/kernel", self.stem.conv.weight)] + bn_names("batch_normalization", self.stem_bn)
        for i, blk in enumerate((self.stage1, self.stage2, self.stage3)):
            pre = "residual" + ("" if i == 0 else f"_{i}")
            if blk.projection is not None:
                out.append((f"{pre}/projection/kernel", blk.projection.weight))
            out.append((f"{pre}/conv2d/kernel", blk.conv1.conv.weight))
            out += bn_names(f"{pre}/batch_normalization", blk.bn1)
            out.append((f"{pre}/conv2d_1/kernel", blk.conv2.conv.weight))
            out += bn_names(f"{pre}/batch_normalization_1", blk.bn2)
        out += [("dense/kernel", self.dense.weight), ("dense/bias", self.dense.bias)]
        return out


def bn_names(prefix, m):
    return [(f"{prefix}/gamma", m.weight), (f"{prefix}/beta", m.bias), (f"{prefix}/moving_mean", m.running_mean),
            (f"{prefix}/moving_variance", m.running_var)]


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (8-byte header length, JSON header, data)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
    except (OSError, struct.error, ValueError) as e:
        sys.exit(f"pytorch_resnet: {path} is not a safetensors file strata wrote: {e}")
    base = 8 + n
    dtypes = {"F32": np.float32, "F64": np.float64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[base + a:base + b], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return out


def load_strata(model, path):
    """Copies a strata checkpoint into the model: Keras' layouts (conv [kh, kw, in, out], dense
    [in, out]) to torch's ([out, in, kh, kw], [out, in])."""
    tensors = read_safetensors(path)
    with torch.no_grad():
        for name, t in model.strata_names():
            if name not in tensors:
                sys.exit(f"pytorch_resnet: {path} has no tensor {name}")
            a = torch.from_numpy(tensors[name].astype(np.float32))
            if a.dim() == 4:
                a = a.permute(3, 2, 0, 1)
            elif a.dim() == 2:
                a = a.t()
            if tuple(a.shape) != tuple(t.shape):
                sys.exit(f"pytorch_resnet: {name} is {tuple(a.shape)} after the layout change, the model's is {tuple(t.shape)}")
            t.copy_(a)


def augment(x, gen, flip):
    """Zero padding by ARGS.pad, a random 28x28 crop, and a random horizontal flip, per example."""
    n = x.shape[0]
    out = torch.empty_like(x)
    p = ARGS.pad
    padded = F.pad(x, (p, p, p, p)) if p else x
    dy = torch.randint(0, 2 * p + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * p + 1, (n,), generator=gen)
    flips = torch.rand(n, generator=gen) < 0.5 if flip else torch.zeros(n, dtype=torch.bool)
    for i in range(n):
        c = padded[i, :, dy[i]:dy[i] + 28, dx[i]:dx[i] + 28]
        out[i] = c.flip(2) if flips[i] else c
    return out


def main():
    torch.set_num_threads(THREADS)
    torch.manual_seed(ARGS.seed)
    x_train, y_train = load("train")
    x_test, y_test = load("t10k")
    model = ResNet()
    gen = torch.Generator().manual_seed(ARGS.seed)
    for m in model.modules():
        if isinstance(m, (tnn.Conv2d, tnn.Linear)):
            keras_glorot_uniform_(m.weight, gen)
            if m.bias is not None:
                tnn.init.zeros_(m.bias)
    trainable = sum(p.numel() for p in model.parameters())
    non_trainable = sum(b.numel() for n, b in model.named_buffers() if "running" in n)
    assert trainable + non_trainable == EXPECTED_PARAMETERS, f"{trainable} + {non_trainable} variables, expected {EXPECTED_PARAMETERS}"
    assert non_trainable == EXPECTED_NON_TRAINABLE

    if ARGS.evaluate_strata:
        load_strata(model, ARGS.evaluate_strata)
        loss, acc = evaluate(model, x_test, y_test, ARGS.eval_batch_size)
        info = dict(framework="pytorch", checkpoint=ARGS.evaluate_strata, dataset=ARGS.dataset, test_loss=loss, test_accuracy=acc)
        print(f"PyTorch {torch.__version__} with strata's weights from {ARGS.evaluate_strata}: "
              f"test accuracy {acc:.4f}, test loss {loss:.4f}")
        if ARGS.json:
            with open(ARGS.json, "w") as f:
                json.dump(info, f, indent=2)
                f.write("\n")
        return

    flip = ARGS.flip == "on" or (ARGS.flip == "auto" and ARGS.dataset == "fashion_mnist")
    aug_gen = torch.Generator().manual_seed(ARGS.seed + 2)
    info = dict(dataset=ARGS.dataset, parameters=EXPECTED_PARAMETERS, non_trainable_parameters=non_trainable,
                augmentation=f"pad {ARGS.pad} + random crop" + (", horizontal flip" if flip else ""))
    train_recipe(model, "resnet", ARGS, (x_train, y_train, x_test, y_test), info,
                 prepare=(lambda xb: augment(xb, aug_gen, flip)) if ARGS.pad or flip else None)

if __name__ == "__main__":
    main()
