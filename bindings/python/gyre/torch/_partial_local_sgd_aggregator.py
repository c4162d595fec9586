"""PartialLocalSGD's fragments (partial_local_sgd.py): each fragment's
state on a rank (_Part), and its aggregator: the thread on the set's first
rank that closes the fragment's rounds, merging on-time contributions and
late ones within max_staleness, rejecting the rest, and stepping the outer
optimizer. The aggregator reads and writes the store only, through its
owner's helpers."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch

import gyre
from gyre.exceptions import RankFailedError

if TYPE_CHECKING:  # pragma: no cover - the owner's type, for annotations only
    from .partial_local_sgd import PartialLocalSGD

log = logging.getLogger("gyre.torch.local_sgd")

# The prefix of the store's tensors (the owner's too; a fragment f of
# several: "<prefix>.f<f>").
_PREFIX = "gyre.partial_local_sgd"


class _Part:
    """One fragment: its parameters (and the buffers, for the last), its
    names in the store, this rank's view of its rounds, and its round in
    flight (a post whose wait is due at step ``due``)."""

    def __init__(self, index: int, prefix: str, params: List[torch.Tensor],
                 buffers: List[torch.Tensor], offset: int) -> None:
        self.index = index
        self.prefix = prefix
        self.params = params
        self.buffers = buffers
        self.offset = offset
        self.np = sum(p.numel() for p in params)
        self.nb = sum(b.numel() for b in buffers)
        self.aggregator: Optional[_Aggregator] = None
        self.reset()

    def reset(self) -> None:
        """A new store: nothing posted, nothing in flight."""
        self.store_round = 0        # the round of this fragment this rank works from
        self.posted: Optional[torch.Tensor] = None
        self.final_meta: Optional[torch.Tensor] = None
        self.seen_rejected = 0
        self.synced = torch.empty(self.np)
        self.base: Optional[int] = None  # in flight: the round its contribution started from
        self.due = 0
        self.at_post: Optional[torch.Tensor] = None

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).float() for p in self.params])

    def flat_buffers(self) -> torch.Tensor:
        if not self.buffers:
            return torch.zeros(0)
        return torch.cat([b.detach().reshape(-1).float() for b in self.buffers])

    def flat_local(self) -> torch.Tensor:
        return torch.cat([self.flat_params(), self.flat_buffers()])


# The aggregators still running, stopped at exit (below).
_running: "weakref.WeakSet[_Aggregator]" = weakref.WeakSet()


def _stop_at_exit() -> None:
    """A job that exits without PartialLocalSGD.close() (an exception in
    the training loop) still has its aggregator threads in store calls:
    they stop here, before gyre shuts down (this module imports gyre, whose
    own exit handler was registered first and so runs after this one), and
    not in a store call while MPI is finalised, which aborts the process."""
    aggregators = [a for a in _running if a.is_alive()]
    if aggregators:
        log.warning("PartialLocalSGD: the process exits without close(): its aggregator stops, "
                    "and the other ranks' waits for its rounds fail")
    for a in aggregators:
        a.exiting = True
        a.stop.set()
    for a in aggregators:
        a.join(5.0)
        if a.is_alive():
            log.warning("PartialLocalSGD: the aggregator of fragment %d did not stop at exit",
                        a.part.index)


atexit.register(_stop_at_exit)


class _Aggregator(threading.Thread):
    """The first rank's thread that closes the rounds of one fragment (see
    the module docstring); its outer optimizer steps that fragment's
    parameters only."""

    def __init__(self, owner: PartialLocalSGD, part: _Part, make_outer: Callable) -> None:
        super().__init__(name=f"gyre-partial-local-sgd-{part.index}", daemon=True)
        self.o = owner
        self.part = part
        self.prefix = part.prefix
        self.synced = torch.nn.Parameter(part.flat_params().clone())
        self.outer = make_outer([self.synced])
        self.meta = torch.zeros(3 + 4 * owner._n, dtype=torch.int64)
        self.consumed = [0] * owner._n
        self.history: List[Dict[str, Any]] = []
        # Set by an elastic reset (the store is gone) or at exit (exiting:
        # the store is still open, and the others hear of it through it).
        self.stop = threading.Event()
        self.exiting = False

    def start(self) -> None:
        _running.add(self)
        super().start()

    def run(self) -> None:
        try:
            self._loop()
            if not self.stop.is_set():
                self._publish(finished=1)
            elif self.exiting:
                self._publish(failed=1)  # every wait for a round raises, none times out
        except RankFailedError as e:
            # Every rank's own store calls raise it too; an elastic run
            # recovers and opens a new store with a new aggregator.
            log.info("PartialLocalSGD: the aggregator stops: %s", e)
        except gyre.StateError as e:
            if "store is closed" not in str(e) and "store was closed" not in str(e):
                self._failed()
                return
            # Closed under it: gyre shut down (this rank's exit, or another
            # rank's shutdown, which stops every rank's stores); every
            # rank's own calls say so, and nothing can be published.
            log.info("PartialLocalSGD: the aggregator stops: %s", e)
        except BaseException:  # every rank must hear of it, not only this thread
            self._failed()

    def _failed(self) -> None:
        """In an exception handler: logs it and tells every rank."""
        log.exception("PartialLocalSGD: the aggregator failed")
        try:
            self._publish(failed=1)
        except BaseException:
            log.exception("PartialLocalSGD: the aggregator could not publish its failure")

    def _loop(self) -> None:
        o, n = self.o, self.o._n
        first_on_time: Optional[float] = None
        waiting_since: Optional[float] = None  # a contribution is posted, no round closes
        nap = 0.0
        while not self.stop.is_set():
            posted = o.store.pull(f"{self.prefix}.posted")[0]
            version = int(self.meta[0])
            pending = [i for i in range(n) if int(posted[i]) > self.consumed[i]]
            active = [i for i in range(n) if not posted[2 * n + i]]
            if not active and not pending:
                return
            on_time = [i for i in pending if int(posted[n + i]) == version]
            if on_time and first_on_time is None:
                first_on_time = time.monotonic()
            everyone = all(i in pending for i in active)
            overdue = first_on_time is not None and time.monotonic() - first_on_time > o.late_after_s
            if pending and (everyone or overdue):
                self._close(pending)
                first_on_time = waiting_since = None
                nap = 0.0
                continue
            if pending and waiting_since is None:
                waiting_since = time.monotonic()
            if waiting_since is not None and time.monotonic() - waiting_since > o.timeout_s:
                raise gyre.TimeoutError(
                    f"PartialLocalSGD: no round could close for {o.timeout_s:g} s; ranks "
                    f"{[o._ranks[i] for i in active if i not in pending]} posted nothing")
            nap = min(max(nap * 2, 5e-5), 2e-3)
            time.sleep(nap)

    def _close(self, pending: List[int]) -> None:
        o, n = self.o, self.o._n
        np_, nb = self.part.np, self.part.nb
        version = int(self.meta[0])
        merged, late, rejected = [], [], []
        pseudo_sum = torch.zeros(np_)
        buffer_sum = torch.zeros(nb)
        for i in pending:
            slot = f"{self.prefix}.slot.{i}"
            value, v = o.store.pull(slot)
            o._add(slot, -value)  # empty again (x + -x = 0 exactly)
            self.consumed[i] += 1
            base = int(value[-1].item()) - 1
            lag = version - base
            if lag > o.max_staleness:
                rejected.append(i)
                log.warning("PartialLocalSGD: rank %d's contribution%s, made from round %d, is %d "
                            "rounds old (max_staleness %d): rejected", o._ranks[i],
                            "" if o.fragments == 1 else f" to fragment {self.part.index}", base,
                            lag, o.max_staleness)
                continue
            (late if lag else merged).append(i)
            pseudo_sum += value[:np_]
            buffer_sum += value[np_:np_ + nb]
        delta_meta = torch.zeros_like(self.meta)
        for i in pending:
            delta_meta[3 + i] = 1
        taken = merged + late
        if taken:
            model, v = o.store.pull(f"{self.prefix}.model")
            with torch.no_grad():
                self.synced.copy_(model[:np_])
                self.synced.grad = pseudo_sum / len(taken)
                self.outer.step()
                self.synced.grad = None
                new = torch.cat([self.synced.detach(), buffer_sum / len(taken)])
            o._add(f"{self.prefix}.model", new - model)
            delta_meta[0] = 1
            for i in taken:
                delta_meta[3 + n + i] = version + 1 - self.meta[3 + n + i]
            for i in late:
                delta_meta[3 + 2 * n + i] = 1
        for i in rejected:
            delta_meta[3 + 3 * n + i] = 1
        self._push_meta(delta_meta)
        self.history.append({"round": version + 1 if taken else None,
                             "merged": [o._ranks[i] for i in merged],
                             "late": [o._ranks[i] for i in late],
                             "rejected": [o._ranks[i] for i in rejected]})

    def _publish(self, finished: int = 0, failed: int = 0) -> None:
        delta = torch.zeros_like(self.meta)
        delta[1], delta[2] = finished, failed
        self._push_meta(delta)

    def _push_meta(self, delta: torch.Tensor) -> None:
        self.o._add(f"{self.prefix}.meta", delta)
        self.meta += delta
