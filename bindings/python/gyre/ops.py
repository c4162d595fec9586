"""gyre's collectives with Horovod's names, for torch tensors, numpy arrays and
any DLPack producer.

Every ``*_async`` call converts its arguments, has the runtime check them on
the calling thread, enqueues the operation and returns a :class:`Handle` at
once. A call refused on one rank (a bad dtype, root, split, op, ...) raises
InvalidArgumentError there and is announced to the other ranks: their
operation of the same name raises it too, at once. ``synchronize(handle)``
waits (with the GIL released) and returns the result, raising the operation's
error as a :class:`gyre.GyreError` subclass. The memory of every tensor passed
in is kept alive by gyre until the operation completes, even if the handle is
dropped; in-place operations (names ending in ``_``) must not have their
tensor modified or resized before ``synchronize`` returns.

Names identify an operation across ranks: every rank must use the same name
for the same operation. When ``name`` is omitted one is generated from a
counter per operation kind ("allreduce.noname.0", ...), so ranks match as
long as they issue unnamed operations of a kind in the same order. A call
consumes its generated name even when it is refused, so a call refused on one
rank only does not shift that rank's later names against the other ranks'.
"""

import enum
import threading
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Type, Union

from . import _gyre
from . import _tensors as _t
from .compression import Compression, Compressor
from .exceptions import InvalidArgumentError

# A torch tensor, a numpy array or any other DLPack or buffer-protocol
# producer; results come back in the caller's framework (see _tensors).
Tensor = Any
Op = Union["ReduceOp", int]


class ReduceOp(enum.IntEnum):
    """Reduction operations; the values are the runtime's gyre::ReduceOp."""

    SUM = 0
    AVERAGE = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

_name_lock = threading.Lock()  # guards _name_counters
_name_counters = {}


def _op_name(kind, name):
    """The operation's name: `name`, or the next generated one of `kind`.

    Called first thing in every operation, before any check that can refuse
    the call: a generated name is consumed whatever becomes of the call, so
    the counters advance alike on every rank even when a call is refused on
    one rank only (its refusal reaches the other ranks' call of that name),
    and later unnamed calls keep pairing with each other."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{kind}: name must be a non-empty string, got {name!r}")
        return name
    with _name_lock:
        n = _name_counters.get(kind, 0)
        _name_counters[kind] = n + 1
    return f"{kind}.noname.{n}"


def _reduce_op(average: Optional[bool], op: Optional[Op]) -> ReduceOp:
    """Horovod's average= and op= as one ReduceOp; raises InvalidArgumentError."""
    if average is not None and op is not None:
        raise InvalidArgumentError("pass either average= or op=, not both")
    if average is not None:
        return Average if average else Sum
    if op is None:
        return Average
    try:
        return ReduceOp(op)
    except ValueError:
        raise InvalidArgumentError(
            f"unknown reduction op {op!r} (expected gyre.Average, Sum, Min, Max or Product)"
        ) from None


def _op(c: _t.Conversion, average: Optional[bool], op: Optional[Op]) -> int:
    """_reduce_op for a call: a failure becomes the call's refusal."""
    try:
        return int(_reduce_op(average, op))
    except InvalidArgumentError as e:
        c.refuse(str(e))
        return int(Average)


def _scales(c: _t.Conversion, prescale_factor: Any, postscale_factor: Any) -> Tuple[float, float]:
    return c.number(prescale_factor, "prescale_factor"), c.number(postscale_factor,
                                                                  "postscale_factor")


class Handle:
    """An enqueued operation: pass it to :func:`poll` or :func:`synchronize`."""

    __slots__ = ("name", "_op", "_finish", "_guards", "_result", "_done")

    def __init__(self, name: str, op: Any, finish: Callable[[Any], Any],
                 guards: Iterable[Any] = ()) -> None:
        self.name = name
        self._op = op
        self._finish = finish
        self._guards = list(guards)
        self._done = False
        self._result = None

    def __repr__(self) -> str:
        return f"<gyre.Handle {self.name!r} {'done' if self.poll() else 'pending'}>"

    def poll(self) -> bool:
        return self._done or self._op.poll()

    def wait(self) -> Any:
        return synchronize(self)


