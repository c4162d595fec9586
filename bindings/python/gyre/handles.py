"""Handles of enqueued operations, as Horovod's integer handles, and the
names that pair operations across ranks.

Horovod's ``*_async`` calls return an int that scripts keep in lists and
dicts and pass back to ``poll()`` / ``synchronize()``. A gyre :class:`Handle`
carries a number unique in the process and behaves as that int where
scripts use one (``int(h)``, ``operator.index``, equality and hashing with
ints, so dict keys and ``h in handles`` work), and ``synchronize(int(h))``
finds the handle while it is alive. It is not an ``int`` subclass on
purpose: gyre keeps an operation's tensors alive only until it completes,
even if the handle is dropped, so the table of numbers holds handles
weakly (Horovod's table holds them until synchronize()). A handle enters
that table only when its number is first taken (``int(h)``,
``operator.index``): a number is only known to a script that took it, and
the common call, whose handle goes straight back to synchronize(), costs no
table entry.
"""

import itertools
import threading
import weakref
from typing import Any, Callable, Iterable, List

from .exceptions import GyreError, InvalidArgumentError, InvalidTypeError

_name_lock = threading.Lock()  # guards _name_counters
_name_counters = {}


def op_name(kind, name, process_set=None):
    """The operation's name: `name`, or the next generated one of `kind` on
    `process_set` (each set counts its own: ranks outside a set do not call
    its operations, and names are scoped by set in the runtime).

    Called first thing in every operation, before any check that can refuse
    the call: a generated name is consumed whatever becomes of the call, so
    the counters advance alike on every rank even when a call is refused on
    one rank only (its refusal reaches the other ranks' call of that name),
    and later unnamed calls keep pairing with each other."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{kind}: name must be a non-empty string, got {name!r}")
        return name
    sid = getattr(process_set, "process_set_id", None) or 0
    key = kind if sid == 0 else (kind, sid)
    with _name_lock:
        n = _name_counters.get(key, 0)
        _name_counters[key] = n + 1
    return f"{kind}.noname.{n}"


def restart_names():
    """A new runtime (init() after shutdown(), maybe on other ranks than the
    last one): generated names start from 0 again, on every rank alike."""
    with _name_lock:
        _name_counters.clear()


def forget_names_of(process_set_id):
    """Drops the generated-name counters of a removed process set: its id is
    never used again in this process (the runtime does not reuse ids), so
    they would only grow the table with every set added and removed."""
    with _name_lock:
        for key in [k for k in _name_counters if isinstance(k, tuple) and k[1] == process_set_id]:
            del _name_counters[key]


class PendingGroup:
    """Several runtime operations behind one handle (grouped allgather and
    reducescatter): done when all are; wait() waits for every one before
    raising the first error, so none is left writing into a tensor."""

    __slots__ = ("ops",)

    def __init__(self, ops: List[Any]) -> None:
        self.ops = ops

    def poll(self) -> bool:
        return all(op.poll() for op in self.ops)

    def wait(self) -> None:
        first = None
        for op in self.ops:
            try:
                op.wait()
            except GyreError as e:
                first = first or e
        if first is not None:
            raise first


# Guards _pending (number -> live Handle whose number was taken) and _issued.
_table_lock = threading.Lock()
_pending = weakref.WeakValueDictionary()
_issued = 0  # 1 + the highest number taken so far
_numbers = itertools.count()  # next() is atomic: numbers are unique across threads


class Handle:
    """An enqueued operation: pass it (or its int) to :func:`poll` or
    :func:`synchronize`. Behaves as its number where an int is expected."""

    __slots__ = ("name", "_number", "_op", "_finish", "_guards", "_result", "_done",
                 "_in_table", "__weakref__")

    def __init__(self, name: str, op: Any, finish: Callable[[Any], Any],
                 guards: Iterable[Any] = ()) -> None:
        self.name = name
        self._op = op
        self._finish = finish
        self._guards = guards
        self._done = False
        self._result = None
        self._in_table = False
        self._number = next(_numbers)

    def __int__(self) -> int:
        global _issued
        if not self._in_table:
            with _table_lock:
                # Entered even when done: Horovod's synchronize(int) of a
                # finished handle returns None, found by number below.
                self._in_table = True
                if not self._done:
                    _pending[self._number] = self
                _issued = max(_issued, self._number + 1)
        return self._number

    __index__ = __int__

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Handle):
            return self._number == other._number
        if isinstance(other, int) and not isinstance(other, bool):
            return self._number == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._number)

    def __repr__(self) -> str:
        return f"<gyre.Handle {self._number} {self.name!r} {'done' if self.poll() else 'pending'}>"

    def poll(self) -> bool:
        return self._done or self._op.poll()

    def wait(self) -> Any:
        return synchronize(self)


def _lookup(handle: Any, what: str) -> Any:
    if isinstance(handle, Handle):
        return handle
    if isinstance(handle, int) and not isinstance(handle, bool):
        with _table_lock:
            found = _pending.get(handle)
        if found is not None:
            return found
        if 0 <= handle < _issued:
            return None  # synchronized already (or dropped): Horovod returns None then
        raise InvalidArgumentError(f"{what}: {handle} is not a handle gyre returned")
    raise InvalidTypeError(f"{what}() takes a gyre handle, got {type(handle).__name__}")


def poll(handle: Any) -> bool:
    """True once the operation of `handle` has completed (successfully or not)."""
    h = _lookup(handle, "poll")
    return True if h is None else h.poll()


def synchronize(handle: Any) -> Any:
    """Waits for the operation and returns its result (raises its error).

    Takes a Handle, its int (Horovod's), or the callable that
    ``sparse_allreduce_async`` returns. The same Handle object may be
    synchronized again (the same result); the int of a handle synchronized
    already gives None, as in Horovod."""
    if type(handle) is Handle:
        h = handle
    elif callable(handle) and not isinstance(handle, (int, Handle)):
        return handle()
    else:
        h = _lookup(handle, "synchronize")
        if h is None:
            return None
    if h._done:
        return h._result
    try:
        try:
            h._op.wait()
        except InvalidArgumentError:
            # The extension refuses to write a result into a tensor that was
            # resized or given other memory in flight; the guard says so
            # with the operation's name.
            for g in h._guards:
                g.check()
            raise
        for g in h._guards:
            g.check()
        h._result = h._finish(h._op)
    finally:
        if h._in_table and h._op.poll():
            with _table_lock:
                _pending.pop(h._number, None)
    h._done = True
    h._guards = ()
    return h._result


def forget_all() -> None:
    """Drops the table of unsynchronized handles (after shutdown(), whose
    pending operations have failed; the Handle objects still work)."""
    with _table_lock:
        _pending.clear()
