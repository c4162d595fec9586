"""CUDA tensors on the gyre backend: registered for "cuda" where gyre is built
with NCCL, and then collectives and point-to-point on each rank's GPU
against values computed locally. Without a GPU (or without NCCL) only the
registration is checked; the GPU tests skip, saying why. Runs under mpirun
-np 2 and -np 3."""

import pytest
import torch
import torch.distributed as dist

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
