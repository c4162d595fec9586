"""Horovod's init(comm=[ranks]): gyre on a subset of the launched ranks.

    mpirun -np 3 python tests/python/init_subset.py   (or -np 4)

Round 1: the listed ranks (the last and 0, and 2 with -np 4, listed in
descending order so that gyre's ranks are not MPI_COMM_WORLD's) run gyre
alone: size, ranks in the list's order, local and cross ranks within them,
allreduce, allgather, broadcast, barrier, join, broadcast_object and a
process set (of the subset's ranks) with values checked, init() with another list refused while
running, then shutdown(). Rank 1, outside the list, calls init() with the
same list and gets InvalidArgumentError (a ValueError) at once, gyre staying
uninitialised there. Then every rank runs init() without comm: the whole
world again. Round 2 restricts to ranks [0, 1] (a world whose layout is
known; the ranks outside call nothing), then the whole world once more.

Exits non-zero (naming what went wrong) on any failure; mpirun's timeout
bounds a hang.
"""

import os
import sys
import time

import torch

import gyre.torch as hvd

world_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
if world_size < 3:
    sys.exit("init_subset.py needs mpirun -np 3 or more")


def check(cond, what):
    if not cond:
        raise AssertionError(f"world rank {world_rank}: {what}")


def run_on(listed, outsiders_call_init, outsider_refused_within_s=10.0):
    if world_rank not in listed and not outsiders_call_init:
        return  # as in Horovod, the ranks outside need not call anything
    if world_rank not in listed:
        started = time.monotonic()
        try:
            hvd.init(comm=listed)
        except ValueError as e:
            check(isinstance(e, hvd.InvalidArgumentError), f"not InvalidArgumentError: {e!r}")
            check("not among ranks" in str(e), f"the error does not say why: {e}")
        else:
            raise AssertionError(f"world rank {world_rank}: init(comm={listed}) was accepted "
                                 f"on a rank outside the list")
        took = time.monotonic() - started
        check(took < outsider_refused_within_s, f"the refusal took {took:.1f} s")
        check(not hvd.is_initialized(), "is_initialized() after a refused init(comm)")
        return
    hvd.init(comm=listed)
    me, n = listed.index(world_rank), len(listed)
    check(hvd.is_initialized(), "not initialised")
    check((hvd.size(), hvd.rank()) == (n, me), f"size, rank {hvd.size()}, {hvd.rank()}")
    # One host: every listed rank is local, none is across.
    check((hvd.local_size(), hvd.local_rank()) == (n, me),
          f"local size, rank {hvd.local_size()}, {hvd.local_rank()}")
    check((hvd.cross_size(), hvd.cross_rank()) == (1, 0),
          f"cross size, rank {hvd.cross_size()}, {hvd.cross_rank()}")
    total = hvd.allreduce(torch.tensor([float(world_rank), 1.0]), op=hvd.Sum)
    check(total.tolist() == [float(sum(listed)), float(n)], f"allreduce {total.tolist()}")
    gathered = hvd.allgather(torch.tensor([world_rank]))
    check(gathered.tolist() == listed, f"allgather {gathered.tolist()}")
    got = hvd.broadcast(torch.tensor([world_rank * 10]), root_rank=1)
    check(got.tolist() == [listed[1] * 10], f"broadcast {got.tolist()}")
    hvd.barrier()
    obj = hvd.broadcast_object({"from": world_rank}, root_rank=n - 1)
    check(obj == {"from": listed[-1]}, f"broadcast_object {obj}")
    check(hvd.join() in range(n), "join() returned a rank outside the subset")
    # A process set of the subset's ranks 1 and up (ranks of the subset).
    tail = hvd.add_process_set(list(range(1, n)))
    if me >= 1:
        got = hvd.allreduce(torch.tensor([float(world_rank)]), op=hvd.Sum, process_set=tail)
        check(got.item() == sum(listed[1:]), f"process set allreduce {got.item()}")
    hvd.remove_process_set(tail)
    hvd.init(comm=listed)  # the same list while running: nothing
    try:
        hvd.init(comm=list(range(world_size)))
    except ValueError as e:
        check("runs already" in str(e), f"the error does not say why: {e}")
    else:
        raise AssertionError("init(comm) with other ranks while running was accepted")
    check(hvd.size() == n, "a refused init(comm) changed the size")
    hvd.shutdown()


def run_on_all():
    hvd.init()
    check((hvd.size(), hvd.rank()) == (world_size, world_rank),
          f"whole world: size, rank {hvd.size()}, {hvd.rank()}")
    check((hvd.local_size(), hvd.local_rank()) == (world_size, world_rank),
          f"whole world: local size, rank {hvd.local_size()}, {hvd.local_rank()}")
    total = hvd.allreduce(torch.tensor([float(world_rank)]), op=hvd.Sum)
    check(total.item() == world_size * (world_size - 1) / 2, f"whole world: allreduce {total}")
    check(hvd.allgather(torch.tensor([world_rank])).tolist() == list(range(world_size)),
          "whole world: allgather")
    hvd.shutdown()


first = sorted([0, world_size - 1] + ([2] if world_size >= 4 else []), reverse=True)
run_on(first, outsiders_call_init=True)
run_on_all()
run_on([0, 1], outsiders_call_init=False)
run_on_all()
print(f"world rank {world_rank}: ok", flush=True)
