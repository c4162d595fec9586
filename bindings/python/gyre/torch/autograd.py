"""Differentiable collectives for torch tensors, with Horovod's gradients.

``gyre.torch.allreduce``, ``grouped_allreduce``, ``allgather``,
``grouped_allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and
``grouped_reducescatter`` behave like ``gyre``'s, and in addition carry
gradients when an input requires grad (and grad mode is on). The backward
passes are Horovod's (horovod/torch/mpi_ops.py, 0.28):

- allreduce: the same allreduce (op, prescale, postscale) of the output
  gradients (for Average: the average of every rank's output gradient);
- allgather: the *average* over ranks of the output gradients, then this
  rank's rows. (Horovod averages rather than sums: with each rank's loss
  averaged over ranks, as DistributedOptimizer does, that is the gradient.)
- broadcast: the average over ranks of the output gradients on the root,
  zeros elsewhere;
- alltoall: an alltoall of the output gradients back along the received
  splits;
- reducescatter: an allgather of the output gradients, multiplied by the
  number of ranks for Sum (not for Average) and by prescale * postscale.
  This is Horovod's scale, not the derivative of the sum of the ranks'
  outputs (which would be the plain allgather for Sum and the allgather
  divided by the number of ranks for Average); a gradient of ones comes
  back as size for Sum and 1 for Average, as in Horovod.

Min, Max, Product and Adasum have no such gradient: their results carry a
backward that raises (Horovod would return a meaningless gradient silently). The
backward collectives are named after the forward ones ("<name>.grad"), so
ranks match as long as they run the same backward. The in-place and
asynchronous forms are never differentiable (as in Horovod).
"""

import torch

from gyre import ops
from gyre.basics import global_process_set
from gyre.compression import Compression
from gyre.exceptions import InvalidArgumentError

_LINEAR = (ops.Sum, ops.Average)


def _differentiable_on(process_set, what):
    """Refuses what is not a registered ProcessSet, before any autograd node
    is made (the collectives themselves refuse ranks outside the set)."""
    ops.check_process_set(process_set, what)


def _wants_grad(*tensors):
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def _no_gradient(kind, name, op):
    raise InvalidArgumentError(
        f"{kind} '{name}' with op {ops.ReduceOp(op).name} is not differentiable (only Sum and "
        "Average are); detach the input, or reduce with Sum/Average")


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, ps):
        ctx.meta = (name, op, prescale, postscale, ps)
        return ops.allreduce(tensor, name=name, op=op, prescale_factor=prescale,
                             postscale_factor=postscale, process_set=ps)

    @staticmethod
    def backward(ctx, grad_output):
        name, op, prescale, postscale, ps = ctx.meta
        if op not in _LINEAR:
            _no_gradient("allreduce", name, op)
        grad = ops.allreduce(grad_output.contiguous(), name=f"{name}.grad", op=op,
                             prescale_factor=prescale, postscale_factor=postscale,
                             process_set=ps)
        return grad, None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, ps, *tensors):
        ctx.meta = (name, op, prescale, postscale, ps)
        return tuple(ops.grouped_allreduce(list(tensors), name=name, op=op,
                                           prescale_factor=prescale, postscale_factor=postscale,
                                           process_set=ps))

    @staticmethod
    def backward(ctx, *grads):
        name, op, prescale, postscale, ps = ctx.meta
        if op not in _LINEAR:
            _no_gradient("grouped_allreduce", name, op)
        reduced = ops.grouped_allreduce([g.contiguous() for g in grads], name=f"{name}.grad",
                                        op=op, prescale_factor=prescale,
                                        postscale_factor=postscale, process_set=ps)
        return (None, None, None, None, None, *reduced)


def _set_rank(ps):
    """This rank's index in `ps` (allgather's row order)."""
    return ops.rank() if ps is None or ps is global_process_set else ps.rank()


def _set_size(ps):
    return ops.size() if ps is None or ps is global_process_set else ps.size()


def _rows_of_this_rank(name, grad_output, rows, ps):
    """Horovod's allgather gradient: average the output gradients over ranks,
    keep the rows this rank contributed."""
    averaged = ops.allreduce(grad_output.contiguous(), name=f"{name}.grad", op=ops.Average,
                             process_set=ps)
    counts = ops.allgather(torch.tensor([rows], dtype=torch.int64), name=f"{name}.grad.rows",
                           process_set=ps)
    offset = int(counts[:_set_rank(ps)].sum())
    return averaged.narrow(0, offset, rows)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.meta = (name, tensor.shape[0], ps)
        return ops.allgather(tensor, name=name, process_set=ps)

    @staticmethod
    def backward(ctx, grad_output):
        name, rows, ps = ctx.meta
        return _rows_of_this_rank(name, grad_output, rows, ps), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, ps, *tensors):
        ctx.meta = (name, [t.shape[0] for t in tensors], ps)
        return tuple(ops.grouped_allgather(list(tensors), name=name, process_set=ps))

    @staticmethod
    def backward(ctx, *grads):
        name, rows, ps = ctx.meta
        return (None, None, *[_rows_of_this_rank(f"{name}.{i}", g, n, ps)
                              for i, (g, n) in enumerate(zip(grads, rows))])


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.meta = (name, root_rank, ps)
        return ops.broadcast(tensor, root_rank, name=name, process_set=ps)

    @staticmethod
    def backward(ctx, grad_output):
        name, root_rank, ps = ctx.meta
        grad = ops.allreduce(grad_output.contiguous(), name=f"{name}.grad", op=ops.Average,
                             process_set=ps)
        if ops.rank() != root_rank:  # roots are world ranks
            grad = torch.zeros_like(grad)
        return grad, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = ops.synchronize(ops.alltoall_async(tensor, splits, name, ps))
        ctx.meta = (name, received, ps)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):
        name, received, ps = ctx.meta
        grad, _ = ops.alltoall(grad_output.contiguous(), splits=received, name=f"{name}.grad",
                               process_set=ps)
        return grad, None, None, None


