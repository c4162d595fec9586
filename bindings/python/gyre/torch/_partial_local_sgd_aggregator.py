"""PartialLocalSGD's aggregator (partial_local_sgd.py): the thread on the
set's first rank that closes rounds, merging on-time contributions and
late ones within max_staleness, rejecting the rest, and stepping the outer
optimizer. It reads and writes the store only, through its owner's
helpers."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch

import gyre
from gyre.exceptions import RankFailedError

if TYPE_CHECKING:  # pragma: no cover - the owner's type, for annotations only
    from .partial_local_sgd import PartialLocalSGD

log = logging.getLogger("gyre.torch.local_sgd")

# The prefix of the store's tensors (the owner's too).
_PREFIX = "gyre.partial_local_sgd"


class _Aggregator(threading.Thread):
    """The first rank's thread that closes rounds (see the module docstring)."""

    def __init__(self, owner: PartialLocalSGD, make_outer: Callable) -> None:
        super().__init__(name="gyre-partial-local-sgd", daemon=True)
        self.o = owner
        self.synced = torch.nn.Parameter(owner._flat_local()[:owner._np].clone())
        self.outer = make_outer([self.synced])
        self.meta = torch.zeros(3 + 4 * owner._n, dtype=torch.int64)
        self.consumed = [0] * owner._n
        self.history: List[Dict[str, Any]] = []
        self.stop = threading.Event()  # set by an elastic reset: the store is gone

    def run(self) -> None:
        try:
            self._loop()
            if not self.stop.is_set():
                self._publish(finished=1)
        except RankFailedError as e:
            # Every rank's own store calls raise it too; an elastic run
            # recovers and opens a new store with a new aggregator.
            log.info("PartialLocalSGD: the aggregator stops: %s", e)
        except BaseException:  # every rank must hear of it, not only this thread
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
            posted = o.store.pull(f"{_PREFIX}.posted")[0]
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
        version = int(self.meta[0])
        merged, late, rejected = [], [], []
        pseudo_sum = torch.zeros(o._np)
        buffer_sum = torch.zeros(o._nb)
        for i in pending:
            slot = f"{_PREFIX}.slot.{i}"
            value, v = o.store.pull(slot)
            o._add(slot, -value)  # empty again (x + -x = 0 exactly)
            self.consumed[i] += 1
            base = int(value[-1].item()) - 1
            lag = version - base
            if lag > o.max_staleness:
                rejected.append(i)
                log.warning("PartialLocalSGD: rank %d's contribution, made from round %d, is %d "
                            "rounds old (max_staleness %d): rejected", o._ranks[i], base, lag,
                            o.max_staleness)
                continue
            (late if lag else merged).append(i)
            pseudo_sum += value[:o._np]
            buffer_sum += value[o._np:o._np + o._nb]
        delta_meta = torch.zeros_like(self.meta)
        for i in pending:
            delta_meta[3 + i] = 1
        taken = merged + late
        if taken:
            model, v = o.store.pull(f"{_PREFIX}.model")
            with torch.no_grad():
                self.synced.copy_(model[:o._np])
                self.synced.grad = pseudo_sum / len(taken)
                self.outer.step()
                self.synced.grad = None
                new = torch.cat([self.synced.detach(), buffer_sum / len(taken)])
            o._add(f"{_PREFIX}.model", new - model)
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
        self.o._add(f"{_PREFIX}.meta", delta)
        self.meta += delta