def poll(handle: Handle) -> bool:
    """True once the operation of `handle` has completed (successfully or not)."""
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Waits for the operation and returns its result (raises its error)."""
    if not isinstance(handle, Handle):
        raise InvalidArgumentError(f"synchronize() takes a gyre handle, got {type(handle).__name__}")
    if handle._done:
        return handle._result
    handle._op.wait()
    for g in handle._guards:
        g.check()
    handle._result = handle._finish(handle._op)
    handle._done = True
    handle._guards = []
    return handle._result


# Lifecycle and topology -------------------------------------------------------


def init() -> None:
    """Initialises MPI (if needed) and starts gyre's background thread.

    As in Horovod, init() may be called any number of times (while gyre runs,
    later calls do nothing) and again after shutdown(), which starts a new
    runtime on the same MPI (a new version vector; generated names go on)."""
    _gyre.init()


def shutdown() -> None:
    """Fails pending operations (on every rank) and stops the background
    thread; does nothing if gyre is not running. MPI stays initialised, so
    init() may follow; gyre finalises MPI at process exit if it initialised
    it. Also run at interpreter exit."""
    if _gyre.is_initialized():
        _gyre.shutdown()


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _gyre.is_initialized()


def rank() -> int:
    return _gyre.rank()


def size() -> int:
    return _gyre.size()


def local_rank() -> int:
    return _gyre.local_rank()


def local_size() -> int:
    return _gyre.local_size()


def cross_rank() -> int:
    """This rank's index among the ranks with its local rank (one per host that
    has that many ranks), in rank order."""
    return _gyre.cross_rank()


def cross_size() -> int:
    """How many ranks have this rank's local rank: the number of hosts that
    hold at least local_rank() + 1 ranks."""
    return _gyre.cross_size()


def barrier() -> None:
    """Blocks until every rank has called barrier()."""
    _gyre.barrier()


def join(device: int = -1) -> int:
    """This rank has no more data: it contributes zeros to other ranks'
    allreduces until every rank has joined. Returns the last rank to join.
    ``device`` is accepted for Horovod compatibility and ignored (CPU only)."""
    del device
    return _gyre.join()


def commit_step() -> None:
    """Counts one finished training step for the version vector
    (DistributedOptimizer.step() calls it)."""
    _gyre.commit_step()


def committed_steps() -> int:
    return _gyre.committed_steps()


def version_vector() -> List[int]:
    """This rank's view of every rank's committed step count, by rank."""
    return list(_gyre.version_vector())


# Allreduce ---------------------------------------------------------------------


def allreduce_async(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[Op] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0) -> Handle:
    """Reduces `tensor` across ranks into a new tensor (see synchronize)."""
    name = _op_name("allreduce", name)
    c = _t.Conversion()
    rop = _op(c, average, op)
    pre, post = _scales(c, prescale_factor, postscale_factor)
    x = c.array(_t.prepare(tensor))
    out = None if x is None else _t.empty_like(x)
    pending = _gyre.allreduce(name, x, out, rop, pre, post, c.refusal)
    return Handle(name, pending, lambda _: out, _t.guards_for(name, tensor))


def allreduce_async_(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[Op] = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0) -> Handle:
    """Reduces `tensor` across ranks in place; synchronize returns `tensor`."""
    name = _op_name("allreduce", name)
    c = _t.Conversion()
    rop = _op(c, average, op)
    pre, post = _scales(c, prescale_factor, postscale_factor)
    pending = _gyre.allreduce(name, _t.prepare(tensor), None, rop, pre, post, c.refusal)
    return Handle(name, pending, lambda _: tensor, _t.guards_for(name, tensor))


def allreduce(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Type[Compressor] = Compression.none, op: Optional[Op] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Tensor:
    """Returns a new tensor: `op` (default Average) of `tensor` over all ranks."""
    name = _op_name("allreduce", name)
    compressed, ctx = compression.compress(tensor)
    handle = allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(synchronize(handle), ctx)


def allreduce_(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[Op] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0) -> Tensor:
    """In-place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def _grouped(tensors, average, name, op, prescale_factor, postscale_factor, in_place):
    base = _op_name("grouped_allreduce", name)
    try:
        tensors = list(tensors)
    except TypeError:
        # Raised here: without tensors there are no names to announce it under.
        raise InvalidArgumentError(
            f"grouped_allreduce takes a sequence of tensors, got {type(tensors).__name__}") from None
    c = _t.Conversion()
    rop = _op(c, average, op)
    pre, post = _scales(c, prescale_factor, postscale_factor)
    if in_place:
        xs, outs = [_t.prepare(t) for t in tensors], None
    else:
        xs = [c.array(_t.prepare(t)) for t in tensors]
        outs = [None if x is None else _t.empty_like(x) for x in xs]
    names = [f"{base}.{i}" for i in range(len(tensors))]
    pending = _gyre.grouped_allreduce(names, xs, outs, rop, pre, post, c.refusal)
    guards = [g for n, t in zip(names, tensors) for g in _t.guards_for(n, t)]
    result = tensors if in_place else outs
    return Handle(base, pending, lambda _: result, guards)


