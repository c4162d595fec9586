"""Synchronous against asynchronous and bounded-staleness training on gyre
(docs/training-modes.md): throughput of the ranks when one rank is slower,
and loss against samples processed. Run under mpirun:

    mpirun -np 2 python3 benchmarks/async_training.py [--steps 300] [--modes sync,s0,s2,s8,async]

The task: a 10-class classifier (MLP 64-512-10, batch 128) on data labelled by a fixed
random teacher network with noise; every rank draws its own batches (fixed
seeds). A mode runs twice: with every rank at full speed, then with the last
rank slowed 2x (it sleeps as long as its step computed). Rank 0 prints one
line per mode and run: its steps per second (the fast ranks' throughput),
the samples all ranks processed, the test loss at the end, and the samples
needed to reach the synchronous run's final test loss (from the loss
measured every 10 steps on rank 0's copy of the model).
"""

import argparse
import time

import torch

import gyre.torch as hvd

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


def run(mode, steps, slow, test):
    rank, size = hvd.rank(), hvd.size()
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if mode == "sync":
        opt = hvd.DistributedOptimizer(inner, named_parameters=net.named_parameters())
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    else:
        staleness = {"s0": 0, "s2": 2, "s8": 8, "async": None}[mode]
        opt = hvd.AsyncOptimizer(inner, net.named_parameters(), staleness=staleness)
    x, y = teacher_data(100 + rank, steps * BATCH)
    loss_fn = torch.nn.CrossEntropyLoss()
    curve = []  # (samples processed by all ranks, test loss)
    hvd.barrier()
    start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(net(x[step * BATCH:(step + 1) * BATCH]), y[step * BATCH:(step + 1) * BATCH]).backward()
        opt.step()
        if slow and rank == size - 1:
            time.sleep(time.perf_counter() - t0)
        if rank == 0 and step % 10 == 9:
            with torch.no_grad():
                test_loss = loss_fn(net(test[0]), test[1]).item()
            samples = (step + 1) * BATCH * size if mode == "sync" else sum(opt.clock()) * BATCH
            curve.append((samples, test_loss))
    elapsed = time.perf_counter() - start
    hvd.barrier()
    if mode != "sync":
        opt.close()
    with torch.no_grad():
        final = loss_fn(net(test[0]), test[1]).item()
    return steps / elapsed, final, curve


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--modes", default="sync,s0,s2,s8,async")
    a = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    test = teacher_data(99, 2000)
    if hvd.rank() == 0:
        print(f"# {hvd.size()} ranks, {a.steps} steps of batch {BATCH} per rank; slowed: the last rank 2x")
        print(f"{'mode':>6} {'slowed':>6} {'steps/s':>8} {'rel':>6} {'test_loss':>9} {'samples_to_sync_loss':>21}")
    reference = None
    for mode in a.modes.split(","):
        base_rate = None
        for slow in (False, True):
            rate, final, curve = run(mode, a.steps, slow, test)
            if hvd.rank() != 0:
                continue
            if mode == "sync" and not slow:
                reference = final
            base_rate = rate if not slow else base_rate
            reach = "-"
            if reference is not None:
                hit = [s for s, l in curve if l <= reference]
                reach = str(hit[0]) if hit else f">{curve[-1][0]}"
            print(f"{mode:>6} {str(slow):>6} {rate:8.1f} {rate / base_rate:6.2f} {final:9.4f} {reach:>21}",
                  flush=True)


if __name__ == "__main__":
    main()
