"""gyre.torch (Horovod's API) on CUDA tensors, where gyre is built with NCCL
and this host has a GPU for each of its ranks (NCCL takes no two ranks of a
communicator on one device). Each collective's CUDA result is compared with
the same call on a CPU copy (gyre's own ring over MPI): bit for bit where
both compute alike (small integers, which every summation order adds
exactly; Adasum, which the NCCL path stages through host memory and runs
with the CPU algorithm), within rounding where the CUDA path scales in its
own kernel. Then the autograd of allreduce and DistributedOptimizer on a
CUDA model against the gradients of every rank computed locally. Without a
GPU or without NCCL every test skips, saying why (scripts/gpu_check.sh runs
them on a GPU machine)."""

import numpy as np
import pytest
import torch
from torch import nn

import gyre
import gyre.torch as hvd
from conftest import rank_data

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]


@pytest.fixture(scope="module")
def dev():
    if not gyre.nccl_built():
        pytest.skip("gyre is built without NCCL: CUDA tensors are refused")
    if not torch.cuda.is_available():
        pytest.skip("no GPU found (torch.cuda.is_available() is False)")
    if gyre.local_size() > torch.cuda.device_count():
        pytest.skip(f"{gyre.local_size()} ranks on this host need as many GPUs, "
                    f"found {torch.cuda.device_count()}")
    d = torch.device("cuda", gyre.local_rank())
    torch.cuda.set_device(d)
    return d


def small_ints(r, shape, dtype, seed=0):
    """Rank r's input: integers in [-5, 5] ([0, 5] unsigned) as `dtype`, so
    sums, minima and maxima over ranks are exact in every dtype and order."""
    signed = dtype != torch.uint8
    return torch.from_numpy(rank_data(r, shape, np.int64 if signed else np.uint8, seed)).to(dtype)


def on(dev, x):
    return x.to(dev)


def assert_cuda_result(got, dev, ref):
    assert got.device == dev, f"result on {got.device}, expected {dev}"
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got.cpu(), ref), f"CUDA result differs from the CPU path:\n{got}\n{ref}"


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max], ids=["sum", "min", "max"])
def test_allreduce_equals_the_cpu_path(dev, rank, dtype, op):
    x = small_ints(rank, (257,), dtype)
    ref = hvd.allreduce(x, op=op, name=f"cpu.{dtype}.{op}")
    got = hvd.allreduce(on(dev, x), op=op, name=f"cuda.{dtype}.{op}")
    assert_cuda_result(got, dev, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_allreduce_product(dev, rank, size, dtype):
    x = small_ints(rank, (64,), dtype)
    expect = torch.stack([small_ints(r, (64,), dtype) for r in range(size)]).prod(0)
    assert_cuda_result(hvd.allreduce(on(dev, x), op=hvd.Product), dev, expect)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_average_with_prescale_and_postscale(dev, rank, size, dtype):
    """Average with both factors runs the CUDA scaling kernel (float32
    arithmetic for the 16-bit types): close to the closed form and to the CPU."""
    x = small_ints(rank, (300,), dtype)
    stack = torch.stack([small_ints(r, (300,), torch.float64) for r in range(size)])
    expect = (stack.mean(0) * 2.0 * 0.25).to(dtype)
    got = hvd.allreduce(on(dev, x), op=hvd.Average, prescale_factor=2.0, postscale_factor=0.25)
    ref = hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.25)
    assert got.device == dev and got.dtype == dtype
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(got.cpu(), expect, rtol=tol, atol=tol)
    torch.testing.assert_close(got.cpu(), ref, rtol=tol, atol=tol)


def test_in_place_async_and_fused(dev, rank, size):
    x = on(dev, small_ints(rank, (1031,), torch.float32))
    ptr = x.data_ptr()
    assert hvd.allreduce_(x, op=hvd.Sum) is x and x.data_ptr() == ptr
    expect = sum(small_ints(r, (1031,), torch.float32) for r in range(size))
    assert_cuda_result(x, dev, expect)
    # Twelve small tensors enqueued together: one bucket in the device fusion buffer.
    xs = [on(dev, small_ints(rank, (5 + 3 * k,), torch.float32, seed=k)) for k in range(12)]
    handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"fused.{k}") for k, t in enumerate(xs)]
    for k, h in enumerate(handles):
        assert hvd.synchronize(h) is xs[k]
        ref = sum(small_ints(r, (5 + 3 * k,), torch.float32, seed=k) for r in range(size))
        assert_cuda_result(xs[k], dev, ref)
    grouped = hvd.grouped_allreduce([on(dev, small_ints(rank, (7, k + 1), torch.float64, seed=k))
                                     for k in range(5)], op=hvd.Sum)
    for k, g in enumerate(grouped):
        ref = sum(small_ints(r, (7, k + 1), torch.float64, seed=k) for r in range(size))
        assert_cuda_result(g, dev, ref)


