#!/usr/bin/python3
"""PyTorch side of the ViT comparison: strata_train's `vit`, the same network and recipe, in PyTorch.

Run with the system Python that has PyTorch (Debian's python3-torch), from the repository root:

    /usr/bin/python3 benchmarks/pytorch_vit.py --dataset fashion_mnist --epochs 10 --threads 1 --json vit-pytorch.json

and beside it the strata side, `build/tools/strata_train --model vit --dataset fashion_mnist --threads 1 --json F`.

The model (138 890 variables; asserted) is strata_train's `vit` (tools/strata_train_models.hpp),
layer for layer:

    Input(28, 28, 1), pixels / 255
    PatchEmbedding: Conv2D(64, 4x4, stride 4) -> 49 tokens x 64
    PositionEmbedding: + a learned [49, 64]
    4 x [ x + MultiHeadAttention(LayerNorm(x))        4 heads, key_dim = value_dim = 16, biases
          x + Dense(64)(GELU(Dense(128)(LayerNorm(x)))) ]   per token; GELU the exact (erf) form
    LayerNormalization -> mean over the tokens -> Dense(10, softmax)

LayerNormalization with Keras' epsilon 1e-3. Initialisation as Keras (and strata) start these
layers: Glorot-uniform kernels with Keras' fans (for the attention's rank-3 kernels Keras
multiplies both fans by the leading axis: [F, H, D] has fan_in H*F and fan_out D*F; the output
kernel [H, D, F] fan_in D*H and fan_out F*H), zero biases, LayerNorm gamma 1 and beta 0, and the
position table Glorot-uniform over [49, 64].

Recipe (strata_train's defaults for vit): AdamW with Keras' update, weight decay 0.05, the learning
rate by Keras' CosineDecay with a linear warm-up of one epoch to 1e-3, batch 128 reshuffled every
epoch, no augmentation.

Timing: "train images/s" counts the training steps (forward, backward, update), never the
evaluation after each epoch.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_args import checked, threads_before_torch  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=["mnist", "fashion_mnist"], default="fashion_mnist")
    p.add_argument("--data", default="", help="directory with the four IDX files (default: data/<dataset>)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps-per-epoch", type=int, default=0, help="stop each epoch after N steps (0: the whole set)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=1e-3, help="the warm-up's target, the cosine's start")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--json", default="", help="write the results to this JSON file")
    a = p.parse_args()
    if not a.data:
        a.data = os.path.join("data", a.dataset)
    return checked(p, a)


ARGS = parse_args()
THREADS = threads_before_torch(ARGS)

import torch  # noqa: E402
import torch.nn as tnn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pytorch_common import keras_glorot_uniform_, load_idx, train_recipe  # noqa: E402

EXPECTED_PARAMETERS = 138_890  # strata's count
TOKENS, WIDTH, HEADS, KEY_DIM, MLP, DEPTH, PATCH = 49, 64, 4, 16, 128, 4, 4


def uniform_(t, fan_in, fan_out, gen):
    limit = (6.0 / (fan_in + fan_out)) ** 0.5
    with torch.no_grad():
        t.uniform_(-limit, limit, generator=gen)


class Attention(tnn.Module):
    """Keras' MultiHeadAttention(4, 16) called as mha(x, x): the projections with biases, the
    scaled dot product per head, the heads merged and projected back to the width."""

    def __init__(self, gen):
        super().__init__()
        self.q, self.k, self.v = (tnn.Linear(WIDTH, HEADS * KEY_DIM) for _ in range(3))
        self.o = tnn.Linear(HEADS * KEY_DIM, WIDTH)
        for lin in (self.q, self.k, self.v):  # Keras' [F, H, D] kernel: fans H*F and D*F
            uniform_(lin.weight, HEADS * WIDTH, KEY_DIM * WIDTH, gen)
        uniform_(self.o.weight, KEY_DIM * HEADS, WIDTH * HEADS, gen)  # [H, D, F]: fans D*H and F*H
        for lin in (self.q, self.k, self.v, self.o):
            tnn.init.zeros_(lin.bias)

    def forward(self, x):
        n, s, _ = x.shape
        split = lambda t: t.view(n, s, HEADS, KEY_DIM).transpose(1, 2)  # noqa: E731  [n, H, S, D]
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / KEY_DIM ** 0.5, dim=-1)
        return self.o((a @ v).transpose(1, 2).reshape(n, s, HEADS * KEY_DIM))


class Block(tnn.Module):
    def __init__(self, gen):
        super().__init__()
        self.norm1, self.norm2 = tnn.LayerNorm(WIDTH, eps=1e-3), tnn.LayerNorm(WIDTH, eps=1e-3)
        self.attention = Attention(gen)
        self.up, self.down = tnn.Linear(WIDTH, MLP), tnn.Linear(MLP, WIDTH)
        for lin in (self.up, self.down):
            keras_glorot_uniform_(lin.weight, gen)
            tnn.init.zeros_(lin.bias)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class ViT(tnn.Module):
    def __init__(self, gen):
        super().__init__()
        self.patches = tnn.Conv2d(1, WIDTH, PATCH, stride=PATCH)
        keras_glorot_uniform_(self.patches.weight, gen)
        tnn.init.zeros_(self.patches.bias)
        self.position = tnn.Parameter(torch.empty(TOKENS, WIDTH))
        uniform_(self.position, TOKENS, WIDTH, gen)
        self.blocks = tnn.ModuleList(Block(gen) for _ in range(DEPTH))
        self.norm = tnn.LayerNorm(WIDTH, eps=1e-3)
        self.head = tnn.Linear(WIDTH, 10)
        keras_glorot_uniform_(self.head.weight, gen)
        tnn.init.zeros_(self.head.bias)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2) + self.position  # [n, 49, 64], row-major patches
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(dim=1))


def main():
    torch.set_num_threads(THREADS)
    torch.manual_seed(ARGS.seed)
    fetch = "scripts/fetch-fashion-mnist" if ARGS.dataset == "fashion_mnist" else "scripts/fetch-mnist"
    x_train, y_train = load_idx(ARGS.data, "train", fetch, "pytorch_vit")
    x_test, y_test = load_idx(ARGS.data, "t10k", fetch, "pytorch_vit")
    gen = torch.Generator().manual_seed(ARGS.seed)
    model = ViT(gen)
    count = sum(p.numel() for p in model.parameters())
    assert count == EXPECTED_PARAMETERS, f"{count} variables, expected {EXPECTED_PARAMETERS}"

    train_recipe(model, "vit", ARGS, (x_train, y_train, x_test, y_test), dict(dataset=ARGS.dataset, parameters=count))

if __name__ == "__main__":
    main()
