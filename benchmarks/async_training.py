"""Synchronous against asynchronous and bounded-staleness training on gyre
(docs/training-modes.md): throughput of the ranks when one rank is slower,
and loss against samples processed. Run under mpirun:

    mpirun -np 2 python3 benchmarks/async_training.py [--steps 300] [--modes sync,s0,s2,s8,async]
        [--async-factor 2] [--lrs 0.025,0.05,0.1] [--runs fast|slowed|both] [--op average|sum]

The task: a 10-class classifier (MLP 64-512-10, batch 128 per rank, SGD with
momentum 0.9) on data labelled by a fixed random teacher network with noise;
every rank draws its own batches (fixed seeds, --seed shifts them). A mode
runs with every rank at full speed ("fast") and/or with the last rank slowed
2x ("slowed": it sleeps as long as its step computed). The synchronous mode
(DistributedOptimizer) runs --steps steps per rank; the asynchronous ones
(AsyncOptimizer with staleness 0, 2, 8 and None; "s0apply": staleness 0
with policy "apply", the clock's bound without rejections) run --async-factor times as
many, so that the samples they need to reach the target can be measured when
it is more than the synchronous run processed.

Samples: the synchronous run processes batch x ranks per step. An
asynchronous run counts the steps every rank had completed by the clock
pulled with the parameters (AsyncOptimizer.pulled_clock), x batch; pushes the
store rejected (staleness 0, "reject") count as processed. The test loss is
taken on rank 0's parameters every 10 of its steps, and once more at the end
on the store's values after every rank stopped.

A line per run as it ends: rank 0's steps/s, for a slowed run that rate over
the same mode's fast run ("kept"), the share of rank 0's time spent waiting
for the slowest rank (AsyncOptimizer.waited_s: the clock's bound), the last rank's steps/s (the slowed one's
in a slowed run; each rate is its rank's steps over its own time), the pushes the store rejected (per
shard), the final test loss and the samples processed. Then, from the
curves, samples to the target: the target is the final test loss of the
synchronous fast run (with several --lrs, the lowest among them);
to_target is the samples at the first evaluation at or below it; ratio is
that over the synchronous mode's own (its best over the same --lrs, so
every mode gets the same search budget); met: ratio <= 1.10. A loss
measured at one point is noisy (SGD's fluctuation, where the curve is
flat near the end, moves the first crossing by many samples), so the same
table follows for the curves smoothed over 5 evaluations (each point the
mean of the last 5 up to it, the target the synchronous run's last
smoothed value). --curves writes every curve to a JSON file.
"""

import argparse
import json
import time

import torch

import gyre
import gyre.torch as hvd
from async_task import BATCH, model, reach, smoothed, teacher_data

# mode -> (staleness, policy; None: AsyncOptimizer's default, "reject" at 0, else "apply")
MODES = {"s0": (0, None), "s0apply": (0, "apply"), "s2": (2, None), "s8": (8, None),
         "async": (None, None)}