def test_broadcast(dev, rank, size):
    x = on(dev, small_ints(rank, (40, 3), torch.int64))
    hvd.broadcast_(x, root_rank=size - 1)
    assert_cuda_result(x, dev, small_ints(size - 1, (40, 3), torch.int64))
    y = hvd.broadcast(on(dev, small_ints(rank, (9,), torch.bfloat16)), root_rank=0)
    assert_cuda_result(y, dev, small_ints(0, (9,), torch.bfloat16))


def test_allgather_with_uneven_first_dimensions(dev, rank, size):
    x = small_ints(rank, (rank + 1, 3), torch.float32)
    got = hvd.allgather(on(dev, x), name="gather.cuda")
    assert_cuda_result(got, dev, torch.cat([small_ints(r, (r + 1, 3), torch.float32)
                                            for r in range(size)]))
    assert_cuda_result(got, dev, hvd.allgather(x, name="gather.cpu"))


def test_reducescatter(dev, rank, size):
    rows = 2 * size + 1
    x = small_ints(rank, (rows, 4), torch.float32)
    got = hvd.reducescatter(on(dev, x), op=hvd.Sum, name="rs.cuda")
    ref = hvd.reducescatter(x, op=hvd.Sum, name="rs.cpu")
    assert_cuda_result(got, dev, ref)
    total = sum(small_ints(r, (rows, 4), torch.float32) for r in range(size))
    start = sum(rows // size + (1 if q < rows % size else 0) for q in range(rank))
    assert torch.equal(got.cpu(), total[start:start + ref.shape[0]])


def test_alltoall_with_splits(dev, rank, size):
    splits = [p + rank + 1 for p in range(size)]
    x = small_ints(rank, (sum(splits), 2), torch.int32)
    got, received = hvd.alltoall(on(dev, x), splits=splits, name="a2a.cuda")
    ref, ref_received = hvd.alltoall(x, splits=splits, name="a2a.cpu")
    assert_cuda_result(got, dev, ref)
    assert torch.equal(received.cpu(), ref_received.cpu())
    assert received.tolist() == [rank + q + 1 for q in range(size)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_adasum_is_the_cpu_algorithm(dev, rank, size, dtype):
    """The NCCL path stages Adasum through host memory and runs the CPU
    algorithm: the same bits as on CPU tensors, fused or not."""
    if size & (size - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    x = torch.sin(0.3 * torch.arange(1031, dtype=torch.float64) + rank).to(dtype)
    got = hvd.allreduce(on(dev, x), op=hvd.Adasum, name="adasum.cuda")
    assert_cuda_result(got, dev, hvd.allreduce(x, op=hvd.Adasum, name="adasum.cpu"))
    if size == 1:
        assert torch.equal(got.cpu(), x)
    xs = [torch.cos(0.1 * torch.arange(50 + 7 * k, dtype=torch.float64) * (rank + 1)).to(dtype)
          for k in range(4)]
    got = hvd.grouped_allreduce([on(dev, t) for t in xs], op=hvd.Adasum, name="adasum.fused.cuda")
    ref = hvd.grouped_allreduce(xs, op=hvd.Adasum, name="adasum.fused.cpu")
    for g, c in zip(got, ref):
        assert_cuda_result(g, dev, c)


def test_allreduce_autograd(dev, rank, size):
    x = on(dev, small_ints(rank, (33,), torch.float32)).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, name="autograd")
    w = torch.arange(33, dtype=torch.float32, device=dev)
    (y * w).sum().backward()
    # d/dx_r of sum over ranks: the allreduce (sum) of every rank's upstream gradient.
    assert x.grad.device == dev
    assert torch.equal(x.grad.cpu(), size * w.cpu())


def test_distributed_optimizer_on_a_cuda_model(dev, rank, size):
    """Every rank trains a CUDA model on its own batch; the parameters after
    each step equal one model stepped locally with the average of all ranks'
    gradients (each rank's recomputed here, on the same device)."""
    def make():
        torch.manual_seed(7)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double().to(dev)

    def batch(r, step):
        g = torch.Generator().manual_seed(100 * step + r)
        return (torch.randn(8, 6, generator=g, dtype=torch.float64).to(dev),
                torch.randn(8, 3, generator=g, dtype=torch.float64).to(dev))

    model, ref = make(), make()
    with torch.no_grad():  # differ before the broadcast
        for p in model.parameters():
            p.add_(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device == dev and torch.equal(p, q)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(size):
            ref_opt.zero_grad()
            x, y = batch(r, step)
            nn.functional.mse_loss(ref(x), y).backward()
            for g, p in zip(grads, ref.parameters()):
                g += p.grad / size
        for g, p in zip(grads, ref.parameters()):
            p.grad = g
        ref_opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert p.device == dev
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
