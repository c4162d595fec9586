"""The versioned parameter store: parameters sharded across the ranks, each
shard with a version; a worker pulls a tensor with its versions, computes,
and pushes an update with the versions it read; each shard's owner applies
it atomically only if the shard is still current enough, else rejects it
and says which version is current (optimistic concurrency)::

    store = gyre.ps.ParameterStore()           # collective
    store.register("w", w)                     # collective; rank 0's value
    value, version = store.pull("w")
    ok, version = store.push("w", delta, version)   # staleness=0, policy="reject"

Placement: a tensor of at most ``split_bytes`` bytes is one shard, on the
rank holding the fewest bytes so far; a larger one is cut into one shard per
rank. A ``Version`` holds one version per shard. Atomicity is per shard: a
push to a tensor of several shards may be applied on some and rejected on
others; the returned Version's ``rejected`` lists the rejected shards, and
``push(..., shards=version.rejected)`` retries only those. ``pull_many`` and
``push_many`` take several tensors in one call: one request per owner.

Policies, with lag = the shard's version now - the version pushed from, and
``staleness=None`` for no bound:
  ``"reject"``  lag <= staleness: value += delta; else rejected
  ``"scale"``   lag <= staleness: value += delta / (1 + lag); else rejected
  ``"apply"``   always value += delta (fully asynchronous); staleness ignored

Engine and measurements: docs/training-modes.md. CPU tensors (torch, numpy,
DLPack producers) of any dtype gyre reduces.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _gyre
from .basics import check_process_set
from .exceptions import InvalidArgumentError, StateError

__all__ = ["ParameterStore", "Version", "StoreHandle"]


class Version(tuple):
    """The versions of a tensor's shards (a tuple of ints). ``rejected``:
    the shards a push was refused on (empty for a pull's version)."""

    rejected: Tuple[int, ...]

    def __new__(cls, versions: Sequence[int], rejected: Sequence[int] = ()) -> "Version":
        v = super().__new__(cls, (int(x) for x in versions))
        v.rejected = tuple(int(s) for s in rejected)
        return v

    def __repr__(self) -> str:
        return f"Version({list(self)}, rejected={list(self.rejected)})"


class StoreHandle:
    """The completion of a pull_async / push_async: ``wait()`` returns what
    the synchronous call returns (or raises its error); ``poll()`` says
    whether it has completed."""

    def __init__(self, future: "concurrent.futures.Future[Any]") -> None:
        self._future = future

    def poll(self) -> bool:
        return self._future.done()

    def wait(self, timeout: Optional[float] = None) -> Any:
        return self._future.result(timeout)


class _Registered:
    __slots__ = ("shape", "dtype", "kind")

    def __init__(self, tensor: Any) -> None:
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self.kind = type(tensor).__module__.split(".")[0]  # "torch" or "numpy"

    def empty(self) -> Any:
        if self.kind == "torch":
            import torch
            return torch.empty(self.shape, dtype=self.dtype)
        import numpy
        return numpy.empty(self.shape, dtype=self.dtype)


class _Discarded:
    """What a discarded ParameterStore calls instead of its store."""

    def __getattr__(self, name: str) -> Any:
        raise StateError("ParameterStore: the store was discarded (discard()); open a new one")


class ParameterStore:
    """A versioned, sharded parameter store over the ranks of ``process_set``
    (None: every rank). Construction, ``register`` and ``close`` are
    collective (every rank of the set, in the same order); ``pull`` and
    ``push`` are one-sided and may come from any thread. ``timeout_s``: how
    long a request waits for its owner (None: GYRE_STALL_SHUTDOWN_S); an
    owner that does not answer is named in a TimeoutError."""

    def __init__(self, process_set: Any = None, split_bytes: int = 4 << 20,
                 timeout_s: Optional[float] = None) -> None:
        sid = check_process_set(process_set, "ParameterStore")
        if split_bytes < 0:
            raise InvalidArgumentError(f"ParameterStore: split_bytes must be >= 0, got {split_bytes}")
        self._store = _gyre.ParameterStore(sid, int(split_bytes), float(timeout_s or 0))
        self._tensors: Dict[str, _Registered] = {}
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    # -- collective --------------------------------------------------------

    def register(self, name: str, tensor: Any) -> None:
        """Registers ``tensor`` under ``name``: rank 0's (the set's first
        rank's) value becomes the stored value, version 0 in every shard.
        ``tensor`` itself is not modified. A name registered twice, or
        tensors that differ in shape or dtype across the ranks, fail on
        every rank."""
        if hasattr(tensor, "detach"):
            tensor = tensor.detach()
        if hasattr(tensor, "contiguous"):
            tensor = tensor.contiguous()
        self._store.register_tensor(name, tensor)
        self._tensors[name] = _Registered(tensor)

    def close(self) -> None:
        """Collective: waits until every rank has finished its calls, then
        stops serving this rank's shards. Later calls raise StateError."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._store.close()

    def discard(self) -> None:
        """Not collective: stops serving this rank's shards at once and lets
        go of the store, for a store that cannot be closed together: after
        a member's death under elastic training (its calls then raise
        RankFailedError). Later calls raise StateError."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        self._store = _Discarded()

    def __enter__(self) -> "ParameterStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- one-sided ---------------------------------------------------------

    def pull(self, name: str, out: Any = None) -> Tuple[Any, Version]:
        """A copy of the whole tensor (into ``out`` if given, else a new
        tensor like the registered one) and its shards' versions."""
        if out is None:
            out = self._registered(name, "pull").empty()
        versions = self._store.pull(name, out)
        return out, Version(versions)

    def push(self, name: str, delta: Any, base_version: Sequence[int], staleness: Optional[int] = 0,
             policy: str = "reject", shards: Optional[Sequence[int]] = None) -> Tuple[bool, Version]:
        """Pushes ``delta`` computed from ``base_version`` (as pull returned
        it). Returns (ok, version): ok when every shard pushed took it;
        version: each shard's version after the push (the current one where
        it was rejected), with ``version.rejected`` the rejected shards.
        ``shards``: push only these (a retry of the rejected ones)."""
        if hasattr(delta, "detach"):
            delta = delta.detach()
        if hasattr(delta, "contiguous"):
            delta = delta.contiguous()
        if staleness is not None and staleness < 0:
            raise InvalidArgumentError(f"ParameterStore.push: staleness must be >= 0 or None, got {staleness}")
        applied, versions, _, _, rejected = self._store.push(
            name, delta, [int(v) for v in base_version], -1 if staleness is None else int(staleness),
            policy, [] if shards is None else [int(s) for s in shards])
        return bool(applied), Version(versions, rejected)

    def pull_many(self, names: Sequence[str], outs: Optional[Sequence[Any]] = None
                  ) -> List[Tuple[Any, Version]]:
        """pull() of several tensors in one call: one request to each owner
        for all the shards it holds of them. Returns [(tensor, Version)] in
        the order of ``names``; ``outs`` as pull's ``out``, one per name."""
        names = list(names)
        outs = [None] * len(names) if outs is None else list(outs)
        if len(outs) != len(names):
            raise InvalidArgumentError("ParameterStore.pull_many: one output per name")
        outs = [self._registered(n, "pull_many").empty() if o is None else o
                for n, o in zip(names, outs)]
        versions = self._store.pull_many(names, outs)
        return [(o, Version(v)) for o, v in zip(outs, versions)]

    def push_many(self, names: Sequence[str], deltas: Sequence[Any],
                  base_versions: Sequence[Sequence[int]], staleness: Any = 0,
                  policy: Any = "reject",
                  shards: Optional[Sequence[Optional[Sequence[int]]]] = None
                  ) -> List[Tuple[bool, Version]]:
        """push() of several tensors in one call: one request to each owner
        for all the shards it holds of them. Returns [(ok, Version)] in the
        order of ``names``. ``staleness`` and ``policy``: one for all, or a
        sequence of one per name; ``shards``: None, or one entry per name as
        push's. Atomic per shard, as push is; a request its owner refuses
        (a base version it never had) changes nothing there."""
        names = list(names)
        n = len(names)
        stale = list(staleness) if isinstance(staleness, (list, tuple)) else [staleness] * n
        policies = [policy] * n if isinstance(policy, str) else list(policy)
        only = [None] * n if shards is None else list(shards)
        if not (len(deltas) == len(base_versions) == len(stale) == len(policies) == len(only) == n):
            raise InvalidArgumentError(
                "ParameterStore.push_many: one delta, base version, staleness, policy and shard "
                "list per name")
        for s in stale:
            if s is not None and s < 0:
                raise InvalidArgumentError(
                    f"ParameterStore.push_many: staleness must be >= 0 or None, got {s}")
        prepared = []
        for d in deltas:
            if hasattr(d, "detach"):
                d = d.detach()
            if hasattr(d, "contiguous"):
                d = d.contiguous()
            prepared.append(d)
        results = self._store.push_many(
            names, prepared, [[int(v) for v in b] for b in base_versions],
            [-1 if s is None else int(s) for s in stale], policies,
            [[] if o is None else [int(x) for x in o] for o in only])
        return [(bool(r[0]), Version(r[1], r[4])) for r in results]

    def pull_async(self, name: str, out: Any = None) -> StoreHandle:
        """pull() on a thread of the store's; ``wait()`` returns (tensor, Version)."""
        return StoreHandle(self._executor().submit(self.pull, name, out))

    def push_async(self, name: str, delta: Any, base_version: Sequence[int],
                   staleness: Optional[int] = 0, policy: str = "reject",
                   shards: Optional[Sequence[int]] = None) -> StoreHandle:
        """push() on a thread of the store's; ``wait()`` returns (ok, Version).
        ``delta`` must not change until then."""
        return StoreHandle(self._executor().submit(self.push, name, delta, base_version, staleness,
                                                   policy, shards))

    def check_members(self) -> None:
        """Raises RankFailedError if this rank's store server has stopped
        because a member died (under ULFM; it sees that within
        milliseconds), StateError if it stopped on another error. Calls on
        this rank's own shards do not check it (they go on after a death):
        a loop that may read only its own shards while it waits for the
        others calls this to learn of a death."""
        self._store.check_members()

    def shard_owners(self, name: str) -> List[int]:
        """The rank owning each shard of ``name``."""
        return list(self._store.shard_owners(name))

    def stats(self) -> Dict[str, int]:
        """This rank's counters: pulls, pushes (per shard), pushes_applied,
        pushes_rejected, pushes_scaled, served_requests (by its server),
        max_lag_seen."""
        return dict(self._store.stats())

    def _registered(self, name: str, call: str) -> _Registered:
        try:
            return self._tensors[name]
        except KeyError:
            raise InvalidArgumentError(f"ParameterStore.{call}: no tensor '{name}' is registered") from None

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gyre-ps")
        return self._pool
