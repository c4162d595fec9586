"""DistributedOptimizer: averages gradients across ranks while backward runs.

Each parameter gets a post-accumulate-grad hook. When its gradient has been
accumulated ``backward_passes_per_step`` times, the hook enqueues the
gradient's allreduce at once, so communication overlaps the rest of the
backward pass. ``step()`` waits for every allreduce, runs the wrapped
optimizer's step, and commits the step to gyre's version vector.

What that detects: each allreduce carries the number of steps its rank had
committed when it was enqueued, and ranks whose counts differ fail the
allreduce on every rank with DivergenceError. So a rank that runs backward()
but skips optimizer.step() (or steps twice) is detected at its next
gradient allreduce. A rank that skips a whole iteration (neither backward()
nor step()) is NOT detected: its next iteration's allreduces have the same
names and the same committed count as the other ranks' current ones, so they
pair (iteration k with k+1), and it trains one iteration behind on averages
that mix iterations; the job then ends with that rank waiting for an
allreduce the others never make (a stall warning, then TimeoutError after
GYRE_STALL_SHUTDOWN_S). The parameters stay equal across ranks meanwhile
(every rank applies the same averages), so check_consistency() does not
see it either.

Threads: hooks run on autograd's thread for the CPU (the caller's thread);
step(), synchronize() and zero_grad() on the training thread.

After an error: collective errors (MismatchError, DivergenceError, a refusal
on some rank, ...) fail an allreduce on every rank alike, and are raised in
negotiation, before any data moves: a gradient whose allreduce failed still
holds this rank's own value. synchronize() therefore remembers which
gradients were reduced before the error, and the next synchronize() (or
step()) reduces exactly the others, so a step after a caught error either
uses properly reduced gradients or raises again, on every rank. A gradient is
never reduced twice, and never used un-reduced.
"""

import contextlib
import warnings
import weakref

import torch

from gyre import ops
from gyre.basics import check_process_set, global_process_set
from gyre.compression import Compression
from gyre.exceptions import GyreError, InvalidArgumentError, StateError

from .functions import sparse_allreduce_async


_SPARSE = object()  # the compression context of a sparse gradient's reduction
_DENSIFIED = object()  # a sparse gradient reduced as a dense tensor (sparse_as_dense)


