"""Local SGD, DiLoCo and streaming DiLoCo: H local steps, then an outer round.

    opt = gyre.torch.LocalSGD(torch.optim.AdamW(model.parameters()), model, period=16,
                              outer_optimizer=gyre.torch.LocalSGD.diloco_outer)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

``step()`` runs the inner optimizer on this rank's parameters alone. Every
``period`` steps (every step during the first ``warmup_steps``) an outer
round: the pseudo-gradients theta_synced - theta_local of every parameter
are averaged over the ranks in one fused grouped allreduce (optionally in
float16/bfloat16: ``compression=gyre.Compression.fp16``, or 8-bit:
``compression=LocalSGD.int8``), the outer optimizer steps the synchronised
parameters with them as gradients, and the result is every rank's
parameters again. Buffers (BatchNorm statistics) are averaged in the same
round. Default outer optimizer: plain averaging (SGD, lr 1, which makes
theta_synced the mean of the ranks' theta_local); DiLoCo's is
``LocalSGD.diloco_outer`` (SGD, lr 0.7, Nesterov momentum 0.9), or pass any
``callable(params) -> torch.optim.Optimizer``.

Streaming (``fragments=F``, ``sync_delay=D``): the parameters are cut into F
fragments, contiguous in parameter order and balanced by size. Fragment f's
round starts at the local steps s with s % period == ((f + 1) * period // F)
% period (the last fragment at the multiples of period, the others spread
over the period); its allreduce is started asynchronously and completed D
inner steps later, so the communication overlaps those steps. At completion
the outer optimizer steps that fragment's synchronised parameters and the
local ones become ``synced_new + (local_now - local_at_start)`` (the D inner
steps taken meanwhile are kept on top of the new synchronised values; with
D = 0 simply ``synced_new``), or with ``mixing=alpha``
``alpha * local_now + (1 - alpha) * synced_new``. Buffers travel with the
last fragment. F = 1, D = 0 is the unfragmented round above.

Each completed round (of a fragment) is a commit: ``gyre.commit_step()``
counts it in the version vector, and ``fragment_versions()`` says which
commit each fragment of this rank's parameters includes (the value of
``gyre.committed_steps()`` right after that fragment's last round; 0: none
yet). Every rank must call step() the same number of times. On a process set
other than the global one a round is not a commit (the version vector is the
job's: the set's members would run ahead of the other ranks, whose next
job-wide collective would then fail as a divergence), and
``fragment_versions()`` counts each fragment's rounds.

Elastic training (gyre.torch.elastic, docs/training-modes.md): pass the
LocalSGD as a TorchState's optimizer and call ``state.commit()`` after the
steps whose ``completed_round`` is True. The TorchState then counts the
commits (a round no longer calls ``gyre.commit_step()`` itself; the
fragments' versions are those of the commits made after their rounds), saves
the synchronised parameters and the outer optimizer's state with the inner
optimizer's, and after a rank's death every survivor goes back to the last
such commit, synchronised from one rank. Only with the global process set
(the rebuild drops the others). With a sync delay a commit may fall while a
fragment's round is in flight: it holds the state from before that round,
and a recovery drops the round (its fragment's next round carries the steps
since the last one completed).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

import torch

import gyre
from gyre.torch._wrapper import OptimizerWrapper
from gyre.compression import Compression, Compressor
from gyre.basics import check_process_set
from gyre.exceptions import InvalidArgumentError

__all__ = ["LocalSGD"]


class Int8Quantization:
    """Marker for ``LocalSGD(compression=LocalSGD.int8)``: pseudo-gradients
    travel as int8 with one float32 scale per block of ``block`` values
    (absmax / 127), gathered from every rank (an allgather: 8-bit values
    cannot be summed in 8 bits) and averaged in float32 in rank order, which
    gives every rank the same result. The error per value is at most half
    its block's scale. Buffers travel in float32."""

    block = 256


