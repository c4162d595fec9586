"""gyre's collectives with Horovod's names, for torch tensors, numpy arrays and
any DLPack producer.

Every ``*_async`` call validates its arguments on the calling thread, enqueues
the operation and returns a :class:`Handle` at once; ``synchronize(handle)``
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

from . import _gyre
from . import _tensors as _t
from .compression import Compression
from .exceptions import InvalidArgumentError


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


def _reduce_op(average, op):
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


def _scale(value, what):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a number, got {value!r}") from None


def _check_root(root_rank):
    n = size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < n:
        raise InvalidArgumentError(f"root_rank {root_rank!r} is not a rank of this job (size {n})")


class Handle:
    """An enqueued operation: pass it to :func:`poll` or :func:`synchronize`."""

    __slots__ = ("name", "_op", "_finish", "_guards", "_result", "_done")

    def __init__(self, name, op, finish, guards=()):
        self.name = name
        self._op = op
        self._finish = finish
        self._guards = list(guards)
        self._done = False
        self._result = None

    def __repr__(self):
        return f"<gyre.Handle {self.name!r} {'done' if self.poll() else 'pending'}>"

    def poll(self):
        return self._done or self._op.poll()

    def wait(self):
        return synchronize(self)


def poll(handle):
    """True once the operation of `handle` has completed (successfully or not)."""
    return handle.poll()


def synchronize(handle):
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


def init():
    """Initialises MPI (if needed) and starts gyre's background thread.

    As in Horovod, init() may be called any number of times (while gyre runs,
    later calls do nothing) and again after shutdown(), which starts a new
    runtime on the same MPI (a new version vector; generated names go on)."""
    _gyre.init()


def shutdown():
    """Fails pending operations (on every rank) and stops the background
    thread; does nothing if gyre is not running. MPI stays initialised, so
    init() may follow; gyre finalises MPI at process exit if it initialised
    it. Also run at interpreter exit."""
    if _gyre.is_initialized():
        _gyre.shutdown()


def is_initialized():
    """True between init() and shutdown()."""
    return _gyre.is_initialized()


def rank():
    return _gyre.rank()


def size():
    return _gyre.size()


def local_rank():
    return _gyre.local_rank()


def local_size():
    return _gyre.local_size()


def barrier():
    """Blocks until every rank has called barrier()."""
    _gyre.barrier()


def join(device=-1):
    """This rank has no more data: it contributes zeros to other ranks'
    allreduces until every rank has joined. Returns the last rank to join.
    ``device`` is accepted for Horovod compatibility and ignored (CPU only)."""
    del device
    return _gyre.join()


def commit_step():
    """Counts one finished training step for the version vector
    (DistributedOptimizer.step() calls it)."""
    _gyre.commit_step()


def committed_steps():
    return _gyre.committed_steps()


def version_vector():
    """This rank's view of every rank's committed step count, by rank."""
    return list(_gyre.version_vector())


# Allreduce ---------------------------------------------------------------------


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """Reduces `tensor` across ranks into a new tensor (see synchronize)."""
    name = _op_name("allreduce", name)
    rop = _reduce_op(average, op)
    pre, post = _scale(prescale_factor, "prescale_factor"), _scale(postscale_factor, "postscale_factor")
    x = _t.as_framework_array(_t.prepare(tensor))
    out = _t.empty_like(x)
    pending = _gyre.allreduce(name, x, out, int(rop), pre, post)
    return Handle(name, pending, lambda _: out, _t.guards_for(name, tensor))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """Reduces `tensor` across ranks in place; synchronize returns `tensor`."""
    name = _op_name("allreduce", name)
    rop = _reduce_op(average, op)
    pre, post = _scale(prescale_factor, "prescale_factor"), _scale(postscale_factor, "postscale_factor")
    pending = _gyre.allreduce(name, _t.prepare(tensor), None, int(rop), pre, post)
    return Handle(name, pending, lambda _: tensor, _t.guards_for(name, tensor))


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """Returns a new tensor: `op` (default Average) of `tensor` over all ranks."""
    name = _op_name("allreduce", name)
    compressed, ctx = compression.compress(tensor)
    handle = allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(synchronize(handle), ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """In-place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def _grouped(tensors, average, name, op, prescale_factor, postscale_factor, in_place):
    base = _op_name("grouped_allreduce", name)
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("grouped_allreduce needs at least one tensor")
    rop = _reduce_op(average, op)
    pre, post = _scale(prescale_factor, "prescale_factor"), _scale(postscale_factor, "postscale_factor")
    if in_place:
        xs, outs = [_t.prepare(t) for t in tensors], None
    else:
        xs = [_t.as_framework_array(_t.prepare(t)) for t in tensors]
        outs = [_t.empty_like(x) for x in xs]
    names = [f"{base}.{i}" for i in range(len(tensors))]
    pending = _gyre.grouped_allreduce(names, xs, outs, int(rop), pre, post)
    guards = [g for n, t in zip(names, tensors) for g in _t.guards_for(n, t)]
    result = tensors if in_place else outs
    return Handle(base, pending, lambda _: result, guards)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0):
    """Allreduces a list of tensors as one group (one handle, completed
    together); tensor i is named "<name>.<i>"."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0):
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    """Returns a list of new tensors, each reduced over all ranks."""
    name = _op_name("grouped_allreduce", name)
    packed = [compression.compress(t) for t in tensors]
    handle = grouped_allreduce_async([c for c, _ in packed], average, name, op, prescale_factor,
                                     postscale_factor)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), packed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor))


# Other collectives ---------------------------------------------------------------


def allgather_async(tensor, name=None):
    name = _op_name("allgather", name)
    x = _t.as_framework_array(_t.prepare(tensor))
    pending = _gyre.allgather(name, x)
    return Handle(name, pending, lambda p: _t.from_output(p.output(), x), _t.guards_for(name, tensor))


def allgather(tensor, name=None):
    """Concatenates every rank's tensor along the first dimension (ranks may
    differ in that dimension only)."""
    return synchronize(allgather_async(tensor, name))


def broadcast_async_(tensor, root_rank, name=None):
    name = _op_name("broadcast", name)
    _check_root(root_rank)
    pending = _gyre.broadcast(name, _t.prepare(tensor), root_rank)
    return Handle(name, pending, lambda _: tensor, _t.guards_for(name, tensor))


def broadcast_async(tensor, root_rank, name=None):
    name = _op_name("broadcast", name)
    _check_root(root_rank)
    copy = _t.clone(_t.as_framework_array(_t.prepare(tensor)))
    pending = _gyre.broadcast(name, copy, root_rank)
    return Handle(name, pending, lambda _: copy)


def broadcast_(tensor, root_rank, name=None):
    """Overwrites `tensor` with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def broadcast(tensor, root_rank, name=None):
    """Returns a new tensor holding root_rank's `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def _check_splits(split_list, x):
    n = size()
    rows = x.shape[0] if len(x.shape) > 0 else None
    if len(split_list) != n:
        raise InvalidArgumentError(f"alltoall: {len(split_list)} splits for {n} ranks")
    if any(s < 0 for s in split_list):
        raise InvalidArgumentError(f"alltoall: negative split in {split_list}")
    if rows is None or sum(split_list) != rows:
        raise InvalidArgumentError(
            f"alltoall: splits {split_list} add up to {sum(split_list)}, "
            f"but the first dimension of the tensor is {rows}")


def alltoall_async(tensor, splits=None, name=None):
    name = _op_name("alltoall", name)
    x = _t.as_framework_array(_t.prepare(tensor))
    split_list = _t.int_list(splits, "splits")
    if split_list is not None:
        _check_splits(split_list, x)
    pending = _gyre.alltoall(name, x, split_list or [])

    def finish(p):
        out = _t.from_output(p.output(), x)
        if splits is None:
            return out
        return out, _t.like_ints(p.received_splits(), x)

    return Handle(name, pending, finish, _t.guards_for(name, tensor))


def alltoall(tensor, splits=None, name=None):
    """Rank r sends splits[p] rows (first dimension) to rank p; an even split
    when splits is None. Returns the received rows, and with `splits` given
    also the number of rows received from each rank."""
    return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    name = _op_name("reducescatter", name)
    rop = _reduce_op(None, op)
    pre, post = _scale(prescale_factor, "prescale_factor"), _scale(postscale_factor, "postscale_factor")
    x = _t.as_framework_array(_t.prepare(tensor))
    pending = _gyre.reducescatter(name, x, int(rop), pre, post)
    return Handle(name, pending, lambda p: _t.from_output(p.output(), x), _t.guards_for(name, tensor))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces across ranks; rank r keeps block r of the first dimension
    (earlier ranks take one extra row when it does not divide evenly)."""
    name = _op_name("reducescatter", name)
    compressed, ctx = compression.compress(tensor)
    handle = reducescatter_async(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(synchronize(handle), ctx)


__all__ = [
    "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Handle", "poll", "synchronize",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "barrier",
    "join", "commit_step", "committed_steps", "version_vector",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async",
]