def grouped_allreduce_async(tensors: Sequence[Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[Op] = None,
                            prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0) -> Handle:
    """Allreduces a list of tensors as one group (one handle, completed
    together); tensor i is named "<name>.<i>"."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, False)


def grouped_allreduce_async_(tensors: Sequence[Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[Op] = None,
                             prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0) -> Handle:
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce(tensors: Sequence[Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None,
                      compression: Type[Compressor] = Compression.none,
                      op: Optional[Op] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> List[Tensor]:
    """Returns a list of new tensors, each reduced over all ranks."""
    name = _op_name("grouped_allreduce", name)
    packed = [compression.compress(t) for t in tensors]
    handle = grouped_allreduce_async([c for c, _ in packed], average, name, op, prescale_factor,
                                     postscale_factor)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), packed)]


def grouped_allreduce_(tensors: Sequence[Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[Op] = None,
                       prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0) -> List[Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor))


# Other collectives ---------------------------------------------------------------


def allgather_async(tensor: Tensor, name: Optional[str] = None) -> Handle:
    name = _op_name("allgather", name)
    c = _t.Conversion()
    x = c.array(_t.prepare(tensor))
    pending = _gyre.allgather(name, x, c.refusal)
    return Handle(name, pending, lambda p: _t.from_output(p.output(), x), _t.guards_for(name, tensor))


def allgather(tensor: Tensor, name: Optional[str] = None) -> Tensor:
    """Concatenates every rank's tensor along the first dimension (ranks may
    differ in that dimension only)."""
    return synchronize(allgather_async(tensor, name))


def broadcast_async_(tensor: Tensor, root_rank: int, name: Optional[str] = None) -> Handle:
    name = _op_name("broadcast", name)
    c = _t.Conversion()
    root = c.integer(root_rank, "root_rank")
    pending = _gyre.broadcast(name, _t.prepare(tensor), root, c.refusal)
    return Handle(name, pending, lambda _: tensor, _t.guards_for(name, tensor))


def broadcast_async(tensor: Tensor, root_rank: int, name: Optional[str] = None) -> Handle:
    name = _op_name("broadcast", name)
    c = _t.Conversion()
    root = c.integer(root_rank, "root_rank")
    x = c.array(_t.prepare(tensor))
    copy = None if x is None else _t.clone(x)
    pending = _gyre.broadcast(name, copy, root, c.refusal)
    return Handle(name, pending, lambda _: copy)


def broadcast_(tensor: Tensor, root_rank: int, name: Optional[str] = None) -> Tensor:
    """Overwrites `tensor` with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def broadcast(tensor: Tensor, root_rank: int, name: Optional[str] = None) -> Tensor:
    """Returns a new tensor holding root_rank's `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def alltoall_async(tensor: Tensor, splits: Optional[Sequence[int]] = None,
                   name: Optional[str] = None) -> Handle:
    name = _op_name("alltoall", name)
    c = _t.Conversion()
    x = c.array(_t.prepare(tensor))
    split_list = c.ints(splits, "splits")
    if split_list == [] and not c.refusal:
        # The extension reads no splits as an even split.
        c.refuse("splits is empty: pass one entry per rank, or splits=None for an even split")
    pending = _gyre.alltoall(name, x, split_list or [], c.refusal)

    def finish(p):
        out = _t.from_output(p.output(), x)
        if splits is None:
            return out
        return out, _t.like_ints(p.received_splits(), x)

    return Handle(name, pending, finish, _t.guards_for(name, tensor))


def alltoall(tensor: Tensor, splits: Optional[Sequence[int]] = None,
             name: Optional[str] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Rank r sends splits[p] rows (first dimension) to rank p; an even split
    when splits is None. Returns the received rows, and with `splits` given
    also the number of rows received from each rank."""
    return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor: Tensor, name: Optional[str] = None, op: Op = Average,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    name = _op_name("reducescatter", name)
    c = _t.Conversion()
    rop = _op(c, None, op)
    pre, post = _scales(c, prescale_factor, postscale_factor)
    x = c.array(_t.prepare(tensor))
    pending = _gyre.reducescatter(name, x, rop, pre, post, c.refusal)
    return Handle(name, pending, lambda p: _t.from_output(p.output(), x), _t.guards_for(name, tensor))


def reducescatter(tensor: Tensor, name: Optional[str] = None,
                  compression: Type[Compressor] = Compression.none, op: Op = Average,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Tensor:
    """Reduces across ranks; rank r keeps block r of the first dimension
    (earlier ranks take one extra row when it does not divide evenly)."""
    name = _op_name("reducescatter", name)
    compressed, ctx = compression.compress(tensor)
    handle = reducescatter_async(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(synchronize(handle), ctx)


__all__ = [
    "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Handle", "poll", "synchronize",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "barrier",
    "join", "commit_step", "committed_steps", "version_vector",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async",
]
