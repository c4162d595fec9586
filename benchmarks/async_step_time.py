"""The time of one gyre.torch.AsyncOptimizer step on a small model, and the
store requests it sends (docs/training-modes.md, "A step's requests"). Run
under mpirun:

    mpirun -np 2 python3 benchmarks/async_step_time.py [--steps 300] [--layers 6] [--width 64]

The model: `layers` Linear(width, width) with ReLU between (2 * layers
parameter tensors, all under the store's split size: each whole on one
owner), batch 32, SGD, staleness=None (no rank waits for another, so the
time is the step's own). Rank 0 prints the mean of opt.step() (the store's
part: push the updates, pull the parameters) and of the whole training step
over the last `steps` steps (after 20 warm-up steps), the slowest rank's
means, and the requests the ranks' servers answered per step and rank.
"""

import argparse
import time

import numpy as np
import torch

import gyre
import gyre.torch as hvd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=64)
    a = p.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(7)
    torch.set_num_threads(1)
    mods = []
    for i in range(a.layers):
        mods.append(torch.nn.Linear(a.width, a.width))
        if i + 1 < a.layers:
            mods.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*mods)
    opt = hvd.AsyncOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), net.named_parameters(),
                             staleness=None)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, a.width, generator=g)
    y = torch.randn(32, a.width, generator=g)
    step_s = total_s = 0.0
    warmup = 20
    for k in range(warmup + a.steps):
        if k == warmup:
            gyre.barrier()
            served0 = opt.store.stats()["served_requests"]
            step_s = total_s = 0.0
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        step_s += t2 - t1
        total_s += t2 - t0
    gyre.barrier()
    served = opt.store.stats()["served_requests"] - served0
    mine = np.array([step_s, total_s], dtype=np.float64) / a.steps * 1e3
    worst = gyre.allreduce(mine.copy(), op=gyre.Max)
    served_all = int(gyre.allreduce(np.array([served], dtype=np.int64), op=gyre.Sum)[0])
    if rank == 0:
        print(f"ranks {size} params {2 * a.layers} steps {a.steps}: opt.step {mine[0]:.3f} ms "
              f"(slowest rank {worst[0]:.3f}), training step {mine[1]:.3f} ms "
              f"(slowest {worst[1]:.3f}), requests served per step and rank "
              f"{served_all / a.steps / size:.1f}", flush=True)
    opt.close()


if __name__ == "__main__":
    main()
