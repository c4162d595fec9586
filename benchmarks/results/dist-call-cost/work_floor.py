"""A GyreWork and its wait() over an operation that is already done, against
a bare torch.distributed.Work subclass: what the Work itself costs in Python
(no MPI, no gyre runtime). python3 work_floor.py"""
import time

import torch
import torch.distributed as dist

from gyre.torch.distributed._work import GyreWork


class Done:
    __slots__ = ()

    def wait(self):
        return None

    def poll(self):
        return True


class Bare(dist.Work):
    __slots__ = ()


def timeit(f, n=50000):
    for _ in range(500):
        f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


t = torch.ones(2)
pending = Done()
print(f"GyreWork([done], finish).wait()  {timeit(lambda: GyreWork([pending], lambda: [t]).wait()):.2f} us")
print(f"a bare dist.Work subclass        {timeit(Bare):.2f} us")
