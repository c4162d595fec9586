"""Where one dist.all_reduce on the gyre backend spends its time, at one rank
(no peer to wait for): each layer timed alone, best of 5 loops of 20,000
calls of an 8-byte float32 tensor; and the Work's floor: a GyreWork and its
wait() over an operation that is already done, against a bare
torch.distributed.Work subclass.

    mpirun --allow-run-as-root -np 1 python3 breakdown_1rank.py
"""
import gc
import itertools
import os
import time

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
import torch
import torch.distributed as dist

import gyre.torch as gt
import gyre.torch.distributed  # noqa: F401  (registers the "gyre" backend)
from gyre import _gyre
from gyre.torch.distributed._arguments import _reduce_op, _tensor_refusal
from gyre.torch.distributed._process_group import GyreProcessGroup
from gyre.torch.distributed._work import GyreWork

gt.init()
dist.init_process_group("gyre", rank=gt.rank(), world_size=gt.size())
be = [o for o in gc.get_objects() if isinstance(o, GyreProcessGroup)][0]
t = torch.ones(2)
seq = itertools.count()
gop, pre, _ = _reduce_op(dist.ReduceOp.SUM)


def timeit(f, n=20000):
    for _ in range(500):
        f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


class Done:  # an operation that has completed
    __slots__ = ()

    def wait(self):
        return None

    def poll(self):
        return True


class Bare(dist.Work):
    __slots__ = ()


def start():  # the extension's call
    return _gyre.allreduce(f"s.{next(seq)}", t, None, gop, pre, 1.0, "", be._ps)


def done():  # and its wait, no Work
    p = start()
    p.wait()
    return p


rows = [
    ("dist.all_reduce", lambda: dist.all_reduce(t)),
    ("the process group's allreduce + Work.wait (no c10d)", lambda: be.allreduce([t]).wait()),
    ("the extension's allreduce + wait", done),
    ("  the same waited through a GyreWork", lambda: GyreWork([start()], lambda: [t]).wait()),
    ("gyre.torch.allreduce_", lambda: gt.allreduce_(t, op=gt.Sum, name="x")),
    ("_tensor_refusal", lambda: _tensor_refusal([t], "allreduce")),
    ("_reduce_op", lambda: _reduce_op(dist.ReduceOp.SUM)),
    ("_name", lambda: be._name()),
    ("GyreWork([done], finish).wait()", lambda: GyreWork([Done()], lambda: [t]).wait()),
    ("a bare dist.Work subclass", Bare),
]
for what, f in rows:
    print(f"{what:55s} {timeit(f):6.2f} us")
