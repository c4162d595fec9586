#!/usr/bin/env python3
"""DDP training-step time on the gyre backend beside DDP on gloo, in one job:

    mpirun -np 2 python3 benchmarks/ddp_step.py [--models cnn,transformer,mlp] [--steps 20]

The default group is gyre's; the gloo group is made with
new_group(backend="gloo") on the store gyre's rendezvous created, so both run
on the same ranks, models and data. Blocks of steps alternate between the
two; a step's time is the slowest rank's, the figure per system the median
over steps with the spread (min-max). Small per-rank batches, so that
communication is a visible share of the step. Models (no torchvision needed):
cnn (a ResNet-style conv net on 32x32 images, batch 8), transformer (a
4-layer nn.TransformerEncoder, d_model 512, sequence 32, batch 8), mlp (4
wide linear layers, batch 16). Prints one row per model and system; ratios
are printed, never asserted.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre.torch.distributed  # noqa: F401


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
    if name == "mlp":
        model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                              nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10))
        return model, lambda g: (torch.randn(16, 1024, generator=g),
                                 torch.randint(0, 10, (16,), generator=g))
    raise SystemExit(f"unknown model {name!r} (cnn, transformer, mlp)")


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
    if rank == 0:
        print(f"# DDP step, {world} ranks, torch {torch.__version__}; time in ms: median (min-max)")
        print(f"{'model':12} {'params':>10} {'gloo':>22} {'gyre':>22} {'gloo/gyre':>10}")
    for name in args.models.split(","):
        results = {}
        systems = {}
        for system, group in (("gloo", gloo), ("gyre", None)):
            torch.manual_seed(0)
            model, data = make(name)
            ddp = DDP(model, process_group=group)
            systems[system] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), data)
            results[system] = []
        g = torch.Generator().manual_seed(rank)
        for system in systems:  # warm-up
            ddp, opt, data = systems[system]
            timed_steps(ddp, opt, data, 3, g)
        per_block = max(1, args.steps // args.blocks)
        for _ in range(args.blocks):
            for system in systems:
                ddp, opt, data = systems[system]
                results[system] += timed_steps(ddp, opt, data, per_block, g)
        if rank == 0:
            params = sum(p.numel() for p in systems["gyre"][0].parameters())
            cells = []
            for system in ("gloo", "gyre"):
                t = [1e3 * s for s in results[system]]
                cells.append(f"{statistics.median(t):8.2f} ({min(t):.2f}-{max(t):.2f})")
            ratio = statistics.median(results["gloo"]) / statistics.median(results["gyre"])
            print(f"{name:12} {params:>10} {cells[0]:>22} {cells[1]:>22} {ratio:>9.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
