"""Local SGD and DiLoCo: H local steps, then one outer round.

    opt = gyre.torch.LocalSGD(torch.optim.AdamW(model.parameters()), model, period=16,
                              outer_optimizer=gyre.torch.LocalSGD.diloco_outer)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

``step()`` runs the inner optimizer on this rank's parameters alone. Every
``period`` steps (every step during the first ``warmup_steps``) an outer
round: the pseudo-gradients theta_synced - theta_local of every parameter
are averaged over the ranks in one fused grouped allreduce (optionally in
float16/bfloat16: ``compression=gyre.Compression.fp16``), the outer
optimizer steps the synchronised parameters with them as gradients, and the
result is every rank's parameters again. Buffers (BatchNorm statistics) are
averaged in the same round. Default outer optimizer: plain averaging (SGD,
lr 1, which makes theta_synced the mean of the ranks' theta_local); DiLoCo's
is ``LocalSGD.diloco_outer`` (SGD, lr 0.7, Nesterov momentum 0.9), or pass
any ``callable(params) -> torch.optim.Optimizer``.

The round is a commit: ``gyre.commit_step()`` counts it in the version
vector, so ``gyre.version_vector()`` gives every rank's number of merged
rounds. Every rank must call step() the same number of times.
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


class LocalSGD(OptimizerWrapper):
    """Local SGD / DiLoCo around ``optimizer`` for ``model``; see the module
    docstring. Construction is collective (rank 0's parameters and buffers
    are broadcast, so every rank starts from the same model)."""

    diloco_outer = staticmethod(functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True))

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, period: int,
                 outer_optimizer: Optional[Callable[[List[torch.Tensor]], torch.optim.Optimizer]] = None,
                 warmup_steps: int = 0, process_set: Any = None,
                 compression: type = Compression.none) -> None:
        if period < 1:
            raise InvalidArgumentError(f"LocalSGD: period must be >= 1, got {period}")
        if warmup_steps < 0:
            raise InvalidArgumentError(f"LocalSGD: warmup_steps must be >= 0, got {warmup_steps}")
        if not (isinstance(compression, type) and issubclass(compression, Compressor)):
            raise InvalidArgumentError("LocalSGD: compression must be one of gyre.Compression's")
        check_process_set(process_set, "LocalSGD")
        self.optimizer = optimizer
        self.model = model
        self.period = period
        self.warmup_steps = warmup_steps
        self.process_set = process_set if process_set is not None else gyre.global_process_set
        self.compression = compression
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._buffers = [b for b in model.buffers() if b.dtype.is_floating_point]
        with torch.no_grad():
            for i, t in enumerate(self._params + list(model.buffers())):
                t.copy_(gyre.broadcast(t.detach(), 0, name=f"gyre.local_sgd.init.{i}",
                                       process_set=self.process_set))
        # The synchronised parameters, which the outer optimizer steps.
        self._synced = [torch.nn.Parameter(p.detach().clone()) for p in self._params]
        make = outer_optimizer or functools.partial(torch.optim.SGD, lr=1.0)
        self.outer_optimizer = make(self._synced)
        self.local_step = 0
        self.rounds = 0

    # -- the optimizer's interface (and OptimizerWrapper's) --------------------

    def state_dict(self) -> dict:
        return {"inner": self.optimizer.state_dict(), "outer": self.outer_optimizer.state_dict(),
                "synced": [s.detach().clone() for s in self._synced],
                "local_step": self.local_step, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["inner"])
        self.outer_optimizer.load_state_dict(state["outer"])
        with torch.no_grad():
            for s, v in zip(self._synced, state["synced"]):
                s.copy_(v)
        self.local_step = state["local_step"]
        self.rounds = state["rounds"]

    def step(self, closure: Any = None) -> Any:
        loss = self.optimizer.step(closure)
        self.local_step += 1
        if self.local_step <= self.warmup_steps or self.local_step % self.period == 0:
            self.sync()
        return loss

    def sync(self) -> None:
        """One outer round now (collective)."""
        with torch.no_grad():
            pseudo = [s.detach() - p.detach() for s, p in zip(self._synced, self._params)]
            tensors = pseudo + [b.detach().clone() for b in self._buffers]
            packed = [self.compression.compress(t) for t in tensors]
            handle = gyre.grouped_allreduce_async([c for c, _ in packed], op=gyre.Average,
                                                  name=f"gyre.local_sgd.round",
                                                  process_set=self.process_set)
            averaged = [self.compression.decompress(r, ctx)
                        for r, (_, ctx) in zip(gyre.synchronize(handle), packed)]
            for s, g in zip(self._synced, averaged[:len(pseudo)]):
                s.grad = g.to(s.dtype)
            self.outer_optimizer.step()
            self.outer_optimizer.zero_grad(set_to_none=True)
            for p, s in zip(self._params, self._synced):
                p.copy_(s)
            for b, avg in zip(self._buffers, averaged[len(pseudo):]):
                b.copy_(avg)
        self.rounds += 1
        gyre.commit_step()

    def __repr__(self) -> str:
        return (f"LocalSGD({type(self.optimizer).__name__}, period={self.period}, "
                f"outer={type(self.outer_optimizer).__name__}, rounds={self.rounds})")