def _fragment_bounds(sizes: List[int], fragments: int) -> List[int]:
    """Cut points (len fragments + 1) splitting the parameters, in order,
    into ``fragments`` non-empty runs whose sizes are as even as the order
    allows: each cut at the prefix sum nearest f * total / fragments."""
    prefix = [0]
    for n in sizes:
        prefix.append(prefix[-1] + n)
    total = prefix[-1]
    cuts = [0]
    for f in range(1, fragments):
        target = f * total / fragments
        lo, hi = cuts[-1] + 1, len(sizes) - (fragments - f)
        cuts.append(min(range(lo, hi + 1), key=lambda i: (abs(prefix[i] - target), i)))
    cuts.append(len(sizes))
    return cuts


def _streaming_step(step: int, period: int, sync_delay: int, fragments: list,
                    in_flight: Callable[[Any], bool], start: Callable[[Any], None],
                    finish: Callable[[Any], None]) -> None:
    """One step of the schedule LocalSGD and PartialLocalSGD share (after the
    warm-up): the fragments' rounds due now complete before new ones start
    (a fragment's next round starts a period after its last, after
    sync_delay < period); then each fragment whose step it is (its
    ``offset``) starts a round, completed at once without a delay."""
    for frag in fragments:
        if in_flight(frag) and frag.due <= step:
            finish(frag)
    for frag in fragments:
        if step % period == frag.offset:
            start(frag)
            if sync_delay == 0:
                finish(frag)


class _Fragment:
    __slots__ = ("index", "params", "synced", "offset", "buffers", "handle", "packed", "started", "due",
                 "at_start", "buffers_at_start", "rounds", "version")

    def __init__(self, index: int, params: List[torch.Tensor], synced: List[torch.nn.Parameter],
                 offset: int, buffers: List[torch.Tensor]) -> None:
        self.index = index
        self.params = params
        self.synced = synced
        self.offset = offset
        self.buffers = buffers
        self.handle: Any = None
        self.packed: Any = None
        self.started = 0
        self.due = 0
        self.at_start: List[torch.Tensor] = []
        self.buffers_at_start: List[torch.Tensor] = []
        self.rounds = 0
        self.version = 0


