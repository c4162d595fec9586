#!/usr/bin/env python3
"""Partial participation against a persistent straggler: each rank's own pace.

    mpirun -np 3 python3 benchmarks/partial_straggler.py --out partial_straggler.json

Every rank trains the same small MLP (regression on its own synthetic
batches) for --steps inner steps. The last rank is the straggler: with
--slow F (default 2) it sleeps after each step for (F - 1) times the step's
own compute time, so its steps take about F times as long. Each mode runs
twice in the same job, without the straggler and with it:

  local         gyre.torch.LocalSGD(period=H): a collective round every H
                steps, which every rank waits for
  partial       gyre.torch.PartialLocalSGD(period=H, late_after_s=L,
                max_staleness=S): a round closes L s after its first on-time
                contribution without the late rank, whose contribution is
                merged into a later round (or rejected beyond S rounds)
  streaming     the same with fragments=2, sync_delay=1: each fragment's
                round staggered over the period, merged a step after its
                post

The clock is each rank's own: the time from its first step to the end of its
last step() (close(), which waits for every rank, is not in it), so a fast
rank that does not wait for the straggler shows its own pace. Reported per
mode: the fast ranks' steps per second with the straggler over without it
("kept"; the issue's target for the other modes is >= 0.9), the straggler's
own, and the counters (rounds, late contributions merged and rejected, rounds
a rank arrived at late). All ranks share the machine's cores: run with
--threads 1 (the default) and as many cores as ranks where possible; on 2
cores the 3 ranks' compute competes, which the unslowed run measures too.
"""
import argparse
import json
import sys
import time

import torch

import gyre
import gyre.torch as hvd


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--period", type=int, default=8)
    p.add_argument("--slow", type=float, default=2.0, help="the straggler's step time factor")
    p.add_argument("--late-after", type=float, default=0.05, help="PartialLocalSGD late_after_s")
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", default="local,partial,streaming")
    p.add_argument("--out", default=None)
    return p.parse_args()


def new_model(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, 1))


def make_opt(mode, model, a):
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if mode == "local":
        return hvd.LocalSGD(inner, model, period=a.period)
    kw = dict(period=a.period, late_after_s=a.late_after, max_staleness=a.max_staleness,
              timeout_s=300.0)
    if mode == "streaming":
        kw.update(fragments=2, sync_delay=1)
    return hvd.PartialLocalSGD(inner, model, **kw)


def run(mode, slowed, a):
    rank, size = hvd.rank(), hvd.size()
    straggler = slowed and rank == size - 1
    model = new_model(a.width)
    opt = make_opt(mode, model, a)
    g = torch.Generator().manual_seed(1000 * rank + 7)
    xs = torch.randn(16, a.batch, 64, generator=g)
    ys = torch.sin(xs.sum(dim=2, keepdim=True))
    hvd.barrier()
    start = time.perf_counter()
    for step in range(a.steps):
        t0 = time.perf_counter()
        x, y = xs[step % 16], ys[step % 16]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        compute = time.perf_counter() - t0
        if straggler:
            time.sleep((a.slow - 1.0) * compute)
        opt.step()
    elapsed = time.perf_counter() - start
    counters = {}
    if mode != "local":
        counters = opt.counters()
        opt.close()
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model(xs[0]), ys[0]))
    return {"rank": rank, "steps_per_s": a.steps / elapsed, "elapsed_s": elapsed,
            "straggler": straggler, "loss": loss,
            "counters": {k: v for k, v in counters.items() if not isinstance(v, list)}}


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    hvd.init()
    if hvd.size() < 2:
        sys.exit("partial_straggler.py: needs at least 2 ranks")
    results = {}
    for mode in a.modes.split(","):
        for slowed in (False, True):
            mine = run(mode, slowed, a)
            every = gyre.allgather_object(mine, name=f"bench.{mode}.{int(slowed)}")
            results[f"{mode}{'-slowed' if slowed else ''}"] = every
    if hvd.rank() == 0:
        n = hvd.size()
        print(f"# {n} ranks, {a.steps} steps, period {a.period}, the last rank {a.slow:g}x "
              f"slower, late_after_s {a.late_after:g}, max_staleness {a.max_staleness}")
        print("| mode | fast ranks, steps/s alone | with the straggler | kept | straggler steps/s "
              "| rounds | merged late | rejected | rounds late (fast, straggler) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for mode in a.modes.split(","):
            base, slow = results[mode], results[f"{mode}-slowed"]
            fast_base = [r["steps_per_s"] for r in base[:n - 1]]
            fast_slow = [r["steps_per_s"] for r in slow[:n - 1]]
            kept = min(s / b for s, b in zip(fast_slow, fast_base))
            c = slow[n - 1]["counters"]
            late_fast = sum(r["counters"].get("rounds_late", 0) for r in slow[:n - 1])
            print(f"| {mode} | {min(fast_base):.1f}-{max(fast_base):.1f} | "
                  f"{min(fast_slow):.1f}-{max(fast_slow):.1f} | {kept:.2f} | "
                  f"{slow[n - 1]['steps_per_s']:.1f} | {c.get('rounds', '-')} | "
                  f"{c.get('merged_late', '-')} | {c.get('rejected', '-')} | "
                  f"{late_fast}, {c.get('rounds_late', '-')} |")
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"args": vars(a), "results": results}, f, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
