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
A name is in use on a rank from the call until its operation has completed
and either its handle has seen that (``synchronize``, ``wait``, a ``poll``
that returned True) or the rank has enqueued another operation since; a call
of a name in use raises InvalidArgumentError (a ValueError) on that rank
alone, so two calls of a name with nothing waited and nothing else enqueued
between them are refused every time, however soon the first completed.
"""

from typing import Any, List, Optional, Sequence, Tuple, Type, Union

from . import _gyre
from . import _tensors as _t
from .basics import *  # noqa: F401,F403 (lifecycle and build information, re-exported)
from .basics import __all__ as _basics_all
from .basics import check_process_set, global_process_set
from .compression import Compression, Compressor
from .exceptions import InvalidArgumentError, InvalidTypeError
from .handles import Handle, PendingGroup, poll, synchronize
from .handles import _name_counters  # noqa: F401 (read by tests: names consumed)
from .handles import op_name as _op_name
from .reduction import Adasum, Average, Max, Min, Op, Product, ReduceOp, Sum
from .reduction import _OP_VALUES, _op, _reduce_op, _scales  # noqa: F401 (gyre.torch's)

# A torch tensor, a numpy array or any other DLPack or buffer-protocol
# producer; results come back in the caller's framework (see _tensors).
Tensor = Any
_POOLED_OUTPUT_BYTES = 1 << 20  # the extension's kPooledMinBytes


# Lifecycle beyond basics (init and shutdown are basics') ------------------------


def barrier(process_set: Any = global_process_set) -> None:
    """Blocks until every rank (of `process_set`) has called barrier().
    Ctrl-C interrupts the wait (KeyboardInterrupt); a rank that never calls
    it makes it fail with TimeoutError after GYRE_STALL_SHUTDOWN_S."""
    sid = check_process_set(process_set, "barrier")
    _gyre.barrier(sid)


def join(device: int = -1, process_set: Any = global_process_set) -> int:
    """This rank has no more data: it contributes zeros to other ranks'
    sum, average (divided by every rank, joined ones included) and Adasum
    allreduces until every rank (of `process_set`, gyre's addition) has
    joined; meanwhile their allgathers, broadcasts and other collectives
    fail (StateError), as in Horovod. Returns the last rank to join (a world
    rank), the same on every rank. ``device``
    (Horovod's: where to make the zero tensors) is accepted and not needed:
    the runtime contributes zeros without a tensor. Ctrl-C interrupts the
    wait (KeyboardInterrupt; this rank stays joined)."""
    del device
    sid = check_process_set(process_set, "join")
    last = _gyre.join(sid)
    _align_generated_names(sid, process_set)
    return last


def _align_generated_names(sid, process_set):
    """After a join: a rank that waited joined issued none of the unnamed
    operations the others ran meanwhile (their allreduces, and the
    allgathers and broadcasts that failed), so its generated-name counters
    of `process_set` are behind theirs and its next unnamed call would pair
    with an older name on the others' side. Every rank takes the highest
    count of each kind, so unnamed calls pair again from here on."""
    from . import handles
    from .objects import allgather_object  # objects imports this module

    def in_set(key):
        return isinstance(key, str) if sid == 0 else (isinstance(key, tuple) and key[1] == sid)

    with handles._name_lock:
        mine = {k: n for k, n in handles._name_counters.items() if in_set(k)}
    everyone = allgather_object(mine, name="gyre.join.generated_names", process_set=process_set)
    with handles._name_lock:
        for counts in everyone:
            for key, n in counts.items():
                if handles._name_counters.get(key, 0) < n:
                    handles._name_counters[key] = n


def commit_step() -> None:
    """Counts one finished training step for the version vector
    (DistributedOptimizer.step() calls it)."""
    _gyre.commit_step()


def committed_steps() -> int:
    return _gyre.committed_steps()


def version_vector() -> List[int]:
    """This rank's view of every rank's committed step count, by rank."""
    return list(_gyre.version_vector())


def runtime_stats() -> dict:
    """This rank's runtime counters: negotiation rounds, requests sent in
    full and as cache bits, rounds decided in log depth
    (``log_depth_rounds``) and the messages this rank sent negotiating
    (``negotiation_messages``; across hosts of several ranks each the
    hosts a log-depth round is combined over, ``negotiation_tier_hosts``,
    0 when rounds are not tiered; of the rounds, those a caller waiting for
    its operation ran itself, ``caller_rounds``: GYRE_CALLER_ROUNDS, C++'s
    Handle::wait() and every blocking wait of this package except with
    fault tolerance on; the operations such callers handed over to the
    background thread, ``caller_handoffs``, and that thread's wake-ups that
    left the rounds to them, ``rounds_left_to_callers``), and the messages and bytes it sent over
    its transports, negotiation and collectives' data (``transport_*``;
    shared memory within a host is not counted); the version vector (``versions``) and how many
    committed steps each rank is behind the most advanced one (``behind``);
    the parameter stores' shard pushes made by this process, applied,
    rejected and scaled, and the largest lag among them (``store_*``); the
    cost model's link parameters and their source (``link``: "built-in",
    or "probed"/"cached" under GYRE_LINK_PROBE=1)."""
    return dict(_gyre.runtime_stats())


# Allreduce ---------------------------------------------------------------------
# Horovod's positional order everywhere: a script passing arguments by
# position means the same here. process_set= takes a registered ProcessSet
# (basics.check_process_set); the runtime refuses ranks outside it.

PS = Any  # a ProcessSet


def _start_allreduce(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                     in_place, blocking=False):
    """Enqueues an allreduce: (name, pending operation, output or None).
    blocking: the caller waits for it at once (the extension's wait_follows:
    the background thread is not woken; the wait runs the round)."""
    name = _op_name("allreduce", name, process_set)
    sid = 0 if process_set is global_process_set else check_process_set(process_set, "allreduce")
    if (average is None and (op is None or type(op) is ReduceOp) and
            type(prescale_factor) is float and type(postscale_factor) is float and
            (in_place or _t.is_torch_or_numpy(tensor))):
        # The common call: nothing to convert (the extension takes the tensor).
        rop, pre, post, refusal, x = _OP_VALUES[op], prescale_factor, postscale_factor, "", tensor
    else:
        c = _t.Conversion()
        rop = _op(c, average, op)
        pre, post = _scales(c, prescale_factor, postscale_factor)
        x = tensor if in_place else c.array(tensor)
        refusal = c.refusal
    if in_place:
        return name, _gyre.allreduce(name, x, None, rop, pre, post, refusal, sid, False,
                                     blocking), None
    if _t.is_torch(x) and x.is_cpu and x.nbytes >= _POOLED_OUTPUT_BYTES:
        # A large new output from gyre's pool: already in memory when its
        # size was used before (a fresh torch tensor would fault in every
        # page; extension's host_pool.h).
        started = _gyre.allreduce_pooled(name, x, rop, pre, post, refusal, sid)
        if started is not None:
            pending, pooled = started
            return name, pending, _t.from_output(pooled, x)
    out = None if x is None else _t.empty_like(x)
    # fresh_output: nobody else holds `out` until the operation completes, so
    # the extension neither pins nor copies it (tensor_import.h).
    return name, _gyre.allreduce(name, x, out, rop, pre, post, refusal, sid, True, blocking), out


def allreduce_async(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[Op] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: PS = global_process_set) -> Handle:
    """Reduces `tensor` across ranks into a new tensor (see synchronize)."""
    name, pending, out = _start_allreduce(tensor, average, name, op, prescale_factor,
                                          postscale_factor, process_set, False)
    return Handle(name, pending, lambda _: out, _t.guards_for(name, tensor))


def allreduce_async_(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[Op] = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: PS = global_process_set) -> Handle:
    """Reduces `tensor` across ranks in place; synchronize returns `tensor`."""
    name, pending, _ = _start_allreduce(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, True)
    return Handle(name, pending, lambda _: tensor, _t.guards_for(name, tensor))


def allreduce(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Type[Compressor] = Compression.none, op: Optional[Op] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: PS = global_process_set) -> Tensor:
    """Returns a new tensor: `op` (default Average) of `tensor` over all ranks."""
    if compression is Compression.none:
        # What synchronize(allreduce_async(...)) does, without a Handle.
        name, pending, out = _start_allreduce(tensor, average, name, op, prescale_factor,
                                              postscale_factor, process_set, False, True)
        _t.wait_guarded(pending, name, tensor)
        return out
    name = _op_name("allreduce", name, process_set)
    compressed, ctx = compression.compress(tensor)
    handle = allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor,
                             process_set)
    return compression.decompress(synchronize(handle), ctx)


def allreduce_(tensor: Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[Op] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: PS = global_process_set) -> Tensor:
    """In-place allreduce; returns `tensor`."""
    # What synchronize(allreduce_async_(...)) does, without a Handle.
    name, pending, _ = _start_allreduce(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, True, True)
    _t.wait_guarded(pending, name, tensor)
    return tensor


def _tensor_list(tensors, what):
    try:
        return list(tensors)
    except TypeError:
        # Raised here: without tensors there are no names to announce it under.
        raise InvalidTypeError(
            f"{what} takes a sequence of tensors, got {type(tensors).__name__}") from None


def _grouped(tensors, average, name, op, prescale_factor, postscale_factor, in_place,
             process_set):
    base = _op_name("grouped_allreduce", name, process_set)
    sid = check_process_set(process_set, "grouped_allreduce")
    tensors = _tensor_list(tensors, "grouped_allreduce")
    c = _t.Conversion()
    rop = _op(c, average, op)
    pre, post = _scales(c, prescale_factor, postscale_factor)
    if in_place:
        xs, outs = list(tensors), None
    else:
        xs = [c.array(t) for t in tensors]
        outs = [None if x is None else _t.empty_like(x) for x in xs]
    names = [f"{base}.{i}" for i in range(len(tensors))]
    pending = _gyre.grouped_allreduce(names, xs, outs, rop, pre, post, c.refusal,
                                      process_set=sid)
    guards = [g for n, t in zip(names, tensors) for g in _t.guards_for(n, t)]
    result = tensors if in_place else outs
    return Handle(base, pending, lambda _: list(result), guards)


def grouped_allreduce_async(tensors: Sequence[Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[Op] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: PS = global_process_set) -> Handle:
    """Allreduces a list of tensors as one group (one handle, completed
    together); tensor i is named "<name>.<i>"."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, False,
                    process_set)


