"""A DDP communication hook that allreduces each gradient bucket on gyre
under a name of its own (the bucket's index), instead of the process
group's per-call name.

The process group names every collective by its position in the group's
call sequence ("torch.<group>.<seq>"), which is what pairs them across ranks;
gyre's response cache takes such a call as a hit only when the call before
it was agreed before it was enqueued, which DDP's buckets, reduced while
backward goes on, often are not: those travel as full requests and their
round is the full exchange (an allgather: N-1 messages per rank and part).
Under this hook bucket k of every step is the operation
"ddp.<group>.<prefix>.bucket.<k>", the same request each step: from the
third step on (DDP rebuilds its buckets after the first) it is a cache bit,
the round is decided
in ceil(log2 N) messages, and a small bucket travels inside the round
(docs/architecture.md, "Rounds in log depth").

    model = DistributedDataParallel(model)
    model.register_comm_hook(None, gyre.torch.distributed.allreduce_hook)

The result is DDP's average, computed as torch's own allreduce_hook does:
each bucket divided by the group's size, then summed. On 2 ranks that is
bit for bit DDP without the hook; on more, equal to rounding (the sums of 3
or more ranks may be added in another order, as any two reductions of
different bucket layouts are). Every rank must register the hook (torch
requires the same of any hook); a process that trains several DDP models at
once gives each its own prefix: ``register_comm_hook(BucketNames("enc"),
allreduce_hook)``. A bucket is checked across the ranks as any gyre
operation is: the same name with another size or dtype is a MismatchError.
"""

from typing import Any, Optional

import torch
import torch.distributed as dist

from gyre import _gyre
from gyre.ops import ReduceOp as _GyreOp

from ._process_group import GyreProcessGroup


class BucketNames:
    """The hook's state: the process group whose ranks reduce the buckets
    (default: the default group) and a prefix that tells apart the buckets
    of several DDP models of one process."""

    __slots__ = ("_prefix", "_pg", "_base")

    def __init__(self, prefix: str = "ddp", process_group: Optional[Any] = None) -> None:
        self._prefix = str(prefix)
        self._pg = process_group
        self._base: Optional[str] = None

    def group(self) -> GyreProcessGroup:
        pg = self._pg if self._pg is not None else dist.distributed_c10d._get_default_group()
        if not isinstance(pg, GyreProcessGroup):
            raise ValueError(f"gyre's allreduce_hook: the process group is {type(pg).__name__}, "
                             "not one of the gyre backend (init_process_group(\"gyre\"))")
        return pg

    def name(self, pg: GyreProcessGroup, index: int) -> str:
        if self._base is None:
            self._base = f"ddp.{pg._tag}.{self._prefix}.bucket."
        return self._base + str(index)


_default_names = BucketNames()


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's allreduce of one gradient bucket (the average over the group)
    on gyre, named by the bucket's index. ``state``: None (the default group,
    prefix "ddp"), a BucketNames, or a gyre process group (as torch's
    default hooks take one)."""
    if state is None:
        names = _default_names
    elif isinstance(state, BucketNames):
        names = state
    elif isinstance(state, GyreProcessGroup):
        names = BucketNames(process_group=state)
    else:
        raise TypeError(f"gyre's allreduce_hook: state must be None, a BucketNames or a gyre "
                        f"process group, not {type(state).__name__}")
    pg = names.group()
    buf = bucket.buffer()
    # DDP's average as torch's allreduce_hook computes it: divided by the
    # group's size first (no overflow of a 16-bit sum), then summed. By a
    # power of two the division is exact, the same bits as gyre's prescale,
    # which the reduction applies as it reads the bucket (no pass of its own).
    size = pg.size()
    prescale = 1.0
    if size & (size - 1) == 0:
        prescale = 1.0 / size
    else:
        buf.div_(size)
    pending = _gyre.allreduce(names.name(pg, bucket.index()), buf, None, int(_GyreOp.SUM),
                              prescale, 1.0, "", pg._ps)
    future: torch.futures.Future = torch.futures.Future()

    def done() -> None:
        try:
            pending.wait()  # returns at once, or raises the operation's error
        except BaseException as e:  # noqa: BLE001 - the error belongs to DDP's wait
            future.set_exception(e)
            return
        future.set_result(buf)

    pending.add_done_callback(done)
    return future
