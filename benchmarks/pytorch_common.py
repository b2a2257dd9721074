"""What the PyTorch sides of the benchmarks share (benchmarks/pytorch_mnist.py,
benchmarks/pytorch_resnet.py, benchmarks/pytorch_vit.py): Keras's Glorot-uniform initialisation,
Keras's AdamW update and CosineDecay schedule, the IDX reader, the evaluation pass and the
machine's description. Import it after the thread-count environment is set (the scripts set it
before torch loads)."""
import json
import math
import os
import platform
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_idx(directory, split, fetch, prog):
    """(images NCHW float32 in [0, 1], labels int64) of `split` ("train" or "t10k") from the four
    MNIST-format IDX files in `directory` (big-endian header: magic, then one uint32 per
    dimension); a missing file names `fetch`, the script that gets them, and a malformed one what
    is wrong with it, both as `prog`'s error."""
    def read(path, magic, dims):
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            sys.exit(f"{prog}: cannot read {path}: {e.strerror}. Fetch the files with {fetch} "
                     f"{os.path.dirname(path) or '.'} or pass --data DIR.")
        header = 4 + 4 * dims
        if len(raw) < header:
            sys.exit(f"{prog}: {path} is {len(raw)} bytes, shorter than an IDX header ({header} bytes)")
        found = struct.unpack(">I", raw[:4])[0]
        if found != magic:
            sys.exit(f"{prog}: {path}: expected IDX magic 0x{magic:08x}, found 0x{found:08x}")
        shape = struct.unpack(">" + "I" * dims, raw[4:header])
        count = int(np.prod(shape))
        if len(raw) - header != count:
            sys.exit(f"{prog}: {path}: header says {shape} = {count} bytes of data, file has {len(raw) - header}")
        return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)

    images = read(os.path.join(directory, f"{split}-images-idx3-ubyte"), 0x00000803, 3)
    labels = read(os.path.join(directory, f"{split}-labels-idx1-ubyte"), 0x00000801, 1)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        sys.exit(f"{prog}: {split}: {images.shape} images do not match {labels.shape} labels of 28x28")
    x = torch.from_numpy(images.astype(np.float32) / np.float32(255.0)).unsqueeze(1).contiguous()  # NCHW
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


def train_recipe(model, name, args, data, info, prepare=None):
    """strata_train's recipe for `model` (Keras' AdamW, CosineDecay after a linear warm-up, batch
    args.batch_size reshuffled every epoch), the table printed as it goes, the summary and the
    JSON (args.json) written at the end. `data`: (x_train, y_train, x_test, y_test); `info`: the
    run's description, completed here; `prepare(xb)`: the batch's augmentation, if any. Uses
    args.epochs, steps_per_epoch, learning_rate, weight_decay, warmup_epochs, seed, eval_batch_size."""
    x_train, y_train, x_test, y_test = data
    n = x_train.shape[0]
    steps_full = (n + args.batch_size - 1) // args.batch_size
    steps = min(steps_full, args.steps_per_epoch) if args.steps_per_epoch else steps_full
    warmup = int(round(args.warmup_epochs * steps))
    decay = max(steps * args.epochs - warmup, 1)
    opt = KerasAdamW(model.parameters(), args.weight_decay)
    shuffle_gen = torch.Generator().manual_seed(args.seed + 1)
    info.update(framework="pytorch", torch_version=torch.__version__, cpu=cpu_model(), cpu_count=os.cpu_count(),
                threads=torch.get_num_threads(), model=name, batch_size=args.batch_size, steps_per_epoch=steps,
                epochs=args.epochs, seed=args.seed, optimizer=f"AdamW (Keras' update), weight_decay={args.weight_decay}",
                schedule=f"CosineDecay(0 -> {args.learning_rate} over {warmup} steps, then to 0 over {decay})")
    print(f"PyTorch {info['torch_version']} {name} ({info['parameters']} variables) on {info['dataset']}, {info['cpu']}, "
          f"{info['threads']} threads")
    print(f"batch {args.batch_size}, {steps} steps/epoch, {info['optimizer']}, {info['schedule']}"
          + (f", {info['augmentation']}" if "augmentation" in info else ""))
    print(f"{'epoch':>5} {'train s':>8} {'train img/s':>12} {'train loss':>11} {'train acc':>10} {'test loss':>10} {'test acc':>9}")
    epochs, step, total_images, total_seconds = [], 0, 0, 0.0
    model.train()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n, generator=shuffle_gen)
        loss_sum, correct, seen = 0.0, 0, 0
        t0 = time.perf_counter()
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            xb, yb = x_train[idx], y_train[idx]
            if prepare:
                xb = prepare(xb)
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            model.zero_grad(set_to_none=True)
            loss.backward()
            opt.step(cosine_lr(step, warmup, decay, args.learning_rate))
            step += 1
            loss_sum += loss.item() * yb.shape[0]
            correct += (logits.detach().argmax(1) == yb).sum().item()
            seen += yb.shape[0]
        seconds = time.perf_counter() - t0
        test_loss, test_acc = evaluate(model, x_test, y_test, args.eval_batch_size)
        row = dict(epoch=epoch, train_seconds=seconds, train_images_per_second=seen / seconds, train_loss=loss_sum / seen,
                   train_accuracy=correct / seen, test_loss=test_loss, test_accuracy=test_acc)
        epochs.append(row)
        total_images += seen
        total_seconds += seconds
        print(f"{epoch:>5} {seconds:>8.1f} {row['train_images_per_second']:>12.1f} {row['train_loss']:>11.4f} "
              f"{row['train_accuracy']:>10.4f} {test_loss:>10.4f} {test_acc:>9.4f}", flush=True)
    info.update(test_accuracy=epochs[-1]["test_accuracy"], test_loss=epochs[-1]["test_loss"],
                train_images_per_second=total_images / total_seconds, train_seconds=total_seconds,
                step_ms=1000.0 * total_seconds / (steps * args.epochs), epochs_detail=epochs,
                load_average=" ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"train images/s {info['train_images_per_second']:.1f} ({info['step_ms']:.1f} ms a step); "
          f"test accuracy {info['test_accuracy']:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    return info