def grouped_allreduce_async_(tensors: Sequence[Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[Op] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: PS = global_process_set) -> Handle:
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, True,
                    process_set)


def grouped_allreduce(tensors: Sequence[Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None,
                      compression: Type[Compressor] = Compression.none,
                      op: Optional[Op] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: PS = global_process_set) -> List[Tensor]:
    """Returns a list of new tensors, each reduced over all ranks."""
    name = _op_name("grouped_allreduce", name, process_set)
    packed = [compression.compress(t) for t in _tensor_list(tensors, "grouped_allreduce")]
    handle = grouped_allreduce_async([c for c, _ in packed], average, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), packed)]


def grouped_allreduce_(tensors: Sequence[Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[Op] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: PS = global_process_set) -> List[Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# Allgather, broadcast ------------------------------------------------------------


def _allgather_pending(name, tensor, sid):
    c = _t.Conversion()
    x = c.array(tensor)
    return _gyre.allgather(name, x, c.refusal, process_set=sid), x


def allgather_async(tensor: Tensor, name: Optional[str] = None,
                    process_set: PS = global_process_set) -> Handle:
    name = _op_name("allgather", name, process_set)
    sid = check_process_set(process_set, "allgather")
    pending, x = _allgather_pending(name, tensor, sid)
    return Handle(name, pending, lambda p: _t.from_output(p.output(), x), _t.guards_for(name, tensor))


def allgather(tensor: Tensor, name: Optional[str] = None,
              process_set: PS = global_process_set) -> Tensor:
    """Concatenates every rank's tensor along the first dimension (ranks may
    differ in that dimension only)."""
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors: Sequence[Tensor], name: Optional[str] = None,
                            process_set: PS = global_process_set) -> Handle:
    """Allgathers each tensor of the list ("<name>.<i>"); one handle, whose
    result is the list of gathered tensors."""
    base = _op_name("grouped_allgather", name, process_set)
    sid = check_process_set(process_set, "grouped_allgather")
    tensors = _tensor_list(tensors, "grouped_allgather")
    names = [f"{base}.{i}" for i in range(len(tensors))]
    started = [_allgather_pending(n, t, sid) for n, t in zip(names, tensors)]
    guards = [g for n, t in zip(names, tensors) for g in _t.guards_for(n, t)]

    def finish(group):
        return [_t.from_output(p.output(), x) for p, (_, x) in zip(group.ops, started)]

    return Handle(base, PendingGroup([p for p, _ in started]), finish, guards)


def grouped_allgather(tensors: Sequence[Tensor], name: Optional[str] = None,
                      process_set: PS = global_process_set) -> List[Tensor]:
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def broadcast_async_(tensor: Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: PS = global_process_set) -> Handle:
    name = _op_name("broadcast", name, process_set)
    sid = check_process_set(process_set, "broadcast")
    c = _t.Conversion()
    root = c.integer(root_rank, "root_rank")
    pending = _gyre.broadcast(name, tensor, root, c.refusal, process_set=sid)
    return Handle(name, pending, lambda _: tensor, _t.guards_for(name, tensor))


def broadcast_async(tensor: Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: PS = global_process_set) -> Handle:
    name = _op_name("broadcast", name, process_set)
    sid = check_process_set(process_set, "broadcast")
    c = _t.Conversion()
    root = c.integer(root_rank, "root_rank")
    x = c.array(tensor)
    copy = None if x is None else _t.clone(x)
    pending = _gyre.broadcast(name, copy, root, c.refusal, process_set=sid)
    return Handle(name, pending, lambda _: copy)


def broadcast_(tensor: Tensor, root_rank: int, name: Optional[str] = None,
               process_set: PS = global_process_set) -> Tensor:
    """Overwrites `tensor` with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor: Tensor, root_rank: int, name: Optional[str] = None,
              process_set: PS = global_process_set) -> Tensor:
    """Returns a new tensor holding root_rank's `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# Alltoall, reducescatter ------------------------------------------------------------


def alltoall_async(tensor: Tensor, splits: Optional[Sequence[int]] = None,
                   name: Optional[str] = None, process_set: PS = global_process_set) -> Handle:
    """As Horovod: synchronize() gives (output, received_splits), with or
    without `splits`; received_splits is int32, or of splits' dtype when
    splits is a tensor."""
    name = _op_name("alltoall", name, process_set)
    sid = check_process_set(process_set, "alltoall")
    c = _t.Conversion()
    x = c.array(tensor)
    split_list = c.ints(splits, "splits")
    if split_list == [] and not c.refusal:
        # The extension reads no splits as an even split.
        c.refuse("splits is empty: pass one entry per rank, or splits=None for an even split")
    pending = _gyre.alltoall(name, x, split_list or [], c.refusal, process_set=sid)

    def finish(p):
        out = _t.from_output(p.output(), x)
        return out, _t.like_ints(p.received_splits(), x, splits)

    return Handle(name, pending, finish, _t.guards_for(name, tensor))


def alltoall(tensor: Tensor, splits: Optional[Sequence[int]] = None,
             name: Optional[str] = None,
             process_set: PS = global_process_set) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Rank r sends splits[p] rows (first dimension) to rank p; an even split
    when splits is None. Returns the received rows, and with `splits` given
    also the number of rows received from each rank (as Horovod)."""
    out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


def _reducescatter_pending(name, tensor, op, prescale_factor, postscale_factor, sid):
    c = _t.Conversion()
    rop = _op(c, None, op)
    pre, post = _scales(c, prescale_factor, postscale_factor)
    x = c.array(tensor)
    return _gyre.reducescatter(name, x, rop, pre, post, c.refusal, process_set=sid), x


def reducescatter_async(tensor: Tensor, name: Optional[str] = None, op: Op = Average,
                        process_set: PS = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    name = _op_name("reducescatter", name, process_set)
    sid = check_process_set(process_set, "reducescatter")
    pending, x = _reducescatter_pending(name, tensor, op, prescale_factor, postscale_factor,
                                        sid)
    return Handle(name, pending, lambda p: _t.from_output(p.output(), x), _t.guards_for(name, tensor))


def reducescatter(tensor: Tensor, name: Optional[str] = None,
                  compression: Type[Compressor] = Compression.none, op: Op = Average,
                  process_set: PS = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Tensor:
    """Reduces across ranks; rank r keeps block r of the first dimension
    (earlier ranks take one extra row when it does not divide evenly)."""
    name = _op_name("reducescatter", name, process_set)
    compressed, ctx = compression.compress(tensor)
    handle = reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                 postscale_factor)
    return compression.decompress(synchronize(handle), ctx)


def grouped_reducescatter_async(tensors: Sequence[Tensor], name: Optional[str] = None,
                                op: Op = Average, process_set: PS = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Reducescatters each tensor of the list ("<name>.<i>"); one handle,
    whose result is the list of this rank's blocks."""
    base = _op_name("grouped_reducescatter", name, process_set)
    sid = check_process_set(process_set, "grouped_reducescatter")
    tensors = _tensor_list(tensors, "grouped_reducescatter")
    names = [f"{base}.{i}" for i in range(len(tensors))]
    started = [_reducescatter_pending(n, t, op, prescale_factor, postscale_factor, sid)
               for n, t in zip(names, tensors)]
    guards = [g for n, t in zip(names, tensors) for g in _t.guards_for(n, t)]

    def finish(group):
        return [_t.from_output(p.output(), x) for p, (_, x) in zip(group.ops, started)]

    return Handle(base, PendingGroup([p for p, _ in started]), finish, guards)


def grouped_reducescatter(tensors: Sequence[Tensor], name: Optional[str] = None,
                          compression: Type[Compressor] = Compression.none, op: Op = Average,
                          process_set: PS = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[Tensor]:
    name = _op_name("grouped_reducescatter", name, process_set)
    packed = [compression.compress(t) for t in _tensor_list(tensors, "grouped_reducescatter")]
    handle = grouped_reducescatter_async([c for c, _ in packed], name, op, process_set,
                                         prescale_factor, postscale_factor)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), packed)]


__all__ = list(_basics_all) + [
    "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Adasum", "Handle", "poll", "synchronize",
    "barrier", "join", "commit_step", "committed_steps", "version_vector",
    "runtime_stats",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
]
