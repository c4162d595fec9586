"""Beyond plain DDP on the gyre backend: FSDP (fully_shard) and
ZeroRedundancyOptimizer against one process on the union batch, the PowerSGD
comm hook (which waits on an allreduce inside a future's callback), torch's
coalescing manager, and a second group of all ranks."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre.torch.distributed  # noqa: F401 (registers the backend)

LR = 0.1
STEPS = 3


def make_model():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(r, step, n=4):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)


def reference(size):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in range(size)))
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def full(p):
    """A parameter's full value (FSDP keeps a shard per rank)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def train(model, opt, rank):
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def test_fsdp_fully_shard_matches_union_batch(world):
    rank, size = world
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    train(model, torch.optim.SGD(model.parameters(), lr=LR), rank)
    for p, q in zip(model.parameters(), reference(size)):
        assert torch.allclose(full(p), q, atol=1e-5)


def test_zero_redundancy_optimizer_matches_union_batch(world):
    rank, size = world
    model = DDP(make_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=LR)
    train(model, opt, rank)
    for p, q in zip(model.parameters(), reference(size)):
        assert torch.allclose(p, q, atol=1e-5)


def test_powersgd_hook_trains_identically_on_every_rank(world):
    rank, size = world
    model = DDP(make_model())
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(2 * STEPS):  # past start_powerSGD_iter: the compressed path
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, flat) for g in gathered)


def test_coalescing_manager(world):
    rank, size = world
    outs = [torch.empty(2 * size), torch.empty(3 * size)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, n in zip(outs, (2, 3)):
            dist.all_gather_into_tensor(o, torch.full((n,), float(rank)))
    cm.wait()
    for o, n in zip(outs, (2, 3)):
        assert torch.equal(o, torch.arange(float(size)).repeat_interleave(n))


def test_new_group_of_every_rank(world):
    rank, size = world
    group = dist.new_group()
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, group=group)
    assert torch.equal(t, torch.full((3,), float(sum(range(size)))))
