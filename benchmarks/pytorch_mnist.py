#!/usr/bin/python3
"""PyTorch side of the MNIST CNN comparison: the model strata trains, trained the Keras way.

Run with the system Python that has PyTorch (Debian's python3-torch), from the repository root:

    /usr/bin/python3 benchmarks/pytorch_mnist.py --threads 2 --epochs 1 --json mnist-pytorch.json

Model (121 930 parameters, asserted), identical to strata's seed model and to this Keras model:

    Input(28, 28, 1), pixels / 255
    Conv2D(32, 3x3, valid, ReLU) -> MaxPooling2D(2) -> Conv2D(64, 3x3, valid, ReLU)
    -> MaxPooling2D(2) -> Flatten (NHWC order) -> Dense(64, ReLU) -> Dense(10, softmax)
    loss: sparse categorical cross-entropy, mean over the batch

PyTorch computes in NCHW; the activations are permuted to channels-last before Flatten so that
the Dense(64) kernel's row i means the same feature as Keras' row i (and strata's, which is NHWC).

Initialisation, as Keras does it: Glorot-uniform kernels, limit = sqrt(6 / (fan_in + fan_out)),
with fan_in = kh*kw*in_channels and fan_out = kh*kw*out_channels for a convolution (Keras'
receptive-field rule) and fan_in = inputs, fan_out = units for Dense; zero biases. The values come
from torch's generator (seeded), not from TensorFlow's, so they are the same distribution as
Keras', not the same numbers.

Optimizer (default --optimizer keras): RMSprop with exactly Keras' update (keras.optimizers.RMSprop,
Keras 2.11+ and Keras 3; also TF's legacy ApplyRMSProp kernel), lr 1e-3, rho 0.9, epsilon 1e-7,
no momentum, not centred, velocity starting at zero:

    v <- rho * v + (1 - rho) * g^2
    w <- w - lr * g / sqrt(v + epsilon)          # epsilon INSIDE the square root

torch.optim.RMSprop (--optimizer torch, with alpha=0.9, eps=1e-7) differs in one place only:

    w <- w - lr * g / (sqrt(v) + eps)            # eps OUTSIDE the square root

Both start v at zero and have the same rho/alpha recursion. The two agree when v >> epsilon; for
small gradients they do not: Keras' epsilon 1e-7 under the root bounds the step by
lr * |g| / sqrt(1e-7) = lr * |g| * 3162, whereas torch's eps 1e-7 outside barely bounds it. No
choice of torch's eps reproduces Keras exactly (eps ~ 3.2e-4 outside is the closest in magnitude).
That is why the default here implements Keras' rule itself (a dozen lines, below).

Other differences from Keras' model.fit that remain (and why they do not matter for the figures):
  - Loss: computed from the logits with log-softmax (torch.nn.functional.cross_entropy). Keras,
    given softmax outputs, uses the logits too when it can see them (TF backend), and otherwise
    clips probabilities to [1e-7, 1 - 1e-7]; only a confidently wrong example (p < 1e-7) differs.
  - Shuffling uses torch's generator, so the batch order is not Keras'; like Keras (shuffle=True),
    the whole training set is reshuffled every epoch and the last batch is partial (60000 = 468 *
    128 + 96, so 469 steps per epoch).
  - Per-epoch training loss/accuracy are accumulated over the epoch's batches while the weights
    change (as Keras' progress bar reports them), weighted by batch size.
  - Float rounding: oneDNN (convolutions) and OpenBLAS (Dense layers) sum in their own orders.

Timing: "train images/s" counts only training steps (batch gather + forward + backward + update),
never the evaluation on the test set after each epoch.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_args import checked, threads_before_torch  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/mnist", help="directory with the four MNIST IDX files (default: data/mnist)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps-per-epoch", type=int, default=0,
                   help="stop each epoch after N steps (0: the whole training set)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--optimizer", choices=["keras", "torch"], default="keras",
                   help="keras: Keras' RMSprop rule (epsilon inside the sqrt); torch: torch.optim.RMSprop(alpha=0.9, eps=1e-7)")
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--json", default="", help="write the results to this JSON file")
    p.add_argument("--inference-only", action="store_true",
                   help="no training: time inference over the test set (batch --eval-batch-size), eager and as a "
                        "frozen TorchScript trace (torch.jit.freeze(torch.jit.trace(...))), --inference-reps times each")
    p.add_argument("--inference-reps", type=int, default=5)
    a = p.parse_args()
    return checked(p, a)


ARGS = parse_args()
THREADS = threads_before_torch(ARGS)

import ctypes  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pytorch_common import cpu_model, evaluate, keras_glorot_uniform_, load_idx  # noqa: E402

EXPECTED_PARAMETERS = 121_930


def load(data_dir, prefix):
    return load_idx(data_dir, prefix, "scripts/fetch-mnist", "pytorch_mnist")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.dense1 = torch.nn.Linear(5 * 5 * 64, 64)
        self.dense2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)  # NHWC order, as Keras' Flatten sees it
        return self.dense2(F.relu(self.dense1(x)))  # logits; softmax lives in the loss


class KerasRMSprop(torch.optim.Optimizer):
    """keras.optimizers.RMSprop without momentum, not centred: epsilon inside the square root."""

    def __init__(self, params, lr=1e-3, rho=0.9, epsilon=1e-7):
        super().__init__(params, dict(lr=lr, rho=rho, epsilon=epsilon))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, rho, eps = group["lr"], group["rho"], group["epsilon"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                state = self.state[w]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(w)
                v = state["velocity"]
                v.mul_(rho).addcmul_(w.grad, w.grad, value=1 - rho)
                w.addcdiv_(w.grad, v.add(eps).sqrt_(), value=-lr)


def openblas_core():
    """The kernel set OpenBLAS chose (shared with torch's Linear layers); None if not OpenBLAS."""
    for name in ("libopenblas.so.0", "libopenblasp.so.0", "libblas.so.3"):
        try:
            lib = ctypes.CDLL(name)
            fn = lib.openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def conv_backend(model, x):
    """Which convolution backend torch picks for conv1 on a training batch (e.g. 'Mkldnn')."""
    try:
        c = model.conv1
        return str(torch._C._select_conv_backend(x, c.weight, c.bias, list(c.stride), list(c.padding),
                                                 list(c.dilation), False, [0, 0], 1)).split(".")[-1]
    except Exception:  # a private API: absent in other versions
        return "unknown"


def inference_only(model, x_test, y_test):
    """Images/s of inference over the test set, eager and frozen TorchScript; median of reps."""
    batch = ARGS.eval_batch_size
    model.eval()

    def timed(fn):
        times = []
        with torch.no_grad():
            fn(x_test[:batch])  # warm-up (and the trace's first run)
            for _ in range(ARGS.inference_reps):
                t0 = time.perf_counter()
                for i in range(0, x_test.shape[0], batch):
                    fn(x_test[i:i + batch])
                times.append(time.perf_counter() - t0)
        times.sort()
        return x_test.shape[0] / times[len(times) // 2]

    with torch.no_grad():
        frozen = torch.jit.freeze(torch.jit.trace(model, x_test[:batch]))
        same = torch.allclose(frozen(x_test[:batch]), model(x_test[:batch]), rtol=1e-4, atol=1e-5)
    eager = timed(model)
    script = timed(frozen)
    info = dict(framework="pytorch", torch_version=torch.__version__, cpu=cpu_model(), threads=torch.get_num_threads(),
                eval_batch_size=batch, images=int(x_test.shape[0]), reps=ARGS.inference_reps,
                eager_images_per_second=eager, torchscript_images_per_second=script, torchscript_matches_eager=bool(same),
                load_average=" ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"PyTorch {info['torch_version']} inference, {info['threads']} threads, batch {batch}: "
          f"eager {eager:.0f} images/s, frozen TorchScript {script:.0f} images/s (outputs match: {same})")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(info, f, indent=2)
            f.write("\n")


def main():
    torch.set_num_threads(THREADS)
    torch.manual_seed(ARGS.seed)
    torch.use_deterministic_algorithms(True)

    x_train, y_train = load(ARGS.data, "train")
    x_test, y_test = load(ARGS.data, "t10k")

    model = Net()
    init_gen = torch.Generator().manual_seed(ARGS.seed)
    for layer in (model.conv1, model.conv2, model.dense1, model.dense2):
        keras_glorot_uniform_(layer.weight, init_gen)
        torch.nn.init.zeros_(layer.bias)
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters == EXPECTED_PARAMETERS, f"model has {parameters} parameters, expected {EXPECTED_PARAMETERS}"

    if ARGS.inference_only:
        inference_only(model, x_test, y_test)
        return

    if ARGS.optimizer == "keras":
        opt = KerasRMSprop(model.parameters(), lr=1e-3, rho=0.9, epsilon=1e-7)
    else:
        opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9, eps=1e-7, momentum=0.0, centered=False)

    n = x_train.shape[0]
    steps_full = (n + ARGS.batch_size - 1) // ARGS.batch_size
    steps = min(steps_full, ARGS.steps_per_epoch) if ARGS.steps_per_epoch else steps_full
    shuffle_gen = torch.Generator().manual_seed(ARGS.seed + 1)
    info = dict(
        framework="pytorch",
        torch_version=torch.__version__,
        mkldnn_available=bool(torch.backends.mkldnn.is_available()),
        mkldnn_enabled=bool(torch.backends.mkldnn.enabled),
        conv_backend=conv_backend(model, x_train[:ARGS.batch_size]),
        mkl_available=bool(torch.backends.mkl.is_available()),
        openblas_core=openblas_core(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        threads=torch.get_num_threads(),
        optimizer=("Keras RMSprop (w -= lr*g/sqrt(v+eps)), lr=1e-3, rho=0.9, epsilon=1e-7" if ARGS.optimizer == "keras"
                   else "torch.optim.RMSprop (w -= lr*g/(sqrt(v)+eps)), lr=1e-3, alpha=0.9, eps=1e-7"),
        parameters=parameters,
        batch_size=ARGS.batch_size,
        steps_per_epoch=steps,
        seed=ARGS.seed,
        epochs=ARGS.epochs,
    )
    print(f"PyTorch {info['torch_version']} MNIST CNN ({parameters} parameters), {info['cpu']}")
    print(f"threads {info['threads']}, batch {ARGS.batch_size}, {steps} steps/epoch, seed {ARGS.seed}, "
          f"conv backend {info['conv_backend']} (mkldnn available: {info['mkldnn_available']}), "
          f"OpenBLAS core {info['openblas_core']}")
    print(f"optimizer: {info['optimizer']}")
    header = f"{'epoch':>5} {'train s':>8} {'train img/s':>12} {'train loss':>11} {'train acc':>10} {'test loss':>10} {'test acc':>9}"
    print(header)

    epochs = []
    total_images, total_seconds = 0, 0.0
    wall0 = time.perf_counter()
    model.train()
    for epoch in range(1, ARGS.epochs + 1):
        order = torch.randperm(n, generator=shuffle_gen)
        loss_sum, correct, seen = 0.0, 0, 0
        t0 = time.perf_counter()
        for s in range(steps):
            idx = order[s * ARGS.batch_size:(s + 1) * ARGS.batch_size]
            xb, yb = x_train[idx], y_train[idx]
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            b = yb.shape[0]
            loss_sum += loss.item() * b
            correct += (logits.detach().argmax(1) == yb).sum().item()
            seen += b
        seconds = time.perf_counter() - t0
        test_loss, test_acc = evaluate(model, x_test, y_test, ARGS.eval_batch_size)
        row = dict(epoch=epoch, train_seconds=seconds, train_images=seen, train_images_per_second=seen / seconds,
                   train_loss=loss_sum / seen, train_accuracy=correct / seen, test_loss=test_loss, test_accuracy=test_acc)
        epochs.append(row)
        total_images += seen
        total_seconds += seconds
        print(f"{epoch:>5} {seconds:>8.1f} {row['train_images_per_second']:>12.1f} {row['train_loss']:>11.4f} "
              f"{row['train_accuracy']:>10.4f} {test_loss:>10.4f} {test_acc:>9.4f}", flush=True)

    info.update(
        test_accuracy=epochs[-1]["test_accuracy"],
        test_loss=epochs[-1]["test_loss"],
        train_images_per_second=total_images / total_seconds,
        train_seconds=total_seconds,
        seconds=time.perf_counter() - wall0,
        epoch_train_seconds=[e["train_seconds"] for e in epochs],
        epoch_train_images_per_second=[e["train_images_per_second"] for e in epochs],
        epoch_train_loss=[e["train_loss"] for e in epochs],
        epoch_train_accuracy=[e["train_accuracy"] for e in epochs],
        epoch_test_loss=[e["test_loss"] for e in epochs],
        epoch_test_accuracy=[e["test_accuracy"] for e in epochs],
        load_average=" ".join(f"{v:.2f}" for v in os.getloadavg()),
    )
    print(f"train images/s {info['train_images_per_second']:.1f} over {total_images} images "
          f"({total_seconds:.1f} s of training steps, {info['seconds']:.1f} s in all); "
          f"test accuracy {info['test_accuracy']:.4f}, test loss {info['test_loss']:.4f}")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(info, f, indent=2)
            f.write("\n")
        print(f"wrote {ARGS.json}")


if __name__ == "__main__":
    main()
