"""Cost of gyre.torch.elastic.TorchState.commit() for a ResNet-50-sized
state (docs/elastic.md, docs/benchmarks.md): the model's parameters (one
tensor per line of benchmarks/data/resnet50_sizes.txt, 25,557,032 float32
elements in 161 tensors) and SGD's momentum buffers of the same shapes.
The copy's cost depends only on the bytes and the number of tensors, so the
tensors are flat.

Each step allreduces the gradient set through gyre (one allreduce_async_ per
tensor, as DistributedOptimizer does, then waits for all), then calls
optimizer.step(), then commit(). Three loops of RUNS steps each:
  - no commit: the step alone (the reference);
  - commit, waited for: commit() then TorchState.wait_for_commit() at once,
    i.e. the copy on the caller's thread;
  - commit in the background (what commit() does): the copy runs during the
    next step's allreduces; optimizer.step() waits for what is left of it.
Prints, per loop, the median step time (and min/max); for the background
loop also the time commit() itself takes and the time optimizer.step()
waited for the copy (both on the step's critical path), and the step's
overhead against the reference.

Usage: mpirun [--with-ft ulfm] -n 2 python benchmarks/elastic_commit_cost.py [RUNS] [SIZES]
"""
import os
import statistics
import sys
import time

import torch

import gyre.torch as hvd


def fmt(ts):
    return (f"median {statistics.median(ts):.1f} ms (min {min(ts):.1f}, max {max(ts):.1f})")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "data", "resnet50_sizes.txt")
    with open(path) as f:
        sizes = [int(line) for line in f if line.strip() and not line.startswith("#")]
    hvd.init()
    model = torch.nn.Module()
    model.params = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(n)) for n in sizes)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-6, momentum=0.9)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()  # creates the momentum buffers
    state = hvd.elastic.TorchState(model, opt, epoch=0)

    waits = []
    orig_wait = state.wait_for_commit

    def timed_wait():
        t = time.perf_counter()
        orig_wait()
        waits.append((time.perf_counter() - t) * 1e3)

    def step(i):
        handles = [hvd.allreduce_async_(p.grad, name=f"grad.{k}", op=hvd.Sum)
                   for k, p in enumerate(params)]
        for h in handles:
            hvd.synchronize(h)
        opt.step()

    def loop(mode):
        steps, commits = [], []
        for i in range(runs + 2):  # two warm-up steps
            t0 = time.perf_counter()
            step(i)
            if mode != "none":
                t1 = time.perf_counter()
                state.commit()
                if mode == "waited":
                    state.wait_for_commit()
                if i >= 2:
                    commits.append((time.perf_counter() - t1) * 1e3)
            if i >= 2:
                steps.append((time.perf_counter() - t0) * 1e3)
        state.wait_for_commit()
        return steps, commits

    load0 = open("/proc/loadavg").read().split()[0]
    base, _ = loop("none")
    waited, waited_commit = loop("waited")
    state.wait_for_commit = timed_wait  # optimizer.step()'s pre-hook calls it
    waits.clear()
    background, bg_commit = loop("background")
    state.wait_for_commit = orig_wait
    # Per step: optimizer.step()'s pre-hook waits, then commit()'s own wait
    # (nothing left by then). The first two steps warm up.
    step_waits = waits[4:2 * (runs + 2):2]

    # The commit must be the state at commit(), not a view of it: a later
    # step must not change it, and restore() must bring its values back.
    before = [p.detach().clone() for p in params]
    state.commit()
    step(0)
    state.restore()
    if not all(torch.equal(a, p) for a, p in zip(before, params)):
        raise SystemExit("elastic_commit_cost: restore() did not return to the commit")
    if hvd.rank() == 0:
        n = sum(sizes)
        mib = 2 * n * 4 / 2**20
        med = statistics.median
        print(f"TorchState.commit(): {len(sizes)} tensors, {n} parameters + momentum "
              f"({mib:.0f} MiB), {hvd.size()} ranks, torch threads {torch.get_num_threads()}, "
              f"{runs} steps per loop; load average {load0} before, "
              f"{open('/proc/loadavg').read().split()[0]} after")
        print(f"  step without commit:              {fmt(base)}")
        print(f"  step + commit copied at once:     {fmt(waited)}; the commit {fmt(waited_commit)}")
        print(f"  step + commit in the background:  {fmt(background)}; commit() {fmt(bg_commit)}, "
              f"optimizer.step() waited {fmt(step_waits)}")
        print(f"  overhead of the background commit on the step: "
              f"{100 * (med(background) - med(base)) / med(base):+.1f} % (medians); "
              f"commit() + wait: {100 * (med(bg_commit) + med(step_waits)) / med(base):.1f} % "
              f"of the step")
    hvd.shutdown()


if __name__ == "__main__":
    main()
