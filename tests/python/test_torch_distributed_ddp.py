"""DistributedDataParallel on the gyre backend: a few training steps give the
parameters of one process training on the union of every rank's batches, and
those of DDP on gloo; with several gradient buckets, gradient-as-bucket-view,
find_unused_parameters, static_graph, no_sync, and comm hooks; gyre's own
hook (gyre.torch.distributed.allreduce_hook) equal to DDP without it, bit
for bit, with its buckets negotiated as response-cache hits in log depth."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre
import gyre.torch.distributed  # noqa: F401 (registers the backend)
from gyre.torch.distributed import BucketNames, allreduce_hook

LR = 0.1
STEPS = 3


class Net(nn.Module):
    """Several parameters (so several buckets with a small bucket cap) and an
    optional branch that takes no part in the loss."""

    def __init__(self, seed, with_unused=False):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(6, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 3)
        self.unused = nn.Linear(3, 3) if with_unused else None

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def batch(r, step, n=4):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)


def union(size, step):
    xs, ys = zip(*(batch(r, step) for r in range(size)))
    return torch.cat(xs), torch.cat(ys)


def reference(size, steps=STEPS, micro=1):
    """One process, the union batch of every rank (micro-batches summed)."""
    model = Net(seed=1)  # every rank's seed differs below: DDP broadcasts rank 0's
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = union(size, micro * step + m)
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def train_ddp(rank, steps=STEPS, micro=1, hook=None, process_group=None, **ddp_kwargs):
    # Rank 0's seed is the reference's: DDP's construction broadcasts its parameters.
    with_unused = ddp_kwargs.get("find_unused_parameters", False)
    model = DDP(Net(seed=1 + rank, with_unused=with_unused), process_group=process_group, bucket_cap_mb=0.002,
                **ddp_kwargs)
    if hook is not None:
        model.register_comm_hook(process_group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro - 1):
            with model.no_sync():
                x, y = batch(rank, micro * step + m)
                nn.functional.mse_loss(model(x), y).backward()
        x, y = batch(rank, micro * step + micro - 1)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model.module


def assert_close(model, ref, atol=1e-5):
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if name.startswith("unused."):
            continue
        q = ref_params[name]
        assert torch.allclose(p, q, atol=atol, rtol=1e-4), f"{name}: {(p - q).abs().max()}"


@pytest.mark.parametrize("options", [
    {},
    {"gradient_as_bucket_view": True},
    {"find_unused_parameters": True},
    {"static_graph": True},
], ids=["default", "bucket_view", "find_unused", "static_graph"])
def test_ddp_matches_union_batch(world, options):
    rank, size = world
    assert_close(train_ddp(rank, **options), reference(size))


def test_ddp_no_sync_accumulates_like_the_union(world):
    rank, size = world
    assert_close(train_ddp(rank, micro=2), reference(size, micro=2))


def test_ddp_fp16_compress_hook(world):
    rank, size = world
    # The hook rounds gradients to fp16: a looser tolerance.
    assert_close(train_ddp(rank, hook=default_hooks.fp16_compress_hook), reference(size),
                 atol=2e-3)


def test_ddp_allreduce_hook_runs_on_gyre(world):
    rank, size = world
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    assert_close(train_ddp(rank, hook=counting_hook), reference(size))
    assert len(set(calls)) > 1, "the small bucket cap should make several buckets"


def test_ddp_matches_gloo(world):
    rank, size = world
    # The gyre:// rendezvous made a real store: a gloo group can share it.
    gloo = dist.new_group(backend="gloo")
    on_gloo = train_ddp(rank, process_group=gloo)
    on_gyre = train_ddp(rank)
    assert_close(on_gyre, on_gloo, atol=1e-6)


def test_gyre_allreduce_hook_equals_ddp_without_it(world):
    """Bit for bit on 2 ranks (a sum of two is the same in either order, and
    halving is exact); on more, the sums may be added in another order."""
    rank, size = world
    plain = train_ddp(rank)
    hooked = train_ddp(rank, hook=allreduce_hook)
    for (name, p), (_, q) in zip(plain.named_parameters(), hooked.named_parameters()):
        if size <= 2:
            assert torch.equal(p, q), f"{name}: {(p - q).abs().max()}"
        else:
            assert torch.allclose(p, q, atol=1e-6, rtol=1e-5), f"{name}: {(p - q).abs().max()}"
    assert_close(hooked, reference(size))


def negotiation_per_steps(rank, hook=None, state=None, steps=4):
    """The runtime's negotiation counters over `steps` DDP steps, after two
    (DDP rebuilds its buckets after the first: new requests once more)."""
    model = DDP(Net(seed=1 + rank), bucket_cap_mb=0.002)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(i):
        opt.zero_grad()
        x, y = batch(rank, i)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    step(0)
    step(1)
    dist.barrier()
    before = gyre.runtime_stats()
    for i in range(2, 2 + steps):
        step(i)
    after = gyre.runtime_stats()
    return {k: after[k] - before[k]
            for k in ("requests_sent", "cache_hits_sent", "log_depth_rounds", "rounds")}


def test_gyre_allreduce_hook_buckets_are_cache_hits_in_log_depth(world):
    """Under the process group's names a bucket is a cache hit only when the
    bucket before it was agreed before it was enqueued (the group's numbered
    names, docs/architecture.md), which depends on timing; under the hook's,
    after the first two steps, every bucket is a cache bit and, across
    ranks, every round is decided in log depth."""
    rank, size = world
    steps = 4
    plain = negotiation_per_steps(rank, steps=steps)
    hooked = negotiation_per_steps(rank, allreduce_hook, BucketNames("hits"), steps=steps)
    buckets = plain["requests_sent"] + plain["cache_hits_sent"]
    assert buckets >= 2 * steps, plain  # several buckets per step
    assert hooked["requests_sent"] == 0, hooked
    assert hooked["cache_hits_sent"] == buckets, (hooked, plain)
    if size > 1:
        assert hooked["log_depth_rounds"] == hooked["rounds"] > 0, hooked


def test_gyre_allreduce_hook_refuses_another_backend(world):
    rank, size = world
    gloo = dist.new_group(backend="gloo")
    model = DDP(Net(seed=1 + rank), process_group=gloo)
    model.register_comm_hook(BucketNames(process_group=gloo), allreduce_hook)
    x, y = batch(rank, 0)
    with pytest.raises(Exception, match="not one of the gyre backend"):
        nn.functional.mse_loss(model(x), y).backward()