def _reducescatter_gradient(name, grad_output, op, prescale, postscale, ps):
    if op not in _LINEAR:
        _no_gradient("reducescatter", name, op)
    grad = ops.allgather(grad_output.contiguous(), name=f"{name}.grad", process_set=ps)
    # Horovod's scale: the number of ranks for Sum, 1 for Average (so a
    # gradient of ones comes back as size, resp. 1, as Horovod's tests expect).
    scale = prescale * postscale * (_set_size(ps) if op == ops.Sum else 1)
    return grad * scale if scale != 1.0 else grad


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, ps):
        ctx.meta = (name, op, prescale, postscale, ps)
        return ops.reducescatter(tensor, name=name, op=op, prescale_factor=prescale,
                                 postscale_factor=postscale, process_set=ps)

    @staticmethod
    def backward(ctx, grad_output):
        return (_reducescatter_gradient(ctx.meta[0], grad_output, *ctx.meta[1:]),
                None, None, None, None, None)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, ps, *tensors):
        ctx.meta = (name, op, prescale, postscale, ps)
        return tuple(ops.grouped_reducescatter(list(tensors), name=name, op=op,
                                               prescale_factor=prescale,
                                               postscale_factor=postscale, process_set=ps))

    @staticmethod
    def backward(ctx, *grads):
        name, op, prescale, postscale, ps = ctx.meta
        return (None, None, None, None, None,
                *[_reducescatter_gradient(f"{name}.{i}", g, op, prescale, postscale, ps)
                  for i, g in enumerate(grads)])


# The functions: Horovod's signatures; compression around the differentiable
# collective, as in Horovod, so gradients flow through the casts too.


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """gyre.allreduce, differentiable (see the module doc)."""
    # Consumed before anything can refuse the call.
    name = ops._op_name("allreduce", name, process_set)
    if not _wants_grad(tensor):
        return ops.allreduce(tensor, average, name, compression, op, prescale_factor,
                             postscale_factor, process_set)
    _differentiable_on(process_set, "allreduce")
    rop = ops._reduce_op(average, op)
    compressed, ctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, rop, float(prescale_factor), float(postscale_factor),
                           process_set)
    return compression.decompress(out, ctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """gyre.grouped_allreduce, differentiable (see the module doc)."""
    name = ops._op_name("grouped_allreduce", name, process_set)
    tensors = ops._tensor_list(tensors, "grouped_allreduce")
    if not _wants_grad(*tensors):
        return ops.grouped_allreduce(tensors, average, name, compression, op, prescale_factor,
                                     postscale_factor, process_set)
    _differentiable_on(process_set, "grouped_allreduce")
    rop = ops._reduce_op(average, op)
    packed = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, rop, float(prescale_factor), float(postscale_factor),
                                   process_set, *[c for c, _ in packed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]


def allgather(tensor, name=None, process_set=global_process_set):
    """gyre.allgather, differentiable (see the module doc)."""
    name = ops._op_name("allgather", name, process_set)
    if not _wants_grad(tensor):
        return ops.allgather(tensor, name, process_set)
    _differentiable_on(process_set, "allgather")
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """gyre.grouped_allgather, differentiable (see the module doc)."""
    name = ops._op_name("grouped_allgather", name, process_set)
    tensors = ops._tensor_list(tensors, "grouped_allgather")
    if not _wants_grad(*tensors):
        return ops.grouped_allgather(tensors, name, process_set)
    _differentiable_on(process_set, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """gyre.broadcast, differentiable (see the module doc)."""
    name = ops._op_name("broadcast", name, process_set)
    if not _wants_grad(tensor):
        return ops.broadcast(tensor, root_rank, name, process_set)
    _differentiable_on(process_set, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """gyre.alltoall, differentiable (see the module doc): the output, and
    with `splits` given also the rows received from each rank."""
    name = ops._op_name("alltoall", name, process_set)
    if not _wants_grad(tensor):
        return ops.alltoall(tensor, splits, name, process_set)
    _differentiable_on(process_set, "alltoall")
    out, received = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


def reducescatter(tensor, name=None, compression=Compression.none, op=ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """gyre.reducescatter, differentiable (see the module doc)."""
    name = ops._op_name("reducescatter", name, process_set)
    if not _wants_grad(tensor):
        return ops.reducescatter(tensor, name, compression, op, process_set, prescale_factor,
                                 postscale_factor)
    _differentiable_on(process_set, "reducescatter")
    rop = ops._reduce_op(None, op)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, rop, float(prescale_factor),
                               float(postscale_factor), process_set)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=ops.Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """gyre.grouped_reducescatter, differentiable (see the module doc)."""
    name = ops._op_name("grouped_reducescatter", name, process_set)
    tensors = ops._tensor_list(tensors, "grouped_reducescatter")
    if not _wants_grad(*tensors):
        return ops.grouped_reducescatter(tensors, name, compression, op, process_set,
                                         prescale_factor, postscale_factor)
    _differentiable_on(process_set, "grouped_reducescatter")
    rop = ops._reduce_op(None, op)
    packed = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, rop, float(prescale_factor),
                                       float(postscale_factor), process_set,
                                       *[c for c, _ in packed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]
