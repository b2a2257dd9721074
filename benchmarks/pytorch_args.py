"""The PyTorch benchmarks' flags every script checks alike, and their thread count, set in the
environment before torch loads (its thread pools size themselves then). No torch import here:
the scripts import this first (benchmarks/pytorch_mnist.py, pytorch_resnet.py, pytorch_vit.py)."""
import os


def checked(p, a):
    """`a` (p.parse_args()'s) once --epochs, --batch-size and --eval-batch-size are >= 1 and
    --steps-per-epoch and --threads >= 0; p.error (exit 2) naming the flag otherwise."""
    for name in ("epochs", "batch_size", "eval_batch_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.steps_per_epoch < 0 or a.threads < 0:
        p.error("--steps-per-epoch and --threads must be >= 0")
    return a


def threads_before_torch(a):
    """The intra-op thread count (--threads, 0: every core), put in the environment of the
    libraries torch loads (OpenMP, MKL, OpenBLAS)."""
    threads = a.threads if a.threads > 0 else (os.cpu_count() or 1)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    return threads
