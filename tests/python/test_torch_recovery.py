"""gyre.torch after an error: DistributedOptimizer.step() following a caught
error reduces the gradients properly or raises on every rank (never steps on
un-averaged gradients), and a tensor whose storage is replaced while its
operation is in flight neither crashes the process nor yields a silent result."""

import warnings

import pytest
import torch
from torch import nn

import gyre.torch as hvd

LR = 0.1


def make_model(seed, out=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, out))


def batch(r, step, n=8, out=3):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 6, generator=g), torch.randn(n, out, generator=g)


def loss_fn(model, x, y):
    return nn.functional.mse_loss(model(x), y)


def union(size, step):
    xs, ys = zip(*(batch(r, step) for r in range(size)))
    return torch.cat(xs), torch.cat(ys)


def distributed(model, **kwargs):
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), **kwargs)


def test_step_after_caught_divergence_reduces_the_gradients(size, rank, multi_rank):
    """The documented recovery (catch DivergenceError, resync, step again)
    without zero_grad(): the second step() must average this step's
    gradients, not apply each rank's own."""
    model, ref = make_model(seed=11), make_model(seed=11)
    opt = distributed(model)
    if rank == size - 1:
        hvd.commit_step()  # this rank is one step ahead: every allreduce diverges
    loss_fn(model, *batch(rank, 120)).backward()
    with pytest.raises(hvd.DivergenceError):
        opt.step()
    hvd.resync(model, policy="newest")  # equal steps again; gradients untouched
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not "gradients were not reduced again"
        opt.step()
    loss_fn(ref, *union(size, 120)).backward()
    torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9).step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)


def test_step_after_caught_mismatch_raises_again(size, rank, multi_rank):
    """A cause that persists fails the next step() too, on every rank."""
    model = make_model(seed=12, out=4 if rank == 1 else 3)
    opt = distributed(model)
    x, y = batch(rank, 121, out=4 if rank == 1 else 3)
    loss_fn(model, x, y).backward()
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        with pytest.raises(hvd.MismatchError, match="shape"):
            opt.step()
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p.detach(), q), "a parameter was updated by a failed step()"
    opt.zero_grad()


def test_reduced_gradients_are_not_reduced_twice(size, rank, multi_rank):
    """Gradients whose allreduce succeeded before the error keep their result:
    the step after the error reduces only the ones that failed (with Sum, a
    second reduction would multiply them by the number of ranks)."""
    torch.manual_seed(13)
    shared = nn.Parameter(torch.zeros(4))
    odd = nn.Parameter(torch.zeros(5 if rank == 1 else 2))  # mismatched on rank 1
    opt = hvd.DistributedOptimizer(torch.optim.SGD([shared, odd], lr=1.0),
                                   named_parameters=[("shared", shared), ("odd", odd)],
                                   op=hvd.Sum)
    ((rank + 1.0) * shared.sum() + odd.sum()).backward()
    with pytest.raises(hvd.MismatchError, match="'DistributedOptimizer.odd'"):
        opt.step()
    # Every rank leaves the mismatched parameter out, then steps again.
    odd.requires_grad_(False)
    odd.grad = None
    opt.step()
    total = size * (size + 1) / 2
    assert shared.grad.tolist() == [total] * 4
    assert shared.detach().tolist() == [-total] * 4


def test_skip_synchronize_after_a_failed_synchronize_raises(size, rank, multi_rank):
    """`synchronize(); with skip_synchronize(): step()` must not step on the
    gradients a failed synchronize() left un-reduced."""
    model = make_model(seed=14, out=4 if rank == 1 else 3)
    opt = distributed(model)
    loss_fn(model, *batch(rank, 122, out=4 if rank == 1 else 3)).backward()
    with pytest.raises(hvd.MismatchError):
        opt.synchronize()
    with pytest.raises(hvd.StateError, match="synchronize"):
        with opt.skip_synchronize():
            opt.step()
    opt.zero_grad()  # a new start: gradients are recomputed
    with opt.skip_synchronize():
        opt.step()  # no gradients at all: nothing to apply, nothing raised


# Storage lifetime ------------------------------------------------------------------


def test_storage_replaced_while_in_flight(size, rank, multi_rank):
    """t.set_() on a tensor whose in-place allreduce is in flight: gyre keeps
    the original storage alive until the operation completes (writing into
    freed memory crashed the process before), and synchronize() raises a
    clear error since `t` no longer holds the result."""
    # 64 MiB, above glibc's largest mmap threshold: freed memory is unmapped
    # at once, so a write into it faults instead of going unnoticed.
    n = 1 << 24
    t = torch.ones(n)
    if rank == 0:
        handle = hvd.allreduce_async_(t, op=hvd.Sum, name="storage.replaced")
        t.set_(torch.zeros(3))  # the only other reference to the storage goes
        hvd.barrier()  # the others enqueue only now: the operation is in flight
        with pytest.raises(hvd.InvalidArgumentError, match="'storage.replaced'.*reallocated"):
            hvd.synchronize(handle)
        assert t.tolist() == [0.0, 0.0, 0.0]
    else:
        hvd.barrier()
        out = hvd.allreduce_(t, op=hvd.Sum, name="storage.replaced")
        assert torch.equal(out, torch.full((n,), float(size)))