def run(mode, steps, slow, test, lr, momentum, op, seed):
    rank, size = hvd.rank(), hvd.size()
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    if mode == "sync":
        opt = hvd.DistributedOptimizer(inner, named_parameters=net.named_parameters())
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    else:
        staleness, policy = MODES[mode]
        opt = hvd.AsyncOptimizer(inner, net.named_parameters(), staleness=staleness, policy=policy,
                                 op=op)
    x, y = teacher_data(100 + rank + 1000 * seed, steps * BATCH)
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
            samples = (step + 1) * BATCH * size if mode == "sync" else sum(opt.pulled_clock()) * BATCH
            curve.append((samples, test_loss))
    elapsed = time.perf_counter() - start
    rates = hvd.allgather(torch.tensor([steps / elapsed], dtype=torch.float64))
    hvd.barrier()
    if mode != "sync":
        opt.pull()  # the store's values once every rank has pushed its last update
        rejected, waited = opt.updates_rejected, opt.waited_s
        opt.close()
    else:
        rejected, waited = 0, 0.0
    with torch.no_grad():
        final = loss_fn(net(test[0]), test[1]).item()
    if curve and curve[-1][0] == steps * BATCH * size:
        curve[-1] = (steps * BATCH * size, final)
    else:
        curve.append((steps * BATCH * size, final))
    return steps / elapsed, float(rates[-1]), final, curve, rejected, waited / elapsed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300, help="synchronous steps per rank")
    p.add_argument("--async-factor", type=float, default=1.0,
                   help="the asynchronous modes run this many times --steps")
    p.add_argument("--modes", default="sync,s0,s2,s8,async")
    p.add_argument("--lrs", default="0.05", help="learning rates, each mode runs each")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--op", default="average", choices=("average", "sum"),
                   help="AsyncOptimizer's op: each push divided by the ranks, or not")
    p.add_argument("--runs", default="both", choices=("fast", "slowed", "both"))
    p.add_argument("--seed", type=int, default=0, help="shifts the training data's seeds")
    p.add_argument("--curves", help="write every run's (samples, test loss) curve to this JSON file")
    a = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    test = teacher_data(99, 2000)
    modes = a.modes.split(",")
    lrs = [float(v) for v in a.lrs.split(",")]
    op = gyre.Average if a.op == "average" else gyre.Sum
    slows = {"fast": (False,), "slowed": (True,), "both": (False, True)}[a.runs]
    async_steps = int(round(a.steps * a.async_factor))
    if hvd.rank() == 0:
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        print(f"# {hvd.size()} ranks, batch {BATCH} per rank; sync {a.steps} steps, async {async_steps} "
              f"steps per rank; momentum {a.momentum}; AsyncOptimizer op={a.op}; data seed {a.seed}; "
              f"slowed: the last rank 2x; load average {' '.join(load)}")
        print(f"{'mode':>7} {'lr':>6} {'slowed':>6} {'steps/s':>8} {'kept':>5} {'waited':>6} {'last_rank':>9} {'rejected':>8} "
              f"{'test_loss':>9} {'samples':>8}", flush=True)
    runs = []  # (mode, lr, slow, curve)
    for mode in modes:
        for lr in lrs:
            fast_rate = None
            for slow in slows:
                steps = a.steps if mode == "sync" else async_steps
                rate, last_rate, final, curve, rejected, waited = run(mode, steps, slow, test, lr, a.momentum, op, a.seed)
                if hvd.rank() != 0:
                    continue
                runs.append((mode, lr, slow, curve))
                if not slow:
                    fast_rate = rate
                kept = f"{rate / fast_rate:5.2f}" if slow and fast_rate else "-"
                print(f"{mode:>7} {lr:6g} {str(slow):>6} {rate:8.1f} {kept:>5} {waited:6.2f} {last_rate:9.1f} "
                      f"{rejected:8d} {final:9.4f} {curve[-1][0]:8d}", flush=True)
    if hvd.rank() != 0:
        return
    if a.curves:
        with open(a.curves, "w") as f:
            json.dump([{"mode": m, "lr": lr, "slowed": sl, "curve": c} for m, lr, sl, c in runs], f)
    sync = [(lr, c) for m, lr, sl, c in runs if m == "sync" and not sl]
    if not sync:
        return
    for name, smooth in (("raw", False), ("smoothed over 5 evaluations", True)):
        curves = [(m, lr, sl, smoothed(c) if smooth else c) for m, lr, sl, c in runs]
        target, target_lr = min((c[-1][1], lr) for m, lr, sl, c in curves if m == "sync" and not sl)
        # The synchronous mode's samples to the target: its best over the same lrs.
        base = min(s for s in (reach(c, target) for m, lr, sl, c in curves if m == "sync" and not sl)
                   if s is not None)
        print(f"# samples to the target ({name}): the synchronous final test loss {target:.4f} (lr "
              f"{target_lr:g}); the synchronous mode first reaches it at {base} samples (its best lr); "
              f"ratio = samples / {base}; met: ratio <= 1.10")
        print(f"# {'mode':>7} {'lr':>6} {'slowed':>6} {'to_target':>10} {'ratio':>6}")
        best = {}
        for m, lr, sl, c in curves:
            s = reach(c, target)
            ratio = f"{s / base:.2f}" if s is not None else f">{c[-1][0] / base:.2f}"
            print(f"# {m:>7} {lr:6g} {str(sl):>6} {str(s) if s is not None else '>' + str(c[-1][0]):>10} "
                  f"{ratio:>6}")
            if s is not None and ((m, sl) not in best or s < best[(m, sl)][0]):
                best[(m, sl)] = (s, lr)
        for m in modes:
            for sl in slows:
                if not any(r[0] == m and r[2] == sl for r in runs):
                    continue
                if (m, sl) in best:
                    s, lr = best[(m, sl)]
                    print(f"#   best {m:>7} slowed={str(sl):<5}: ratio {s / base:.2f} at lr {lr:g}"
                          f"{'  (met)' if s / base <= 1.10 else '  (not met)'}")
                else:
                    print(f"#   best {m:>7} slowed={str(sl):<5}: not reached at any lr  (not met)")

if __name__ == "__main__":
    main()
