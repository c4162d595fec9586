#!/usr/bin/env python3
"""Training-step time: DDP on gloo, DDP on gyre (also with gyre's comm hook,
"gyre-hook": gyre.torch.distributed.allreduce_hook, each bucket under a name of
its own) and gyre.torch's DistributedOptimizer (Horovod's API), in one job:

    mpirun -np 2 python3 benchmarks/ddp_step.py [--models cnn,transformer,mlp] [--steps 20]

The default group is gyre's; the gloo group is made with
new_group(backend="gloo") on the store gyre's rendezvous created, so every
system runs on the same ranks, models and data. Blocks of steps alternate
between the systems; a step's time is the slowest rank's, the figure per
system the median over steps with the spread (min-max), and samples/s over
all ranks at the median. A fourth system, "local", runs the same steps with
no communication at all (the bare model and optimizer): the step time of a
system minus local's is the communication it did not hide behind compute
(measured, in the same job, not estimated). Small per-rank batches, so that
communication is a visible share of the step. Models: cnn (a ResNet-style
conv net on 32x32 images, batch 8), transformer (a 4-layer
nn.TransformerEncoder, d_model 512, sequence 32, batch 8), mlp (4 wide
linear layers, batch 16), bert (a BERT-base-sized nn.TransformerEncoder: 12
layers, d_model 768, 12 heads, feed-forward 3072, sequence 32, batch 4), and
with torchvision installed resnet18 and resnet50 (weights=None, 10 classes,
32x32 inputs, batch 8). Ratios are printed, never asserted.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre.torch as hvd
import gyre.torch.distributed  # noqa: F401
from gyre.torch.distributed import BucketNames, allreduce_hook

SYSTEMS = ("gloo", "gyre", "gyre-hook", "hvd", "local")


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


def make(name):
    """(model, input maker, loss) for a model name."""
    if name == "cnn":
        model = nn.Sequential(block(3, 64, 1), block(64, 128, 2), block(128, 256, 2),
                              block(256, 512, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(512, 10))
        return model, lambda g: (torch.randn(8, 3, 32, 32, generator=g),
                                 torch.randint(0, 10, (8,), generator=g))
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, 4), nn.Flatten(), nn.Linear(512 * 32, 10))
        return model, lambda g: (torch.randn(8, 32, 512, generator=g),
                                 torch.randint(0, 10, (8,), generator=g))
    if name == "bert":
        layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, 12), nn.Flatten(), nn.Linear(768 * 32, 10))
        return model, lambda g: (torch.randn(4, 32, 768, generator=g),
                                 torch.randint(0, 10, (4,), generator=g))
    if name in ("resnet18", "resnet50"):
        try:
            import torchvision
        except ImportError as e:
            raise SystemExit(f"{name} needs torchvision ({e}); docs/torch-distributed.md says how "
                             "to install it") from e
        model = getattr(torchvision.models, name)(weights=None, num_classes=10)
        return model, lambda g: (torch.randn(8, 3, 32, 32, generator=g),
                                 torch.randint(0, 10, (8,), generator=g))
    if name == "mlp":
        model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                              nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10))
        return model, lambda g: (torch.randn(16, 1024, generator=g),
                                 torch.randint(0, 10, (16,), generator=g))
    raise SystemExit(f"unknown model {name!r} (cnn, transformer, mlp, bert, resnet18, resnet50)")


def build(system, name, gloo):
    """(model, optimizer, input maker) of a model name for a system."""
    torch.manual_seed(0)
    model, data = make(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if system in ("gloo", "gyre", "gyre-hook"):
        model = DDP(model, process_group=gloo if system == "gloo" else None)
        if system == "gyre-hook":
            model.register_comm_hook(BucketNames(f"ddp_step.{name}"), allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    elif system == "hvd":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    return model, opt, data


def timed_steps(model, opt, data, steps, g):
    times = []
    for _ in range(steps):
        x, y = data(g)
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
        times.append(elapsed.item())
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,transformer,mlp")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per system")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per system")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gyre")
    gloo = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hvd.init()
    if rank == 0:
        print(f"# training step, {world} ranks, torch {torch.__version__}; time in ms: median "
              "(min-max); samples/s over all ranks at the median; exposed comm = median - local's")
        print(f"{'model':10} {'params':>10} {'system':9} {'step ms':>24} {'samples/s':>10} "
              f"{'exposed comm ms':>16} {'gloo/this':>10}")
    for name in args.models.split(","):
        systems = {system: build(system, name, gloo) for system in SYSTEMS}
        results = {system: [] for system in SYSTEMS}
        batch = make(name)[1](torch.Generator().manual_seed(0))[0].shape[0]
        g = torch.Generator().manual_seed(rank)
        for system in SYSTEMS:  # warm-up
            model, opt, data = systems[system]
            timed_steps(model, opt, data, 3, g)
        per_block = max(1, args.steps // args.blocks)
        for _ in range(args.blocks):
            for system in SYSTEMS:
                model, opt, data = systems[system]
                results[system] += timed_steps(model, opt, data, per_block, g)
        if rank == 0:
            params = sum(p.numel() for p in systems["local"][0].parameters())
            median = {system: statistics.median(results[system]) for system in SYSTEMS}
            for system in SYSTEMS:
                t = [1e3 * s for s in results[system]]
                cell = f"{1e3 * median[system]:8.2f} ({min(t):.2f}-{max(t):.2f})"
                rate = batch * world / median[system]
                comm = "" if system == "local" else f"{1e3 * (median[system] - median['local']):.2f}"
                ratio = "" if system == "local" else f"{median['gloo'] / median[system]:.2f}x"
                print(f"{name:10} {params:>10} {system:9} {cell:>24} {rate:>10.1f} {comm:>16} "
                      f"{ratio:>10}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
