"""DistributedOptimizer(op=Adasum), Horovod's Adasum optimizer: the deltas
of each rank's local step are reduced with Adasum instead of the gradients
(gyre.torch.optimizer picks this mixin for op=Adasum)."""

import contextlib

import torch

from gyre import ops
from gyre.basics import global_process_set, size
from gyre.exceptions import GyreError, InvalidArgumentError, NotSupportedError

from .optimizer import _DistributedOptimizerMixin


class _DistributedAdasumMixin(_DistributedOptimizerMixin):
    """DistributedOptimizer(op=Adasum), Horovod's Adasum optimizer: every
    rank runs the wrapped optimizer's step on its own gradients, the change
    of each parameter (delta = new - old) is allreduced with Adasum, and
    every parameter is set to old + Adasum(deltas). The gradients are never
    reduced.

    Differences from Horovod's, documented in docs/horovod.md: Horovod runs
    the local step of each parameter in its gradient hook (overlapping the
    deltas' reductions with the backward pass); here step() runs the whole
    local step, then reduces every delta (the values are the same for
    optimizers that update each parameter on its own, e.g. SGD, Adam).
    Nothing is in flight between backward() and step(), so zero_grad() is
    always safe and more backward passes than backward_passes_per_step
    simply accumulate (Horovod raises AssertionError in both cases).
    synchronize() does nothing (as Horovod's); skip_synchronize() raises
    AssertionError (as Horovod's: there is no gradient reduction to skip).
    """

    def _gyre_setup(self, named_parameters, compression, backward_passes_per_step, op,
                    gradient_predivide_factor, groups, sparse_as_dense):
        if gradient_predivide_factor != 1.0:
            raise InvalidArgumentError("gradient_predivide_factor not supported with op != Average "
                                       "(it splits Average's division around the sum)")
        self.set_backward_passes_per_step(backward_passes_per_step)
        self._gyre_groups = self._gyre_check_groups(groups)
        self._gyre_sparse_as_dense = bool(sparse_as_dense)  # the deltas are dense anyway
        self._gyre_compression = compression
        self._gyre_op = ops.Adasum
        self._gyre_names = self._gyre_parameter_names(named_parameters)
        self._gyre_passes = {p: 0 for p in self._gyre_names}
        self._gyre_handles = {}  # always empty between calls: nothing in flight

    def synchronize(self):
        """Does nothing, as Horovod's Adasum optimizer: step() reduces the
        deltas of the local step, not the gradients."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("skip_synchronize() is not supported with DistributedOptimizer("
                             "op=Adasum): it reduces the delta of each local step in step(), "
                             "there is no gradient reduction to skip")
        yield  # pragma: no cover (a generator, for contextmanager)

    def _gyre_elastic_reset(self):
        for p in self._gyre_passes:
            self._gyre_passes[p] = 0

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for p in self._gyre_names if p.requires_grad]
        errors = []
        with torch.no_grad():
            start = [p.detach().clone() for p in params]
            # The wrapped optimizer's step (past the gradient-reducing mixin).
            super(_DistributedOptimizerMixin, self).step()
            pending = []
            # Every rank enqueues every parameter's delta, in the same order,
            # even after a refusal, so the others are not left waiting.
            for p, old in zip(params, start):
                delta = p.detach() - old
                sent, ctx = self._gyre_compression.compress(delta)
                if not sent.is_contiguous():
                    sent = sent.contiguous()
                try:
                    handle = ops.allreduce_async_(
                        sent, name=f"DistributedOptimizer.Adasum.{self._gyre_names[p]}",
                        op=ops.Adasum, process_set=self._gyre_process_set)
                except GyreError as e:
                    errors.append(e)
                    handle = None
                pending.append((p, old, handle, sent, ctx))
            for p, old, handle, sent, ctx in pending:
                if handle is not None:
                    try:
                        ops.synchronize(handle)
                    except GyreError as e:
                        errors.append(e)
                        handle = None
                if handle is None:
                    # Not reduced: back to the value every rank had before
                    # the step (the wrapped optimizer's own state, e.g.
                    # momentum, has advanced by this step all the same).
                    p.copy_(old)
                else:
                    p.copy_(old + self._gyre_compression.decompress(sent, ctx).to(p.dtype))
        for p in self._gyre_passes:
            self._gyre_passes[p] = 0
        if errors:
            raise errors[0]
        if getattr(self, "_gyre_auto_commit", True):
            ops.commit_step()
        return loss

    def zero_grad(self, set_to_none=True):
        """Always safe: nothing is in flight outside step()."""
        for p in self._gyre_passes:
            self._gyre_passes[p] = 0
        # The wrapped optimizer's own (past the gradient-reducing mixin).
        return super(_DistributedOptimizerMixin, self).zero_grad(set_to_none=set_to_none)


def _check_adasum_job(process_set):
    """Horovod's rules for its Adasum optimizer: the global process set only,
    and (Adasum's recursive pairing) a power-of-two number of ranks. Every
    rank sees the same size, so every rank raises alike."""
    if process_set is not global_process_set:
        raise NotSupportedError("DistributedOptimizer(op=Adasum) supports only the global "
                                "process set (as Horovod's Adasum optimizer)")
    n = size()
    if n & (n - 1):
        raise InvalidArgumentError(
            f"DistributedOptimizer(op=Adasum) needs a power-of-two number of ranks (1, 2, 4, 8, "
            f"...), this job has {n}; use op=Average, or run on a power-of-two number of ranks")
