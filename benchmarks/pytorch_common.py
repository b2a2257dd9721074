"""What the PyTorch sides of the benchmarks share (benchmarks/pytorch_mnist.py,
benchmarks/pytorch_resnet.py): Keras's Glorot-uniform initialisation, the evaluation pass and
the machine's description. Import it after the thread-count environment is set (the scripts set
it before torch loads)."""
import platform

import torch
import torch.nn.functional as F


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
