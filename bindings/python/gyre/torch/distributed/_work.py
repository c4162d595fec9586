"""GyreWork: the torch.distributed Work of one collective, completed by gyre.

A collective of the gyre process group enqueues one or more gyre operations
(or GyreWorks: a coalesced collective waits for several)
and returns a GyreWork at once, completed (results copied into the caller's
tensors by ``finish``, then its torch future set) by whichever comes first:
- ``wait()``: it waits on the operations themselves, woken by the runtime's
  thread directly, and completes the Work on the calling thread;
- ``is_completed()`` finding every operation done (it completes the Work);
- gyre's completion callback (PendingOp.add_done_callback, on gyre's callback
  thread with the GIL held), registered only once ``get_future()`` or
  ``add_done_callback()`` asks for a future completed without anyone waiting
  (DDP's communication hooks, ``then`` chains).
``_complete_once`` makes sure only one of them completes it. ``wait()``
rethrows gyre's error (an exception of gyre.exceptions: MismatchError,
TimeoutError, ...).

Why not always the callback: every synchronous ``dist.all_reduce`` then went
runtime thread -> callback thread (its wake-up, its turn for the GIL) -> the
waiting thread, and the callback thread's GIL contended with the caller's;
benchmarks/torch_call_cost.py --dist measures the difference (docs/benchmarks.md).
"""

import threading
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist


class GyreWork(dist.Work):
    """One collective in flight: torch's Work interface over gyre operations.

    The torch future is made only when asked for (``get_future()``,
    ``add_done_callback()``, or a ``wait()`` that finds another thread
    completing the Work): a synchronous collective completes without one.
    Exactly one thread sets it: the one that completes the Work if the future
    exists by then, else the one that makes it."""

    # Slots: a collective's Work is made on every call, and slot attributes
    # cost a fraction of instance-dictionary ones (benchmarks/torch_call_cost.py).
    __slots__ = ("_source_rank_of", "_pendings", "_finish", "_future", "_done", "_error",
                 "_result", "_lock", "_remaining", "_claimed", "_armed")

    def __init__(self, pendings: Sequence[Any], finish: Callable[[], List[torch.Tensor]],
                 source_rank: Optional[Callable[[], int]] = None) -> None:
        super().__init__()
        self._source_rank_of = source_rank  # a recv's: the sender's rank in the group
        self._pendings = list(pendings)
        self._finish = finish
        self._future: Optional[torch.futures.Future] = None
        self._done = False  # _result or _error is final
        self._error: Optional[BaseException] = None
        self._result: Optional[List[torch.Tensor]] = None
        # Guards _remaining, _claimed, _armed, _future and _done's setting.
        self._lock = threading.Lock()
        self._remaining = len(self._pendings)
        self._claimed = False  # _complete has been started (by one thread only)
        self._armed = False  # the completion callbacks are registered
        if not self._pendings:
            self._complete_once()

    def _arm(self) -> None:
        """Registers the completion callbacks (once): from then on the Work
        completes, and its future is set, without anyone waiting for it. The
        callbacks hold this object alive until the operations complete, even
        if the caller drops the Work."""
        with self._lock:
            if self._armed:
                return
            self._armed = True
            pendings = list(self._pendings)
        for p in pendings:
            p.add_done_callback(self._one_done)

    def __del__(self) -> None:
        # Dropped before it completed and before anything asked for its
        # future (an async_op Work never waited for): the callbacks complete
        # it now, as if it had been armed from the start, so that its results
        # still reach the caller's tensors; they hold it alive until then.
        try:
            if not self._claimed and not self._armed and self._pendings:
                self._arm()
        except Exception:  # noqa: BLE001 - interpreter exit: nothing left to complete for
            pass

    def _one_done(self) -> None:
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._complete_once()

    def _complete_once(self, waited: bool = False,
                       error: Optional[BaseException] = None) -> None:
        """Runs _complete unless another thread has started it."""
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        self._complete(waited, error)

    def _complete(self, waited: bool = False, error: Optional[BaseException] = None) -> None:
        """`waited`: the caller has waited for every operation, and `error`
        is the first one's error (None: all succeeded)."""
        value = None
        try:
            if not waited:
                for p in self._pendings:
                    p.wait()  # returns at once, or raises the operation's error
            if error is None:
                value = self._finish()
        except BaseException as e:  # noqa: BLE001 - every error belongs to the caller
            error = e
        with self._lock:
            self._error, self._result = error, value
            self._pendings = []
            self._finish = None
            self._done = True
            future = self._future
        if future is not None:
            self._settle(future)

    def _settle(self, future: torch.futures.Future) -> None:
        """Sets `future` from the final outcome (outside the lock: setting it
        runs its callbacks, which may call back into this Work)."""
        if self._error is not None:
            future.set_exception(self._error)
        else:
            future.set_result(self._result)

    def _get_future(self) -> torch.futures.Future:
        """The torch future, made now if there is none yet (set at once if
        the Work has completed)."""
        with self._lock:
            future = self._future
            settle = False
            if future is None:
                future = self._future = torch.futures.Future()
                settle = self._done  # completed without a future: nobody else sets it
        if settle:
            self._settle(future)
        return future

    # torch.distributed.Work ---------------------------------------------------

    def wait(self, timeout: Any = None) -> bool:
        """Blocks (GIL released) until the collective has completed; raises its
        error. gyre bounds every operation itself (a stalled or dead rank
        ends in TimeoutError naming it), so ``timeout`` is not used."""
        del timeout
        if not self._done:
            pendings = self._pendings  # _complete empties the attribute
            first_error = None
            for p in pendings:
                try:
                    p.wait()  # GIL released until the runtime completes it
                except Exception as e:  # noqa: BLE001 - completed with an error: raised below
                    # (and the others are still waited for: their buffers are in use)
                    first_error = first_error or e
            # Every operation has completed: complete the Work here unless
            # another thread (the callback thread, another waiter) already is.
            self._complete_once(True, first_error)
            if not self._done:
                try:
                    self._get_future().wait()  # set by that thread when it is done
                except BaseException:  # noqa: BLE001 - rethrown below as gyre's own error
                    if self._error is None:
                        raise
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        self._arm()
        return self._get_future()

    def is_completed(self) -> bool:
        if self._done:
            return True
        pendings = self._pendings
        if all(p.is_completed() if isinstance(p, GyreWork) else p.poll() for p in pendings):
            self._complete_once()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return list(self._result or [])

    def source_rank(self) -> int:
        """A recv's sender (a rank of the group), once it has completed."""
        if self._source_rank_of is None:
            raise RuntimeError("source_rank() is only defined for a point-to-point operation")
        self.wait()
        return self._source_rank_of()

    _source_rank = source_rank

    def add_done_callback(self, fn: Callable[[], Any]) -> None:
        """Calls fn() once completed: a GyreWork can stand for one of the
        operations of another (the coalesced collectives)."""
        self._arm()
        self._get_future().add_done_callback(lambda _: fn())

    def synchronize(self) -> None:
        """CPU tensors: nothing to synchronize beyond completion."""
