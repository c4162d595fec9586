"""The task of the asynchronous-training benchmarks (async_training.py under
mpirun, async_update_model.py in one process, async_convergence_summary.py
over their curves): a classifier of a fixed random teacher's labels, its
model, and the measures of a loss curve. Torch only (no gyre, no MPI)."""

import torch

FEATURES, HIDDEN, CLASSES, BATCH = 64, 512, 10, 128


def teacher_data(seed, n):
    g = torch.Generator().manual_seed(seed)
    t = torch.Generator().manual_seed(1234)  # the same teacher everywhere
    w1 = torch.randn(FEATURES, 48, generator=t)
    w2 = torch.randn(48, CLASSES, generator=t)
    x = torch.randn(n, FEATURES, generator=g)
    logits = torch.tanh(x @ w1) @ w2 + 0.5 * torch.randn(n, CLASSES, generator=g)
    return x, logits.argmax(dim=1)


def model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def reach(curve, target):
    hit = [s for s, l in curve if l <= target]
    return hit[0] if hit else None


def smoothed(curve, k=5):
    """Each evaluation's loss replaced by the mean of the last k up to it."""
    return [(s, sum(l for _, l in curve[max(0, i - k + 1):i + 1]) / len(curve[max(0, i - k + 1):i + 1]))
            for i, (s, _) in enumerate(curve)]
