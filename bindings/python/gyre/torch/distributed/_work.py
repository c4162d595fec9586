"""GyreWork: the torch.distributed Work of one collective, completed by gyre.

A collective of the gyre process group enqueues one or more gyre operations
(or GyreWorks: a coalesced collective waits for several)
and returns a GyreWork at once. Its torch future is completed by gyre's
completion callback (PendingOp.add_done_callback, run on gyre's callback
thread with the GIL held) when the last of those operations has completed:
no thread waits for it. The callback copies results into the caller's tensors
(``finish``) before completing the future, so a caller woken by the future
sees them. ``wait()`` blocks on the future and rethrows gyre's error (an
exception of gyre.exceptions: MismatchError, TimeoutError, ...).
"""

import threading
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist


class GyreWork(dist.Work):
    """One collective in flight: torch's Work interface over gyre operations."""

    def __init__(self, pendings: Sequence[Any], finish: Callable[[], List[torch.Tensor]],
                 source_rank: Optional[Callable[[], int]] = None) -> None:
        super().__init__()
        self._source_rank_of = source_rank  # a recv's: the sender's rank in the group
        self._pendings = list(pendings)
        self._finish = finish
        self._future: torch.futures.Future = torch.futures.Future()
        self._error: Optional[BaseException] = None
        self._result: Optional[List[torch.Tensor]] = None
        self._lock = threading.Lock()  # guards _remaining
        self._remaining = len(self._pendings)
        if not self._pendings:
            self._complete()
            return
        # The callbacks hold this object alive until the operations complete,
        # even if the caller drops the Work.
        for p in self._pendings:
            p.add_done_callback(self._one_done)

    def _one_done(self) -> None:
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._complete()

    def _complete(self) -> None:
        try:
            for p in self._pendings:
                p.wait()  # returns at once, or raises the operation's error
            value = self._finish()
        except BaseException as e:  # noqa: BLE001 - every error belongs to the caller
            self._error = e
            self._pendings = []
            self._future.set_exception(e)
            return
        self._pendings = []
        self._finish = None
        self._result = value
        self._future.set_result(value)

    # torch.distributed.Work ---------------------------------------------------

    def wait(self, timeout: Any = None) -> bool:
        """Blocks (GIL released) until the collective has completed; raises its
        error. gyre bounds every operation itself (a stalled or dead rank
        ends in TimeoutError naming it), so ``timeout`` is not used."""
        del timeout
        try:
            self._future.wait()
        except BaseException:  # noqa: BLE001 - rethrown below as gyre's own error
            if self._error is None:
                raise
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._error is None

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
        self._future.add_done_callback(lambda _: fn())

    def synchronize(self) -> None:
        """CPU tensors: nothing to synchronize beyond completion."""
