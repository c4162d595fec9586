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

Streaming (``fragments=F``, ``sync_delay=D``), as in LocalSGD: the
parameters are cut into F fragments (contiguous in parameter order, balanced
by size; the buffers go with the last), each with its own model, mailboxes,
rounds and aggregator thread in the store. Fragment f's rounds fall at the
steps where ``step % period == (f + 1) * period // F % period``. With D > 0 a
rank posts the fragment's contribution and goes on training; D steps later
it waits for a round after the one it started from to close and merges:
local = the round's model + the inner steps taken meanwhile (local now -
local at the post; the buffers likewise), LocalSGD's default merge. The late and stale rules hold per fragment. Every
fragment round adopted is a commit; ``fragment_versions()`` gives, per
fragment, the round this rank holds, and ``version`` their sum.
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

from ._partial_local_sgd_aggregator import _PREFIX, _Aggregator, _Part
from .local_sgd import _fragment_bounds, _streaming_step

__all__ = ["PartialLocalSGD"]

log = logging.getLogger("gyre.torch.local_sgd")


class PartialLocalSGD(OptimizerWrapper):
    """Local SGD whose rounds close without late ranks; see the module
    docstring. Construction and close() are collective."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, period: int,
                 late_after_s: float, max_staleness: int = 1,
                 outer_optimizer: Optional[Callable[[List[torch.Tensor]], torch.optim.Optimizer]] = None,
                 process_set: Any = None, timeout_s: Optional[float] = None,
                 warmup_steps: int = 0, fragments: int = 1, sync_delay: int = 0) -> None:
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
        if not 1 <= fragments <= period:
            raise InvalidArgumentError(
                f"PartialLocalSGD: fragments must be between 1 and period ({period}), got {fragments}")
        if not 0 <= sync_delay < period:
            raise InvalidArgumentError(
                f"PartialLocalSGD: sync_delay must be >= 0 and < period ({period}), got {sync_delay}")
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
        if len(self._params) < fragments:
            raise InvalidArgumentError(
                f"PartialLocalSGD: {fragments} fragments but only {len(self._params)} parameters")
        self.sync_delay = sync_delay
        cuts = _fragment_bounds([p.numel() for p in self._params], fragments)
        self._parts = [
            _Part(f, _PREFIX if fragments == 1 else f"{_PREFIX}.f{f}",
                  self._params[cuts[f]:cuts[f + 1]],
                  self._buffers if f == fragments - 1 else [],
                  ((f + 1) * period // fragments) % period)
            for f in range(fragments)]
        self.local_step = 0
        self.rounds_late = 0        # rounds this rank arrived at after they had closed
        # Whether the last step() adopted a new round (TorchState: commit then).
        self.completed_round = False
        # False under a TorchState (gyre.torch.elastic), which then counts the
        # commits: state.commit() after each step whose completed_round is True.
        self._gyre_auto_commit = True
        self._rounds_before = 0     # rounds of the stores before this one (elastic)
        self.store: Optional[ParameterStore] = None
        self._shards: Dict[str, int] = {}
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
        self._shards = {}
        for part in self._parts:
            part.reset()
            self.store.register(f"{part.prefix}.model", part.flat_local())
            for i in range(n):
                self.store.register(f"{part.prefix}.slot.{i}", torch.zeros(part.np + part.nb + 1))
            # posted: per rank, contributions posted, the version each was
            # made from, and 1 once the rank has stopped training.
            self.store.register(f"{part.prefix}.posted", torch.zeros(3 * n, dtype=torch.int64))
            # meta (written by the aggregator only): rounds closed, 1 once it
            # has finished, 1 if it failed, then per rank: contributions
            # consumed, the round of its latest merged one, merged late,
            # rejected.
            self.store.register(f"{part.prefix}.meta", torch.zeros(3 + 4 * n, dtype=torch.int64))
            part.posted = torch.zeros(3 * n, dtype=torch.int64)  # this rank's part of it
        for part in self._parts:
            self._adopt(part, self._pull_model(part))
        if self._me == 0:
            for part in self._parts:
                part.aggregator = _Aggregator(self, part, self._make_outer)
                part.aggregator.start()

    # -- the optimizer's interface ---------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {"inner": self.optimizer.state_dict(), "local_step": self.local_step,
                "version": self.version}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["inner"])
        self.local_step = state["local_step"]
        if self.store is None and "version" in state:
            # A TorchState's restore, after the store was dropped
            # (_gyre_elastic_reset): the rounds go back to the commit's too
            # (a step that failed after adopting a fragment's round had
            # counted it), and the next store counts on from there.
            self._rounds_before = int(state["version"])
            for part in self._parts:
                part.store_round = 0

    def step(self, closure: Any = None) -> Any:
        self.completed_round = False
        loss = self.optimizer.step(closure)
        self.local_step += 1
        if self.local_step <= self.warmup_steps:
            self.round()
            return loss
        _streaming_step(self.local_step, self.period, self.sync_delay, self._parts,
                        lambda p: p.base is not None, self._post, self._finish)
        return loss

    def _require_store(self) -> None:
        if self.store is None:
            raise gyre.StateError(
                "PartialLocalSGD: no store: on a replacement rank it is opened by the first sync "
                "of the elastic TorchState holding it (gyre.torch.elastic.run), after a rank's "
                "failure by the recovery's")

    def round(self) -> None:
        """A round of every fragment now: the rounds in flight complete,
        then each fragment posts this rank's contribution, waits for a round
        after its version to close (at most late_after_s after the first
        on-time contribution, plus the aggregator's work), and continues
        from the model it pulls."""
        self._require_store()
        for part in self._parts:
            self._finish(part)
        for part in self._parts:
            self._post(part)
            self._finish(part)

    def _post(self, part: _Part) -> None:
        """Posts this rank's contribution to ``part``'s round; _finish waits
        for it."""
        self._require_store()
        me, n = self._me, self._n
        posted = int(part.posted[me])
        # The mailbox is free once the aggregator has consumed the last one.
        self._wait(part, lambda m: m[3 + me] >= posted, "its previous contribution to be consumed")
        with torch.no_grad():
            local = part.flat_params()
            contribution = torch.cat([part.synced - local, part.flat_buffers(),
                                      torch.tensor([float(part.store_round + 1)])])
        self._add(f"{part.prefix}.slot.{me}", contribution)  # into an empty mailbox: exact
        delta = torch.zeros(3 * n, dtype=torch.int64)
        delta[me] = 1
        delta[n + me] = part.store_round - int(part.posted[n + me])
        self._add(f"{part.prefix}.posted", delta)
        part.posted += delta
        part.base = part.store_round
        part.due = self.local_step + self.sync_delay
        part.at_post = part.flat_local() if self.sync_delay else None

    def _finish(self, part: _Part) -> None:
        """Waits for a round of ``part`` after the one its contribution in
        flight started from, and adopts it (with the inner steps taken since
        the post on top, under a sync delay)."""
        if part.base is None:
            return
        me, n, base = self._me, self._n, part.base
        meta = self._wait(part, lambda m: m[0] > base, self._round_name(part, base + 1) + " to close")
        if meta[3 + n + me] != base + 1:  # round base + 1 closed without this contribution
            self.rounds_late += 1
            log.info("PartialLocalSGD: rank %d is late: %d round(s) closed since %s, which its "
                     "contribution started from; it goes into a later one or is rejected",
                     gyre.rank(), int(meta[0]) - base, self._round_name(part, base))
        self._adopt(part, self._pull_model(part))
        part.base = None
        part.at_post = None
        self._check_rejections(part, self._meta(part))

    def close(self) -> None:
        """Collective: completes this rank's rounds in flight, tells the
        aggregators this rank has stopped, waits for them to finish (each
        closes a last round with what was posted), takes the final model,
        and closes the store."""
        self._require_store()
        try:
            for part in self._parts:
                self._finish(part)
            for part in self._parts:
                delta = torch.zeros(3 * self._n, dtype=torch.int64)
                delta[2 * self._n + self._me] = 1
                self._add(f"{part.prefix}.posted", delta)
            for part in self._parts:
                meta = self._wait(part, lambda m: m[1] == 1, "the aggregator to finish")
                self._adopt(part, self._pull_model(part))
                self._check_rejections(part, meta)
                part.final_meta = meta
        finally:
            for part in self._parts:
                if part.aggregator is not None:
                    part.aggregator.join(self.timeout_s)
            self.store.close()

    # -- what the aggregator has published -----------------------------------------

    def merged_rounds(self, fragment: int = 0) -> List[int]:
        """Per rank of the set: the round of ``fragment`` its latest merged
        contribution went into (0: none yet), as the store holds it now."""
        m = self._meta(self._parts[fragment])
        return [int(x) for x in m[3 + self._n:3 + 2 * self._n]]

    def counters(self) -> Dict[str, Any]:
        """This rank's view, summed over the fragments: rounds closed, this
        rank's contributions merged late and rejected, its rounds arrived
        late; and per rank (lists) the same merged-late and rejected
        counts."""
        n = self._n
        rounds, late, rejected = 0, [0] * n, [0] * n
        for part in self._parts:
            m = self._meta(part)
            rounds += int(m[0])
            late = [a + int(x) for a, x in zip(late, m[3 + 2 * n:3 + 3 * n])]
            rejected = [a + int(x) for a, x in zip(rejected, m[3 + 3 * n:3 + 4 * n])]
        return {"rounds": rounds, "merged_late": late[self._me], "rejected": rejected[self._me],
                "rounds_late": self.rounds_late, "merged_late_by_rank": late,
                "rejected_by_rank": rejected}

    def round_history(self, fragment: int = 0) -> List[Dict[str, Any]]:
        """On the aggregator's rank: every closed round of ``fragment`` (its
        number, the ranks merged on time, merged late, rejected); elsewhere
        empty."""
        agg = self._parts[fragment].aggregator
        return list(agg.history) if agg else []

    def fragment_versions(self) -> List[int]:
        """Per fragment, the round of it this rank's parameters hold (of
        this store: an elastic recovery opens a new one)."""
        return [part.store_round for part in self._parts]

    def fragment_parameters(self, index: int) -> List[torch.Tensor]:
        """The model's parameters in fragment ``index`` (in model order)."""
        return list(self._parts[index].params)

    @property
    def fragments(self) -> int:
        return len(self._parts)

    @property
    def version(self) -> int:
        """The fragment rounds this rank's model has adopted, counted over
        the whole training (after an elastic recovery: the rounds before it
        plus the new store's); with one fragment, the model's round."""
        return self._rounds_before + sum(part.store_round for part in self._parts)

    # -- elastic training (gyre.torch.elastic.TorchState) ------------------------

    def register_step_pre_hook(self, hook: Callable) -> Any:
        """The inner optimizer's: ``hook`` runs before every step()."""
        return self.optimizer.register_step_pre_hook(hook)

    def _gyre_elastic_reset(self) -> None:
        """After a rank's death and the rebuild: the store was over the old
        world (its calls now raise RankFailedError) and its aggregator may
        have been on the dead rank. Stops this rank's aggregators, if any,
        and drops the store without a collective, with the fragments' rounds
        in flight; _gyre_elastic_sync opens a new one, whose model is the
        sync root's parameters (so the root's inner steps since a fragment's
        last merged round stay in the model, without an outer step, and the
        other ranks' are replaced by the root's)."""
        self.completed_round = False
        for part in self._parts:
            if part.aggregator is not None:
                part.aggregator.stop.set()
                part.aggregator.join(self.timeout_s)
                part.aggregator = None
            part.base = part.at_post = None  # a round in flight went with the store
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

    def _add(self, name: str, delta: torch.Tensor) -> None:
        """value += delta, whatever the version (the "apply" policy)."""
        shards = self._shards.get(name)
        if shards is None:
            shards = self._shards[name] = len(self.store.shard_owners(name))
        self.store.push(name, delta, (0,) * shards, staleness=None, policy="apply")

    def _round_name(self, part: _Part, r: int) -> str:
        return f"round {r}" if len(self._parts) == 1 else f"round {r} of fragment {part.index}"

    def _meta(self, part: _Part) -> torch.Tensor:
        if part.final_meta is not None:  # closed: what the aggregator left
            return part.final_meta
        self._require_store()
        return self.store.pull(f"{part.prefix}.meta")[0]

    def _wait(self, part: _Part, ready: Callable[[torch.Tensor], bool], what: str) -> torch.Tensor:
        start = time.monotonic()
        nap = 0.0
        while True:
            if part.final_meta is None:
                # The meta may be this rank's own shard, whose reads go on
                # after a member's death: ask the store whether one died.
                self.store.check_members()
            m = self._meta(part)
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

    def _pull_model(self, part: _Part) -> tuple:
        # The aggregator pushes every shard once per round: a pull between
        # two shards' pushes shows two versions; pull again.
        start = time.monotonic()
        while True:
            value, version = self.store.pull(f"{part.prefix}.model")
            if len(set(version)) == 1:
                return value, version[0]
            if time.monotonic() - start > self.timeout_s:
                raise gyre.TimeoutError(f"PartialLocalSGD: the model's shards stayed at versions "
                                        f"{list(version)} for {self.timeout_s:g} s")

    def _adopt(self, part: _Part, pulled: tuple) -> None:
        value, version = pulled
        with torch.no_grad():
            new = value
            if part.at_post is not None:
                # Under a sync delay: the inner steps since the post (and the
                # buffers' updates) stay on top of the round's model, as in
                # LocalSGD's default merge.
                new = value + (part.flat_local() - part.at_post)
            at = 0
            for t in part.params + part.buffers:
                t.copy_(new[at:at + t.numel()].reshape(t.shape))
                at += t.numel()
            part.synced = value[:part.np].clone()
        # One commit per round: the version vector's entry of this rank counts
        # the fragment rounds it has adopted (plus the commits before
        # construction), so ranks that have adopted the same rounds agree, and
        # after close() every rank does.
        if version > part.store_round:
            self.completed_round = True
        if self._gyre_auto_commit:
            for _ in range(version - part.store_round):
                gyre.commit_step()
        part.store_round = version

    def _check_rejections(self, part: _Part, meta: torch.Tensor) -> None:
        rejected = int(meta[3 + 3 * self._n + self._me])
        if rejected > part.seen_rejected:
            log.warning("PartialLocalSGD: rank %d: %d contribution(s)%s rejected as more than %d "
                        "round(s) stale; it continues from the current model (round %d)",
                        gyre.rank(), rejected - part.seen_rejected,
                        "" if len(self._parts) == 1 else f" to fragment {part.index}",
                        self.max_staleness, part.store_round)
            part.seen_rejected = rejected

    def __repr__(self) -> str:
        return (f"PartialLocalSGD({type(self.optimizer).__name__}, period={self.period}, "
                f"late_after_s={self.late_after_s:g}, max_staleness={self.max_staleness}, "
                f"fragments={len(self._parts)}, sync_delay={self.sync_delay}, "
                f"version={self.version})")
