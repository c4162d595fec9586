"""CUDA tensors on the gyre backend: registered for "cuda" where gyre is built
with NCCL, and then collectives, point-to-point and DistributedDataParallel
on each rank's GPU against values computed locally. Without a GPU (or
without NCCL) only the registration is checked; the GPU tests skip, saying
why. Runs under mpirun -np 2 and -np 3, and at one rank in
scripts/gpu_check.sh."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre
import gyre.torch.distributed as gtd


def test_cuda_is_registered_exactly_when_gyre_has_nccl(world):
    caps = dist.Backend.backend_capability["gyre"]
    assert "cpu" in caps
    assert ("cuda" in caps) == gyre.nccl_built()
    assert gtd.backend_devices() == caps


def _gpu_or_skip():
    if not gyre.nccl_built():
        pytest.skip("gyre is built without NCCL: the backend takes CPU tensors only")
    if not torch.cuda.is_available():
        pytest.skip("no GPU found (torch.cuda.is_available() is False)")
    return torch.device("cuda", gyre.local_rank() % torch.cuda.device_count())


def test_cuda_collectives(world):
    dev = _gpu_or_skip()
    rank, size = world
    torch.cuda.set_device(dev)
    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert t.device == dev and torch.all(t == size * (size + 1) / 2)
    b = torch.full((7,), float(rank), device=dev)
    dist.broadcast(b, src=size - 1)
    assert torch.all(b == size - 1)
    out = [torch.empty(3, device=dev) for _ in range(size)]
    dist.all_gather(out, torch.full((3,), float(rank), device=dev))
    assert [o[0].item() for o in out] == [float(r) for r in range(size)]
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.ones(2 * size, device=dev))
    assert torch.all(rs == size)


def test_cuda_point_to_point(world):
    dev = _gpu_or_skip()
    rank, size = world
    torch.cuda.set_device(dev)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(5, device=dev)
    ops = [dist.P2POp(dist.isend, torch.full((5,), float(rank), device=dev), nxt),
           dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert got.device == dev and torch.all(got == prv)


def test_ddp_on_cuda(world):
    """DDP of a CUDA model (several gradient buckets) on the gyre backend: the
    parameters after each step equal one model on the same GPU trained on
    the union of every rank's batches."""
    dev = _gpu_or_skip()
    rank, size = world
    torch.cuda.set_device(dev)

    def make(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                             nn.Linear(32, 3)).double().to(dev)

    def batch(r, step):
        g = torch.Generator().manual_seed(1000 * step + r)
        return (torch.randn(4, 6, generator=g, dtype=torch.float64).to(dev),
                torch.randn(4, 3, generator=g, dtype=torch.float64).to(dev))

    # Rank 0's seed is the reference's: DDP's construction broadcasts its parameters.
    model = DDP(make(1 + rank), device_ids=[dev.index], bucket_cap_mb=0.002)
    ref = make(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        xs, ys = zip(*(batch(r, step) for r in range(size)))
        nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
        for p, q in zip(model.module.parameters(), ref.parameters()):
            assert p.device == dev
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
