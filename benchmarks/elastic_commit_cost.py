"""Cost of gyre.torch.elastic.TorchState.commit() for a ResNet-50-sized
state (docs/elastic.md, docs/benchmarks.md): the model's parameters (one
tensor per line of benchmarks/data/resnet50_sizes.txt, 25,557,032 float32
elements in 161 tensors) and SGD's momentum buffers of the same shapes.
The copy's cost depends only on the bytes and the number of tensors, so the
tensors are flat. Prints the median and the range of the commit time over
the runs; compare with the step time of the ResNet-50 gradient set through
gyre (gyre-allreduce-perf --gradients benchmarks/data/resnet50_sizes.txt).

Usage: mpirun -n 1 python benchmarks/elastic_commit_cost.py [RUNS] [SIZES]
(one rank is enough: commit() is local, gyre.commit_step() is a counter).
"""
import os
import statistics
import sys
import time

import torch

import gyre.torch as hvd


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "data", "resnet50_sizes.txt")
    with open(path) as f:
        sizes = [int(line) for line in f if line.strip() and not line.startswith("#")]
    hvd.init()
    model = torch.nn.Module()
    model.params = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(n)) for n in sizes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # creates the momentum buffers
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        state.commit()
        times.append((time.perf_counter() - t0) * 1e3)
    # The committed copy must be the state (not a view of it): a later step
    # must not change it, and restore() must bring the committed values back.
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    state.restore()
    if not all(torch.equal(a, p) for a, p in zip(before, model.parameters())):
        raise SystemExit("elastic_commit_cost: restore() did not return to the commit")
    n = sum(sizes)
    mib = 2 * n * 4 / 2**20
    print(f"TorchState.commit(): {len(sizes)} tensors, {n} parameters + momentum "
          f"({mib:.0f} MiB), torch threads {torch.get_num_threads()}, {runs} runs: "
          f"median {statistics.median(times):.1f} ms, min {min(times):.1f}, max {max(times):.1f}; "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
