"""Asynchronous and bounded-staleness training on the versioned parameter
store (gyre.ps): no collective per step; each rank steps on its own.

    opt = gyre.torch.AsyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    model.named_parameters(), staleness=2)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.close()

A step: the wrapped optimizer steps on the parameters this rank last pulled;
the difference it made (the update), divided by the number of ranks
(``op=gyre.Average``, the default), is pushed to the parameters' owners with
the versions it was computed from; then the parameters are pulled fresh
(values and versions) for the next step. The push and the pull are each one
request per owner for all the parameters it holds (and the clock below),
whatever the number of parameters: ParameterStore.push_many / pull_many.
Every rank starts from rank 0's parameters (registration is collective).

Why divided: the wrapped optimizer's learning rate means what it means under
DistributedOptimizer, a step on the gradient averaged over the ranks. The
ranks push independently, so without the division N pushes of the same
gradient add up to N synchronous steps (N times the learning rate). Each
rank's optimizer keeps its own state (momentum) from its own gradients; for
SGD with momentum and weight decay the update is linear in them, so when
the N ranks' gradients of a round are taken at the same parameters, their N
averaged pushes add up to exactly the synchronous step of the averaged
gradient (tested). ``op=gyre.Sum`` pushes the update
as the optimizer made it.

``staleness`` bounds two things:
  - the clock: a rank that has finished ``staleness`` more steps than the
    slowest rank waits for it before stepping again (stale synchronous
    parallel; None: never waits). The clock is a vector of every rank's
    completed steps, kept in the store itself and read one-sidedly, so a
    slow rank holds the others only through this bound.
  - with ``policy`` "reject" or "scale", each push: a shard that has taken
    more than ``staleness`` other updates since the pull rejects it (the
    update is dropped, counted, and the rank goes on from the fresh values:
    the design's strict rule at ``staleness=0``), or, "scale", takes it
    divided by 1 + lag. "apply" takes every update (the clock still bounds
    how stale it can be). Default: "reject" at ``staleness=0``, else "apply".
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

import gyre
from gyre.torch._wrapper import OptimizerWrapper
from gyre.basics import check_process_set
from gyre.exceptions import InvalidArgumentError
from gyre.ps import ParameterStore, Version
from gyre.reduction import Average, Sum

__all__ = ["AsyncOptimizer"]

_CLOCK = "gyre.async_optimizer.clock"


class AsyncOptimizer(OptimizerWrapper):
    """Wraps ``optimizer`` (any torch.optim.Optimizer) for asynchronous or
    bounded-staleness training through a gyre.ps.ParameterStore; collective
    to construct and to close(). See the module's docstring."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Iterable[Tuple[str, torch.nn.Parameter]],
                 staleness: Optional[int] = 0, policy: Optional[str] = None,
                 process_set: Any = None, split_bytes: int = 4 << 20,
                 timeout_s: Optional[float] = None, op: Any = Average) -> None:
        if staleness is not None and staleness < 0:
            raise InvalidArgumentError(f"AsyncOptimizer: staleness must be >= 0 or None, got {staleness}")
        if policy is None:
            policy = "reject" if staleness == 0 else "apply"
        if policy not in ("reject", "scale", "apply"):
            raise InvalidArgumentError(
                f"AsyncOptimizer: policy must be 'reject', 'scale' or 'apply', not {policy!r}")
        if op not in (Average, Sum):
            raise InvalidArgumentError(
                f"AsyncOptimizer: op must be gyre.Average or gyre.Sum, not {op!r}")
        self.optimizer = optimizer
        self.staleness = staleness
        self.policy = policy
        self._params: List[Tuple[str, torch.nn.Parameter]] = list(named_parameters)
        names = [n for n, _ in self._params]
        if len(set(names)) != len(names):
            raise InvalidArgumentError("AsyncOptimizer: named_parameters has duplicate names")
        in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in self._params if id(p) not in in_optimizer]
        if missing:
            raise InvalidArgumentError(
                f"AsyncOptimizer: parameters not in the optimizer: {', '.join(missing)}")
        sid = check_process_set(process_set, "AsyncOptimizer")
        self.store = ParameterStore(process_set, split_bytes=split_bytes, timeout_s=timeout_s)
        self._ranks = list(process_set.ranks) if sid else list(range(gyre.size()))
        self._me = self._ranks.index(gyre.rank())
        self.op = op
        # What each rank's update is multiplied by before it is pushed.
        self.push_scale = 1.0 / len(self._ranks) if op == Average else 1.0
        if timeout_s is None:
            timeout_s = float(os.environ.get("GYRE_STALL_SHUTDOWN_S", "600") or 0)
        self._timeout_s = timeout_s
        for name, p in self._params:
            self.store.register(name, p.data)
        self.store.register(_CLOCK, torch.zeros(len(self._ranks), dtype=torch.int64))
        self._names = names + [_CLOCK]
        self._versions: Dict[str, Version] = {}
        self._base: Dict[str, torch.Tensor] = {}
        self._clock_base: Version = Version([0])
        self._clock_seen: List[int] = [0] * len(self._ranks)
        self._pull_all()
        self._tick = torch.zeros(len(self._ranks), dtype=torch.int64)
        self._tick[self._me] = 1
        self.steps = 0
        self.updates_applied = 0    # parameter pushes taken in full (per shard)
        self.updates_rejected = 0   # dropped: too stale under "reject"/"scale"
        self.updates_scaled = 0
        self.waited_s = 0.0         # time spent waiting for slower ranks (the clock)

    # -- the optimizer's interface (and OptimizerWrapper's) --------------------

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def step(self, closure: Any = None) -> Any:
        self._wait_for_slowest()
        loss = self.optimizer.step(closure)
        # One push request to each owner for every parameter it holds and the
        # clock, then one pull request likewise (docs/training-modes.md).
        with torch.no_grad():
            deltas = [p.data - self._base[name] for name, p in self._params]
            if self.push_scale != 1.0:
                for d in deltas:
                    d.mul_(self.push_scale)
        n = len(self._params)
        results = self.store.push_many(
            self._names, deltas + [self._tick],
            [self._versions[name] for name, _ in self._params] + [self._clock_base],
            staleness=[self.staleness] * n + [None], policy=[self.policy] * n + ["apply"])
        for _, version in results[:n]:
            self.updates_rejected += len(version.rejected)
            self.updates_applied += len(version) - len(version.rejected)
        self.updates_scaled = self.store.stats()["pushes_scaled"]
        self._pull_all()
        self.steps += 1
        return loss

    # -- the clock -------------------------------------------------------------

    def clock(self) -> List[int]:
        """Every rank's completed steps (by index in the process set), as the
        store holds them now."""
        value, self._clock_base = self.store.pull(_CLOCK)
        self._clock_seen = [int(v) for v in value]
        return list(self._clock_seen)

    def pulled_clock(self) -> List[int]:
        """The clock as pulled with the parameters at the end of this rank's
        last step (no request): the completed steps the parameters it holds
        were pulled beside."""
        return list(self._clock_seen)

    def pull(self) -> None:
        """Pulls every parameter fresh into the model (one request per
        owner), e.g. to evaluate the store's values once all ranks stopped."""
        self._pull_all()

    def lag_behind_fastest(self) -> List[int]:
        """For each rank, how many steps it is behind the fastest."""
        c = self.clock()
        return [max(c) - v for v in c]

    def _wait_for_slowest(self) -> None:
        if self.staleness is None:
            return
        # The clock pulled with the parameters at the end of the last step
        # is enough when it already allows this step (clocks only grow).
        if min(self._clock_seen) >= self.steps - self.staleness:
            return
        start = time.monotonic()
        nap = 0.0
        while True:
            clock = self.clock()
            if min(clock) >= self.steps - self.staleness:
                break
            if self._timeout_s and time.monotonic() - start > self._timeout_s:
                slow = [self._ranks[i] for i, c in enumerate(clock) if c == min(clock)]
                raise gyre.TimeoutError(
                    f"AsyncOptimizer: rank {gyre.rank()} finished {self.steps} steps and may be at "
                    f"most {self.staleness} ahead, but ranks {slow} are still at {min(clock)} after "
                    f"{self._timeout_s:g} s (did they stop stepping?)")
            # The slowest rank's next push of its clock is what this waits
            # for; naps grow to 2 ms so that a waiting rank leaves the core.
            nap = min(max(nap * 2, 5e-5), 2e-3)
            time.sleep(nap)
        self.waited_s += time.monotonic() - start

    def _pull_all(self) -> None:
        """Every parameter and the clock, in one request per owner: into the
        tensors the updates are measured from (one copy from the owners'
        snapshots), then into the parameters."""
        outs = [self._base.get(name) for name, _ in self._params] + [None]
        pulled = self.store.pull_many(self._names, outs)
        with torch.no_grad():
            for (name, p), (value, version) in zip(self._params, pulled):
                p.data.copy_(value)
                self._base[name] = value
                self._versions[name] = version
        clock, self._clock_base = pulled[-1]
        self._clock_seen = [int(v) for v in clock]

    def close(self) -> None:
        """Collective: every rank has finished stepping; stops the store."""
        self.store.close()

    def __repr__(self) -> str:
        return (f"AsyncOptimizer({type(self.optimizer).__name__}, staleness={self.staleness}, "
                f"policy={self.policy!r}, push_scale={self.push_scale:g}, steps={self.steps})")