class LocalSGD(OptimizerWrapper):
    """Local SGD / DiLoCo / streaming DiLoCo around ``optimizer`` for
    ``model``; see the module docstring. Construction is collective (rank
    0's parameters and buffers are broadcast, so every rank starts from the
    same model)."""

    diloco_outer = staticmethod(functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True))
    int8 = Int8Quantization

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, period: int,
                 outer_optimizer: Optional[Callable[[List[torch.Tensor]], torch.optim.Optimizer]] = None,
                 warmup_steps: int = 0, process_set: Any = None,
                 compression: type = Compression.none, fragments: int = 1, sync_delay: int = 0,
                 mixing: Optional[float] = None) -> None:
        if period < 1:
            raise InvalidArgumentError(f"LocalSGD: period must be >= 1, got {period}")
        if warmup_steps < 0:
            raise InvalidArgumentError(f"LocalSGD: warmup_steps must be >= 0, got {warmup_steps}")
        if not (compression is Int8Quantization or
                (isinstance(compression, type) and issubclass(compression, Compressor))):
            raise InvalidArgumentError("LocalSGD: compression must be one of gyre.Compression's "
                                       "or LocalSGD.int8")
        if not 1 <= fragments <= period:
            raise InvalidArgumentError(
                f"LocalSGD: fragments must be between 1 and period ({period}), got {fragments}")
        if not 0 <= sync_delay < period:
            raise InvalidArgumentError(
                f"LocalSGD: sync_delay must be >= 0 and < period ({period}), got {sync_delay}")
        if mixing is not None and not 0.0 <= mixing <= 1.0:
            raise InvalidArgumentError(f"LocalSGD: mixing must be None or in [0, 1], got {mixing}")
        check_process_set(process_set, "LocalSGD")
        self.optimizer = optimizer
        self.model = model
        self.period = period
        self.warmup_steps = warmup_steps
        self.process_set = process_set if process_set is not None else gyre.global_process_set
        self.compression = compression
        self.sync_delay = sync_delay
        self.mixing = mixing
        self._params = [p for p in model.parameters() if p.requires_grad]
        if len(self._params) < fragments:
            raise InvalidArgumentError(
                f"LocalSGD: {fragments} fragments but only {len(self._params)} parameters")
        self._buffers = [b for b in model.buffers() if b.dtype.is_floating_point]
        with torch.no_grad():
            for i, t in enumerate(self._params + list(model.buffers())):
                t.copy_(gyre.broadcast(t.detach(), 0, name=f"gyre.local_sgd.init.{i}",
                                       process_set=self.process_set))
        # The synchronised parameters, which the outer optimizer steps.
        self._synced = [torch.nn.Parameter(p.detach().clone()) for p in self._params]
        make = outer_optimizer or functools.partial(torch.optim.SGD, lr=1.0)
        self.outer_optimizer = make(self._synced)
        cuts = _fragment_bounds([p.numel() for p in self._params], fragments)
        self._fragments = [
            _Fragment(f, self._params[cuts[f]:cuts[f + 1]], self._synced[cuts[f]:cuts[f + 1]],
                      ((f + 1) * period // fragments) % period,
                      self._buffers if f == fragments - 1 else [])
            for f in range(fragments)]
        self.local_step = 0
        self.rounds = 0
        # Whether the last step() or sync() completed a round (of a fragment).
        self.completed_round = False
        # False under a TorchState, which counts the commits itself
        # (gyre.torch.elastic); then the fragments whose rounds completed
        # since the last commit take that commit's version.
        self._gyre_auto_commit = True
        self._uncommitted: List[_Fragment] = []

    # -- the optimizer's interface (and OptimizerWrapper's) --------------------

    def state_dict(self) -> dict:
        # With a round in flight (a sync delay) the state is the one before
        # it: the synchronised parameters and the outer optimizer change only
        # when it completes. Loaded (or restored after a failure, which drops
        # the round), its fragment's next round carries the steps since that
        # fragment's last completed round.
        return {"inner": self.optimizer.state_dict(), "outer": self.outer_optimizer.state_dict(),
                "synced": [s.detach().clone() for s in self._synced],
                "local_step": self.local_step, "rounds": self.rounds,
                "fragment_rounds": [f.rounds for f in self._fragments],
                "fragment_versions": self.fragment_versions()}

    def load_state_dict(self, state: dict) -> None:
        self._require_idle("load_state_dict")
        self.optimizer.load_state_dict(state["inner"])
        self.outer_optimizer.load_state_dict(state["outer"])
        with torch.no_grad():
            for s, v in zip(self._synced, state["synced"]):
                s.copy_(v)
        self.local_step = state["local_step"]
        self.rounds = state["rounds"]
        for f, r, v in zip(self._fragments, state.get("fragment_rounds", []),
                           state.get("fragment_versions", [])):
            f.rounds, f.version = r, v

    def step(self, closure: Any = None) -> Any:
        self.completed_round = False
        loss = self.optimizer.step(closure)
        self.local_step += 1
        if self.local_step <= self.warmup_steps:
            for frag in self._fragments:
                self._finish(frag)  # none in flight during warm-up; a round started before it
                self._start(frag)
                self._finish(frag)
            return loss
        _streaming_step(self.local_step, self.period, self.sync_delay, self._fragments,
                        lambda f: f.handle is not None, self._start, self._finish)
        return loss

    def sync(self) -> None:
        """One outer round of every fragment now (collective): rounds in
        flight complete first."""
        self.completed_round = False
        for frag in self._fragments:
            self._finish(frag)
        for frag in self._fragments:
            self._start(frag)
            self._finish(frag)

    def fragment_versions(self) -> List[int]:
        """Per fragment, the commit (``gyre.committed_steps()`` right after
        it) of the last round merged into this rank's parameters of that
        fragment; 0 for none."""
        return [f.version for f in self._fragments]

    def fragment_rounds(self) -> List[int]:
        """Per fragment, how many rounds have been merged."""
        return [f.rounds for f in self._fragments]

    def fragment_parameters(self, index: int) -> List[torch.Tensor]:
        """The model's parameters in fragment ``index`` (in model order)."""
        return list(self._fragments[index].params)

    @property
    def fragments(self) -> int:
        return len(self._fragments)

    # -- rounds -----------------------------------------------------------------

    def _require_idle(self, what: str) -> None:
        busy = [f.index for f in self._fragments if f.handle is not None]
        if busy:
            raise gyre.StateError(f"LocalSGD.{what}: rounds of fragments {busy} are in flight; "
                                  f"call it when none is (sync() completes them)")

    def _start(self, frag: _Fragment) -> None:
        with torch.no_grad():
            pseudo = [s.detach() - p.detach() for s, p in zip(frag.synced, frag.params)]
            buffers = [b.detach().clone() for b in frag.buffers]
            name = f"gyre.local_sgd.f{frag.index}"
            if self.compression is Int8Quantization:
                frag.packed = ("int8", [p.shape for p in pseudo], len(buffers))
                q, scales = _quantize(torch.cat([p.reshape(-1).float() for p in pseudo]))
                tensors = [q.unsqueeze(0), scales.unsqueeze(0)]
                if buffers:
                    tensors.append(torch.cat([b.reshape(-1).float() for b in buffers]).unsqueeze(0))
                frag.handle = gyre.grouped_allgather_async(tensors, name=name,
                                                           process_set=self.process_set)
            else:
                packed = [self.compression.compress(t) for t in pseudo + buffers]
                frag.packed = ("allreduce", [ctx for _, ctx in packed], len(pseudo))
                frag.handle = gyre.grouped_allreduce_async([c for c, _ in packed], op=gyre.Average,
                                                           name=name, process_set=self.process_set)
            if self.sync_delay:
                frag.at_start = [p.detach().clone() for p in frag.params]
                frag.buffers_at_start = buffers
            frag.started = self.local_step
            frag.due = self.local_step + self.sync_delay

    def _received(self, frag: _Fragment) -> tuple:
        """(averaged pseudo-gradients, averaged buffers) of the round in flight."""
        result = gyre.synchronize(frag.handle)
        kind, meta, n = frag.packed
        if kind == "allreduce":
            out = [self.compression.decompress(r, ctx) for r, ctx in zip(result, meta)]
            return out[:n], out[n:]
        shapes, has_buffers = meta, n
        flat = _dequantize(result[0], result[1]).mean(dim=0)
        pseudo, at = [], 0
        for shape in shapes:
            count = torch.Size(shape).numel()
            pseudo.append(flat[at:at + count].reshape(shape))
            at += count
        buffers = []
        if has_buffers:
            avg, at = result[2].mean(dim=0), 0
            for b in frag.buffers:
                buffers.append(avg[at:at + b.numel()].reshape(b.shape))
                at += b.numel()
        return pseudo, buffers

    def _finish(self, frag: _Fragment) -> None:
        if frag.handle is None:
            return
        try:
            pseudo, buffers = self._received(frag)
        finally:
            frag.handle = None
            frag.packed = None
        # Inner steps since the round started: the local values moved on.
        drift = frag.started != self.local_step
        with torch.no_grad():
            for s, g in zip(frag.synced, pseudo):
                s.grad = g.to(s.dtype)
            self.outer_optimizer.step()
            for s in frag.synced:
                s.grad = None
            self._merge(frag.params, frag.synced, frag.at_start, drift)
            self._merge(frag.buffers, buffers, frag.buffers_at_start, drift)
        frag.at_start, frag.buffers_at_start = [], []
        frag.rounds += 1
        self.rounds += 1
        self.completed_round = True
        if self.process_set is not gyre.global_process_set:
            # Not a commit: the version vector is the job's (see above).
            frag.version = frag.rounds
        elif self._gyre_auto_commit:
            gyre.commit_step()
            frag.version = gyre.committed_steps()
        elif frag not in self._uncommitted:
            self._uncommitted.append(frag)

    # -- elastic training (gyre.torch.elastic.TorchState) -----------------------

    def register_step_pre_hook(self, hook: Callable) -> Any:
        """The inner optimizer's: ``hook`` runs before every step()."""
        return self.optimizer.register_step_pre_hook(hook)

    def _gyre_committing(self, version: int) -> None:
        """A TorchState is about to save and count commit ``version``: the
        fragments whose rounds completed since its last commit take it."""
        for frag in self._uncommitted:
            frag.version = version
        self._uncommitted = []

    def _gyre_elastic_reset(self) -> None:
        """After a rank's death and the rebuild: the rounds in flight failed
        with the old world; forget them (the restore that follows puts the
        parameters back to the last commit)."""
        for frag in self._fragments:
            frag.handle = None
            frag.packed = None
            frag.at_start, frag.buffers_at_start = [], []
        self._uncommitted = []
        self.completed_round = False

    def _gyre_elastic_sync(self, root_rank: int) -> None:
        """Every rank takes ``root_rank``'s inner and outer optimizer state,
        synchronised parameters and counters (TorchState.sync())."""
        from gyre.objects import broadcast_object
        from .functions import broadcast_optimizer_state

        self._require_idle("sync of the elastic state")
        broadcast_optimizer_state(self.optimizer, root_rank=root_rank, process_set=self.process_set)
        broadcast_optimizer_state(self.outer_optimizer, root_rank=root_rank,
                                  process_set=self.process_set)
        # broadcast_optimizer_state gives parameters without state a zero
        # gradient (as Horovod's scripts expect); the outer optimizer's
        # parameters must have none between rounds.
        for s in self._synced:
            s.grad = None
        with torch.no_grad():
            for i, s in enumerate(self._synced):
                s.copy_(gyre.broadcast(s.detach(), root_rank, name=f"gyre.local_sgd.elastic.{i}",
                                       process_set=self.process_set))
        counters = broadcast_object(
            {"local_step": self.local_step, "rounds": self.rounds,
             "fragments": [(f.rounds, f.version) for f in self._fragments]},
            root_rank=root_rank, name="gyre.local_sgd.elastic.counters",
            process_set=self.process_set)
        self.local_step, self.rounds = counters["local_step"], counters["rounds"]
        for f, (r, v) in zip(self._fragments, counters["fragments"]):
            f.rounds, f.version = r, v

    def _merge(self, local: List[torch.Tensor], synced: List[torch.Tensor],
               at_start: List[torch.Tensor], drift: bool) -> None:
        for i, (p, s) in enumerate(zip(local, synced)):
            s = s.detach().to(p.dtype)
            if not drift:
                p.copy_(s)
            elif self.mixing is None:
                p.copy_(s + (p - at_start[i]))
            else:
                p.copy_(self.mixing * p + (1.0 - self.mixing) * s)

    def __repr__(self) -> str:
        return (f"LocalSGD({type(self.optimizer).__name__}, period={self.period}, "
                f"outer={type(self.outer_optimizer).__name__}, fragments={self.fragments}, "
                f"sync_delay={self.sync_delay}, rounds={self.rounds})")


def _quantize(flat: torch.Tensor) -> tuple:
    """int8 values and one float32 scale per block of Int8Quantization.block."""
    block = Int8Quantization.block
    n = flat.numel()
    padded = torch.nn.functional.pad(flat, (0, (-n) % block)).reshape(-1, block)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(padded / safe.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
    return q.reshape(-1)[:n].contiguous(), scales


def _dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Every rank's float32 values (ranks x n) from the gathered int8 values
    and scales."""
    block = Int8Quantization.block
    ranks, n = q.shape
    padded = torch.nn.functional.pad(q.float(), (0, (-n) % block)).reshape(ranks, -1, block)
    return (padded * scales.unsqueeze(2)).reshape(ranks, -1)[:, :n]