class _DistributedOptimizerMixin:
    """Mixed in before the wrapped optimizer's class (see DistributedOptimizer)."""

    def _gyre_setup(self, named_parameters, compression, backward_passes_per_step, op,
                    gradient_predivide_factor, groups, sparse_as_dense):
        op = ops._reduce_op(None, op)
        if gradient_predivide_factor != 1.0 and op != ops.Average:
            raise InvalidArgumentError("gradient_predivide_factor not supported with op != Average "
                                       "(it splits Average's division around the sum)")
        self.set_backward_passes_per_step(backward_passes_per_step)
        self._gyre_groups = self._gyre_check_groups(groups)
        self._gyre_sparse_as_dense = bool(sparse_as_dense)
        self._gyre_compression = compression
        self._gyre_op = op
        # Average = sum / size: split as prescale 1/f, then postscale f.
        self._gyre_prescale = 1.0 / gradient_predivide_factor
        self._gyre_postscale = float(gradient_predivide_factor)
        self._gyre_names = self._gyre_parameter_names(named_parameters)
        self._gyre_handles = {}  # param -> (Handle, sent tensor, compression ctx)
        self._gyre_passes = {p: 0 for p in self._gyre_names}
        # Gradients reduced by a synchronize() that failed on others: the
        # next synchronize() leaves them alone (see the module doc).
        self._gyre_reduced = set()
        # Parameters whose gradient was sparse here (kept sparse, not
        # sparse_as_dense): a step where one has no gradient sends an empty
        # sparse one, so every rank makes the same allgathers.
        self._gyre_sparse = {}  # param -> its sparse gradients' sparse_dim
        # The last synchronize() failed and its gradients are not all reduced.
        self._gyre_failed = False
        self._gyre_synchronized = False
        self._gyre_should_synchronize = True
        # The hooks hold a weak reference: a discarded optimizer's hooks do nothing.
        me = weakref.ref(self)

        def hook(param):
            opt = me()
            if opt is not None:
                opt._gyre_gradient_ready(param)

        # A rank outside the process set reduces nothing: its step() uses its
        # own gradients (as Horovod's), so it needs no hooks either.
        self._gyre_hooks = [p.register_post_accumulate_grad_hook(hook)
                            for p in self._gyre_names if p.requires_grad and self._gyre_included()]

    def _gyre_included(self):
        ps = self._gyre_process_set
        if ps is global_process_set:
            return True
        # A set removed since is "included": its allreduce then raises
        # (StateError naming the set) instead of the step going on alone.
        included = ps.included()
        return included is None or bool(included)

    @property
    def _parameter_names(self):
        """Horovod's attribute: {parameter: the name its allreduce carries}."""
        return self._gyre_names

    def _gyre_check_groups(self, groups):
        """Horovod's groups=: None, a non-negative number of groups, or a list
        of lists of the optimizer's parameters. gyre checks it as Horovod
        does; the values are the same with or without it (gyre fuses the
        gradients that are ready together by itself)."""
        if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                              and groups >= 0):
            return groups
        if not isinstance(groups, list):
            raise InvalidArgumentError(
                f"groups should be a non-negative integer or a list of lists of torch.Tensor, "
                f"got {groups!r}")
        params = {p for group in self.param_groups for p in group["params"]}
        for group in groups:
            if not isinstance(group, (list, tuple)) or not all(
                    isinstance(p, torch.Tensor) for p in group):
                raise InvalidArgumentError(
                    "groups should be a non-negative integer or a list of lists of torch.Tensor")
            if any(p not in params for p in group):
                raise InvalidArgumentError("groups names a tensor that is not one of the "
                                           "optimizer's parameters")
        return groups

    def set_backward_passes_per_step(self, passes):
        """Horovod's: how many backward passes accumulate before the reduction."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise InvalidArgumentError(f"backward_passes_per_step must be an integer >= 1, got "
                                       f"{passes!r}")
        self.backward_passes_per_step = passes
        for p in getattr(self, "_gyre_passes", {}):
            self._gyre_passes[p] = 0

    def _gyre_parameter_names(self, named_parameters):
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            return {p: f"param.{i}" for i, p in enumerate(params)}
        named = list(named_parameters)
        for item in named:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise InvalidArgumentError(
                    "named_parameters should be a sequence of tuples (name, parameter), usually "
                    f"produced by model.named_parameters(); got an element {item!r}")
        names = [n for n, _ in named]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidArgumentError("Parameter names in named_parameters must be unique. "
                                       f"Found duplicates: {', '.join(duplicates)}")
        by_param = {p: n for n, p in named}
        missing = [i for i, p in enumerate(params) if p not in by_param]
        if missing:
            raise InvalidArgumentError(
                "named_parameters was specified, but one or more model parameters were not named: "
                f"{len(missing)} of the optimizer's parameters "
                f"(indices {missing[:10]} in param_groups order)")
        return {p: by_param[p] for p in params}

    # Hooks and allreduces -------------------------------------------------------

    def _gyre_gradient_ready(self, p):
        if p not in self._gyre_names:
            return
        # A new backward pass accumulated into p.grad: it is reduced again.
        self._gyre_reduced.discard(p)
        if p in self._gyre_handles:
            # More backward passes than backward_passes_per_step before step():
            # typically a skipped step(). The earlier allreduce (same name) is
            # finished and dropped so the new one can be enqueued; gyre's
            # version vector then reports the skipped step as a DivergenceError
            # on every rank, instead of this rank failing alone.
            warnings.warn(
                f"gradient of '{self._gyre_names[p]}' computed more than backward_passes_per_step="
                f"{self.backward_passes_per_step} times before step(); its previous allreduce is "
                "discarded", RuntimeWarning, stacklevel=2)
            self._gyre_finish(p, discard=True)
            self._gyre_passes[p] = 0
        self._gyre_passes[p] += 1
        if self._gyre_passes[p] >= self.backward_passes_per_step:
            self._gyre_enqueue(p)

    def _gyre_enqueue(self, p):
        grad = p.grad
        densified = False
        if grad.is_sparse:
            if not self._gyre_sparse_as_dense:
                # Horovod's sparse path: indices and values gathered; the
                # reduced sparse tensor replaces p.grad in _gyre_finish. One
                # allgather with the dense allreduce's name: a rank that sends
                # this parameter dense (it never had a sparse gradient for it)
                # then fails with the others in one round (MismatchError)
                # instead of each waiting for the other's.
                self._gyre_sparse[p] = grad.sparse_dim()
                wait = sparse_allreduce_async(grad, f"DistributedOptimizer.{self._gyre_names[p]}",
                                              self._gyre_op, self._gyre_process_set)
                self._gyre_handles[p] = (wait, None, _SPARSE)
                return
            # Reduced as a dense tensor; p.grad stays sparse (an optimizer
            # such as SparseAdam takes only sparse gradients) and receives
            # the result made sparse again in _gyre_finish.
            grad = grad.to_dense()
            densified = True
        sent, ctx = self._gyre_compression.compress(grad)
        if not sent.is_contiguous():
            sent = sent.contiguous()
        handle = ops.allreduce_async_(sent, name=f"DistributedOptimizer.{self._gyre_names[p]}",
                                      op=self._gyre_op, prescale_factor=self._gyre_prescale,
                                      postscale_factor=self._gyre_postscale,
                                      process_set=self._gyre_process_set)
        self._gyre_handles[p] = (handle, sent, (_DENSIFIED, ctx) if densified else ctx)

    def _gyre_finish(self, p, discard=False):
        """Waits for p's allreduce and writes the result into p.grad (unless
        discarding). Returns the operation's error instead of raising it.
        Anything else (KeyboardInterrupt while waiting) leaves the handle in
        place, so that a later synchronize() or zero_grad() still waits for
        the allreduce writing into p.grad."""
        handle, sent, ctx = self._gyre_handles[p]
        try:
            result = ops.synchronize(handle)
        except GyreError as e:
            del self._gyre_handles[p]
            return None if discard else e
        del self._gyre_handles[p]
        if ctx is _SPARSE:
            if not discard:
                p.grad = result
        elif isinstance(ctx, tuple) and len(ctx) == 2 and ctx[0] is _DENSIFIED:
            if not discard:
                dense = self._gyre_compression.decompress(sent, ctx[1]).to(p.grad.dtype)
                p.grad = dense.to_sparse(p.grad.sparse_dim())
        elif not discard and sent is not p.grad:
            with torch.no_grad():
                p.grad.copy_(self._gyre_compression.decompress(sent, ctx))
        return None

    def _gyre_elastic_reset(self):
        """After a rank died and the world was rebuilt (gyre.torch.elastic):
        the allreduces of the failed step are gone with the old world (they
        failed), so every gradient is reduced afresh in the redone step."""
        self._gyre_handles.clear()
        self._gyre_reduced.clear()
        for p in self._gyre_passes:
            self._gyre_passes[p] = 0
        self._gyre_failed = False
        self._gyre_synchronized = False

    # Horovod's interface ----------------------------------------------------------

    def synchronize(self):
        """Waits for every gradient's allreduce; enqueues those whose hook did
        not fire this step (a parameter unused in this rank's graph gets a zero
        gradient, so every rank reduces the same set). Raises the first error
        (e.g. DivergenceError) after all operations have finished; called
        again after an error, reduces the gradients that were not reduced."""
        if not self._gyre_included():
            # Outside the process set: nothing to reduce (as in Horovod).
            self._gyre_synchronized = True
            return
        errors = []
        try:
            for p in self._gyre_names:
                if p in self._gyre_handles or p in self._gyre_reduced or not p.requires_grad:
                    continue
                if p.grad is None and p in self._gyre_sparse:
                    sd = self._gyre_sparse[p]
                    p.grad = torch.sparse_coo_tensor(
                        torch.empty((sd, 0), dtype=torch.int64),
                        torch.empty((0, *p.shape[sd:]), dtype=p.dtype), p.shape,
                        check_invariants=True)
                elif p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                try:
                    self._gyre_enqueue(p)
                except GyreError as e:
                    # Refused on this rank (and, announced, on the others): the
                    # remaining gradients are still enqueued, as on other ranks.
                    errors.append(e)
            for p in list(self._gyre_handles):
                error = self._gyre_finish(p)
                if error is None:
                    self._gyre_reduced.add(p)
                else:
                    errors.append(error)
        except BaseException:
            self._gyre_failed = True
            raise
        finally:
            for p in self._gyre_passes:
                self._gyre_passes[p] = 0
        if errors:
            self._gyre_failed = True
            raise errors[0]
        self._gyre_reduced.clear()
        self._gyre_failed = False
        self._gyre_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For ``optimizer.synchronize(); <clip gradients>; with
        optimizer.skip_synchronize(): optimizer.step()``."""
        self._gyre_should_synchronize = False
        try:
            yield
        finally:
            self._gyre_should_synchronize = True

    def step(self, closure=None):
        loss = None
        if closure is not None:
            # Evaluated here, so its backward's allreduces are awaited below.
            with torch.enable_grad():
                loss = closure()
        if self._gyre_should_synchronize:
            if self._gyre_synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(); gradients were not reduced "
                              "again (use `with optimizer.skip_synchronize(): optimizer.step()`)",
                              RuntimeWarning, stacklevel=2)
            else:
                self.synchronize()
        elif self._gyre_failed:
            raise StateError(
                "optimizer.step() under skip_synchronize() after optimizer.synchronize() failed: "
                "some gradients are not reduced. Call synchronize() again (it reduces the rest), "
                "or zero_grad() and recompute the gradients")
        self._gyre_synchronized = False
        super().step()
        # Under gyre.torch.elastic the TorchState's commit() counts the steps
        # instead (it commits the state it saved, which the recovery agrees on).
        # Only steps of the whole job are commits: the version vector is the
        # global set's, and steps on a set that leaves ranks out would put
        # its members ahead of the others (their next job-wide collective a
        # DivergenceError).
        if (getattr(self, "_gyre_auto_commit", True)
                and self._gyre_process_set is global_process_set):
            ops.commit_step()
        return loss

    def zero_grad(self, set_to_none=True):
        """Safe at any time: allreduces still writing into gradients are
        finished (their results dropped) before the gradients are cleared."""
        for p in list(self._gyre_handles):
            self._gyre_finish(p, discard=True)
        for p in self._gyre_passes:
            self._gyre_passes[p] = 0
        self._gyre_reduced.clear()
        self._gyre_failed = False
        self._gyre_synchronized = False
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=ops.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch optimizer so that step() uses gradients averaged (or
    reduced with `op`) over all ranks.

    The result is an instance of a subclass of the optimizer's own class and
    shares its state and param_groups (use it in place of the original;
    isinstance checks, LR schedulers and state_dict work unchanged).
    `named_parameters` (``model.named_parameters()``) names the allreduces;
    without it, parameters are named by position. With
    ``backward_passes_per_step=N`` gradients are accumulated (summed) locally
    over N backward passes, then reduced once. ``gradient_predivide_factor=f``
    divides by f before the sum and multiplies by f/size after (Average only).
    `groups` / `num_groups` (Horovod's) are checked and accepted; the
    results do not depend on them. Sparse gradients (``nn.Embedding(sparse=
    True)``) are reduced by gathering indices and values, or as dense tensors
    with ``sparse_as_dense=True``. `process_set`: the registered ProcessSet
    whose ranks average the gradients (every rank of it wraps its optimizer
    alike; ranks outside it must not step a wrapped optimizer on it).
    ``op=Adasum`` is Horovod's Adasum optimizer (_adasum_optimizer.py):
    the deltas of the local steps are reduced, not the gradients; global
    process set and a power-of-two number of ranks only.
    """
    check_process_set(process_set, "DistributedOptimizer")
    if num_groups and groups is None:
        warnings.warn("DistributedOptimizer: num_groups is deprecated, use groups",
                      DeprecationWarning, stacklevel=2)
        groups = num_groups
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    base = type(optimizer)
    mixin = _DistributedOptimizerMixin
    if ops._reduce_op(None, op) == ops.Adasum:
        # Imported here: the Adasum mixin derives from this module's.
        from ._adasum_optimizer import _check_adasum_job, _DistributedAdasumMixin  # noqa: PLC0415
        _check_adasum_job(process_set)
        mixin = _DistributedAdasumMixin
    cls = type(base.__name__, (mixin, base), {"__module__": __name__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._gyre_process_set = process_set
    wrapped._gyre_setup(named_parameters, compression, backward_passes_per_step, op,
                        gradient_predivide_factor, groups, sparse_as_dense)
    return wrapped
