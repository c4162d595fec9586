"""Local SGD with partial participation: rounds that do not wait for late
ranks, through the versioned parameter store (gyre.ps).

    opt = gyre.torch.PartialLocalSGD(torch.optim.AdamW(model.parameters()), model, period=16,
                                     late_after_s=2.0, max_staleness=1)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.close()                                  # collective: the final model everywhere

The synchronised model (parameters and float buffers, one flat float32
tensor) lives in a ParameterStore; its version counts the closed rounds. A
rank's round, every ``period`` steps: it posts its contribution (the
pseudo-gradient synced - local, its buffers, and the version it started
from) into a mailbox of its own in the store, waits until a round after
that version has closed, pulls the model and continues from it. No
collective: nobody waits for a particular rank.

The first rank of the set runs the aggregator on a thread of its own (so its
own training pace does not matter): a round closes when every rank still
training has a contribution posted, or ``late_after_s`` seconds after the
first contribution made from the current version, whichever comes first.
Contributions from the current version are on time. One from an older
version (its rank was late for the round it started for) has a lag: the
number of rounds closed since its version. Lag <= ``max_staleness``: it is
merged into the round closing now, with the on-time ones; otherwise it is
rejected: a warning names the rank and the rounds, the rank's ``rejected``
counter counts it, and the rank goes on from the current model like every
other rank (it always pulls after a round). The round's update: the mean of
the merged pseudo-gradients, stepped by the outer optimizer (default plain
averaging; any torch optimizer, momentum included: it runs on the
aggregator only, so its state is one copy), and the mean of their buffers.

``merged_rounds()`` says, for each rank, the round its latest merged
contribution went into. The model's round is the commit count: adopting
round k after round j calls ``gyre.commit_step()`` k - j times, so each
rank's entry in ``gyre.version_vector()`` is the round it holds (plus the
commits made before construction). Ranks at different rounds therefore
differ in committed steps: a collective between them during training fails
with DivergenceError unless ``GYRE_MAX_VERSION_LAG`` allows the difference;
after close() every rank holds the final round. Waits are bounded by ``timeout_s`` (a TimeoutError
naming what did not come), and an error on the aggregator's thread is
raised by every rank's next wait (it is published in the store).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional

import torch

import gyre
from gyre.torch._wrapper import OptimizerWrapper
from gyre.basics import check_process_set
from gyre.exceptions import InvalidArgumentError, RankFailedError
from gyre.ps import ParameterStore

from ._partial_local_sgd_aggregator import _PREFIX, _Aggregator

__all__ = ["PartialLocalSGD"]

log = logging.getLogger("gyre.torch.local_sgd")


class PartialLocalSGD(OptimizerWrapper):
    """Local SGD whose rounds close without late ranks; see the module
    docstring. Construction and close() are collective."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, period: int,
                 late_after_s: float, max_staleness: int = 1,
                 outer_optimizer: Optional[Callable[[List[torch.Tensor]], torch.optim.Optimizer]] = None,
                 process_set: Any = None, timeout_s: Optional[float] = None,
                 warmup_steps: int = 0) -> None:
        if period < 1:
            raise InvalidArgumentError(f"PartialLocalSGD: period must be >= 1, got {period}")
        if warmup_steps < 0:
            raise InvalidArgumentError(
                f"PartialLocalSGD: warmup_steps must be >= 0, got {warmup_steps}")
        if not late_after_s >= 0:
            raise InvalidArgumentError(f"PartialLocalSGD: late_after_s must be >= 0, got {late_after_s}")
        if max_staleness < 0:
            raise InvalidArgumentError(
                f"PartialLocalSGD: max_staleness must be >= 0, got {max_staleness}")
        sid = check_process_set(process_set, "PartialLocalSGD")
        self.optimizer = optimizer
        self.model = model
        self.period = period
        self.warmup_steps = warmup_steps
        self.late_after_s = float(late_after_s)
        self.max_staleness = max_staleness
        if timeout_s is None:
            timeout_s = float(os.environ.get("GYRE_STALL_SHUTDOWN_S", "600") or 0) or 600.0
        self.timeout_s = float(timeout_s)
        self._process_set = process_set
        self._sid = sid
        self._make_outer = outer_optimizer or functools.partial(torch.optim.SGD, lr=1.0)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._buffers = [b for b in model.buffers() if b.dtype.is_floating_point]
        self._np = sum(p.numel() for p in self._params)
        self._nb = sum(b.numel() for b in self._buffers)
        self.local_step = 0
        self.rounds_late = 0        # rounds this rank arrived at after they had closed
        # Whether the last step() adopted a new round (TorchState: commit then).
        self.completed_round = False
        # False under a TorchState (gyre.torch.elastic), which then counts the
        # commits: state.commit() after each step whose completed_round is True.
        self._gyre_auto_commit = True
        self._rounds_before = 0     # rounds of the stores before this one (elastic)
        self.store: Optional[ParameterStore] = None
        self._aggregator: Optional[_Aggregator] = None
        self._store_round = 0
        if gyre.is_replacement():
            # A replacement rank (GYRE_ELASTIC_RESPAWN) joins survivors that
            # are in their recovery: they open the new store in the
            # TorchState's sync, after broadcasting the model and the
            # counters. This rank does the same, in its first sync
            # (_gyre_elastic_sync), so that the collectives pair up.
            return
        self._open_store()

    def _open_store(self) -> None:
        """Collective: the store over the set's ranks now, holding this
        rank's model (every rank's must be the same: the set's first rank's
        is registered), and the aggregator on the set's first rank."""
        process_set = self._process_set
        self._ranks = list(process_set.ranks) if self._sid else list(range(gyre.size()))
        self._n = len(self._ranks)
        self._me = self._ranks.index(gyre.rank())
        n = self._n
        self.store = ParameterStore(process_set, timeout_s=self.timeout_s)
        self.store.register(f"{_PREFIX}.model", self._flat_local())
        for i in range(n):
            self.store.register(f"{_PREFIX}.slot.{i}", torch.zeros(self._np + self._nb + 1))
        # posted: per rank, contributions posted, the version each was made
        # from, and 1 once the rank has stopped training.
        self.store.register(f"{_PREFIX}.posted", torch.zeros(3 * n, dtype=torch.int64))
        # meta (written by the aggregator only): rounds closed, 1 once it has
        # finished, 1 if it failed, then per rank: contributions consumed,
        # the round of its latest merged one, merged late, rejected.
        self.store.register(f"{_PREFIX}.meta", torch.zeros(3 + 4 * n, dtype=torch.int64))
        self._posted = torch.zeros(3 * n, dtype=torch.int64)  # this rank's part of it
        self._shards: Dict[str, int] = {}
        self._final_meta: Optional[torch.Tensor] = None
        self._store_round = 0       # the round of this store's model this rank works from
        self._seen_rejected = 0
        self._synced = torch.empty(self._np)
        self._adopt(self._pull_model())
        if self._me == 0:
            self._aggregator = _Aggregator(self, self._make_outer)
            self._aggregator.start()

    # -- the optimizer's interface ---------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {"inner": self.optimizer.state_dict(), "local_step": self.local_step,
                "version": self.version}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["inner"])
        self.local_step = state["local_step"]

    def step(self, closure: Any = None) -> Any:
        self.completed_round = False
        loss = self.optimizer.step(closure)
        self.local_step += 1
        if self.local_step <= self.warmup_steps or self.local_step % self.period == 0:
            self.round()
        return loss

    def _require_store(self) -> None:
        if self.store is None:
            raise gyre.StateError(
                "PartialLocalSGD: no store: on a replacement rank it is opened by the first sync "
                "of the elastic TorchState holding it (gyre.torch.elastic.run), after a rank's "
                "failure by the recovery's")

    def round(self) -> None:
        """Posts this rank's contribution, waits for the round after its
        version to close (at most late_after_s after the first on-time
        contribution, plus the aggregator's work), and continues from the
        model it pulls."""
        self._require_store()
        me, n = self._me, self._n
        posted = int(self._posted[me])
        # The mailbox is free once the aggregator has consumed the last one.
        self._wait(lambda m: m[3 + me] >= posted, "its previous contribution to be consumed")
        with torch.no_grad():
            pseudo = self._synced - torch.cat([p.detach().reshape(-1).float() for p in self._params])
            contribution = torch.cat([pseudo, self._flat_buffers(), torch.tensor([float(self._store_round + 1)])])
        self._add(f"{_PREFIX}.slot.{me}", contribution)  # into an empty mailbox: exact
        delta = torch.zeros(3 * n, dtype=torch.int64)
        delta[me] = 1
        delta[n + me] = self._store_round - int(self._posted[n + me])
        self._add(f"{_PREFIX}.posted", delta)
        self._posted += delta
        base = self._store_round
        meta = self._wait(lambda m: m[0] > base, f"round {base + 1} to close")
        if meta[3 + n + me] != base + 1:  # round base + 1 closed without this contribution
            self.rounds_late += 1
            log.info("PartialLocalSGD: rank %d is late: %d round(s) closed since round %d, which its "
                     "contribution started from; it goes into a later one or is rejected",
                     gyre.rank(), int(meta[0]) - base, base)
        self._adopt(self._pull_model())
        self._check_rejections(self._meta())

    def close(self) -> None:
        """Collective: tells the aggregator this rank has stopped, waits for
        it to finish (it closes a last round with what was posted), takes
        the final model, and closes the store."""
        self._require_store()
        delta = torch.zeros(3 * self._n, dtype=torch.int64)
        delta[2 * self._n + self._me] = 1
        self._add(f"{_PREFIX}.posted", delta)
        try:
            meta = self._wait(lambda m: m[1] == 1, "the aggregator to finish")
            self._adopt(self._pull_model())
            self._check_rejections(meta)
            self._final_meta = meta
        finally:
            if self._aggregator is not None:
                self._aggregator.join(self.timeout_s)
            self.store.close()

    # -- what the aggregator has published -----------------------------------------

    def merged_rounds(self) -> List[int]:
        """Per rank of the set: the round its latest merged contribution
        went into (0: none yet), as the store holds it now."""
        m = self._meta()
        return [int(x) for x in m[3 + self._n:3 + 2 * self._n]]

    def counters(self) -> Dict[str, Any]:
        """This rank's view: rounds closed, this rank's contributions
        merged late and rejected, its rounds arrived late; and per rank
        (lists) the same merged-late and rejected counts."""
        m, n = self._meta(), self._n
        late = [int(x) for x in m[3 + 2 * n:3 + 3 * n]]
        rejected = [int(x) for x in m[3 + 3 * n:3 + 4 * n]]
        return {"rounds": int(m[0]), "merged_late": late[self._me], "rejected": rejected[self._me],
                "rounds_late": self.rounds_late, "merged_late_by_rank": late,
                "rejected_by_rank": rejected}

    def round_history(self) -> List[Dict[str, Any]]:
        """On the aggregator's rank: every closed round (its number, the
        ranks merged on time, merged late, rejected); elsewhere empty."""
        return list(self._aggregator.history) if self._aggregator else []

    @property
    def version(self) -> int:
        """The round of the model this rank works from, counted over the
        whole training (after an elastic recovery: the rounds before it
        plus the new store's)."""
        return self._rounds_before + self._store_round

    # -- elastic training (gyre.torch.elastic.TorchState) ------------------------

    def register_step_pre_hook(self, hook: Callable) -> Any:
        """The inner optimizer's: ``hook`` runs before every step()."""
        return self.optimizer.register_step_pre_hook(hook)

    def _gyre_elastic_reset(self) -> None:
        """After a rank's death and the rebuild: the store was over the old
        world (its calls now raise RankFailedError) and its aggregator may
        have been on the dead rank. Stops this rank's aggregator, if any,
        and drops the store without a collective; _gyre_elastic_sync opens
        a new one."""
        self.completed_round = False
        if self._aggregator is not None:
            self._aggregator.stop.set()
            self._aggregator.join(self.timeout_s)
            self._aggregator = None
        if self.store is not None:
            self.store.discard()
            self.store = None

    def _gyre_elastic_sync(self, root_rank: int) -> None:
        """Every rank takes ``root_rank``'s inner optimizer state and
        counters (TorchState.sync(), after the model's parameters were
        broadcast from it); after a recovery, a new store over the
        survivors holds that model, version 0 counted on from the rounds
        before (the outer optimizer's state restarts: it was the old
        aggregator's alone)."""
        from gyre.objects import broadcast_object
        from .functions import broadcast_optimizer_state

        broadcast_optimizer_state(self.optimizer, root_rank=root_rank,
                                  process_set=self._process_set)
        counters = broadcast_object({"local_step": self.local_step, "rounds": self.version},
                                    root_rank=root_rank, name="gyre.partial_local_sgd.elastic",
                                    process_set=self._process_set)
        self.local_step = counters["local_step"]
        if self.store is None:
            self._rounds_before = counters["rounds"]
            self._open_store()

    # -- internals -----------------------------------------------------------------

    def _flat_local(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).float() for p in self._params] + [self._flat_buffers()])

    def _flat_buffers(self) -> torch.Tensor:
        if not self._buffers:
            return torch.zeros(0)
        return torch.cat([b.detach().reshape(-1).float() for b in self._buffers])

    def _add(self, name: str, delta: torch.Tensor) -> None:
        """value += delta, whatever the version (the "apply" policy)."""
        shards = self._shards.get(name)
        if shards is None:
            shards = self._shards[name] = len(self.store.shard_owners(name))
        self.store.push(name, delta, (0,) * shards, staleness=None, policy="apply")

    def _meta(self) -> torch.Tensor:
        if self._final_meta is not None:  # closed: what the aggregator left
            return self._final_meta
        self._require_store()
        return self.store.pull(f"{_PREFIX}.meta")[0]

    def _wait(self, ready: Callable[[torch.Tensor], bool], what: str) -> torch.Tensor:
        start = time.monotonic()
        nap = 0.0
        while True:
            if self._final_meta is None:
                # The meta may be this rank's own shard, whose reads go on
                # after a member's death: ask the store whether one died.
                self.store.check_members()
            m = self._meta()
            if m[2]:
                raise gyre.StateError(f"PartialLocalSGD: the aggregator on rank {self._ranks[0]} "
                                      f"failed (its error is in its log); rank {gyre.rank()} was "
                                      f"waiting for {what}")
            if ready(m):
                return m
            if time.monotonic() - start > self.timeout_s:
                raise gyre.TimeoutError(
                    f"PartialLocalSGD: rank {gyre.rank()} waited {self.timeout_s:g} s for {what} "
                    f"(the aggregator runs on rank {self._ranks[0]})")
            nap = min(max(nap * 2, 5e-5), 2e-3)
            time.sleep(nap)

    def _pull_model(self) -> tuple:
        # The aggregator pushes every shard once per round: a pull between
        # two shards' pushes shows two versions; pull again.
        start = time.monotonic()
        while True:
            value, version = self.store.pull(f"{_PREFIX}.model")
            if len(set(version)) == 1:
                return value, version[0]
            if time.monotonic() - start > self.timeout_s:
                raise gyre.TimeoutError(f"PartialLocalSGD: the model's shards stayed at versions "
                                        f"{list(version)} for {self.timeout_s:g} s")

    def _adopt(self, pulled: tuple) -> None:
        value, version = pulled
        with torch.no_grad():
            at = 0
            for t in self._params + self._buffers:
                t.copy_(value[at:at + t.numel()].reshape(t.shape))
                at += t.numel()
            self._synced = value[:self._np].clone()
        # One commit per round: the version vector's entry of this rank is its
        # round (plus the commits before construction), so ranks that have
        # adopted the same round agree, and after close() every rank does.
        if version > self._store_round:
            self.completed_round = True
        if self._gyre_auto_commit:
            for _ in range(version - self._store_round):
                gyre.commit_step()
        self._store_round = version

    def _check_rejections(self, meta: torch.Tensor) -> None:
        rejected = int(meta[3 + 3 * self._n + self._me])
        if rejected > self._seen_rejected:
            log.warning("PartialLocalSGD: rank %d: %d contribution(s) rejected as more than %d "
                        "round(s) stale; it continues from the current model (round %d)",
                        gyre.rank(), rejected - self._seen_rejected, self.max_staleness,
                        self.version)
            self._seen_rejected = rejected

    def __repr__(self) -> str:
        return (f"PartialLocalSGD({type(self.optimizer).__name__}, period={self.period}, "
                f"late_after_s={self.late_after_s:g}, max_staleness={self.max_staleness}, "
                f"version={self.version})")
