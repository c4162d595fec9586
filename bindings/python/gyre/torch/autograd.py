"""Differentiable allreduce, allgather and broadcast for torch tensors.

``gyre.torch.allreduce/allgather/broadcast`` behave like ``gyre``'s, and in
addition carry gradients when the input requires grad (and grad mode is on):

- allreduce (Sum or Average, with pre/postscale): y = post * op_r(pre * x_r),
  so each rank's input gradient is the same reduction of every rank's output
  gradient;
- allgather: y concatenates every rank's x, so rank r's input gradient is the
  sum over ranks of the output gradients' rows that came from r;
- broadcast: only root's input reaches the outputs, so root's gradient is the
  sum of every rank's output gradient and the others get zeros.

The backward collectives are named after the forward ones ("<name>.grad"), so
ranks match as long as they run the same backward. Min, Max and Product are
not differentiable here: their results do not require grad.
The in-place and asynchronous forms are never differentiable (as in Horovod).
"""

import torch

from gyre import ops
from gyre.compression import Compression


def _wants_grad(tensor):
    return torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) and tensor.requires_grad


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, compression):
        compressed, cctx = compression.compress(tensor)
        handle = ops.allreduce_async(compressed, name=name, op=op, prescale_factor=prescale,
                                     postscale_factor=postscale)
        ctx.meta = (handle.name, op, prescale, postscale, compression)
        return compression.decompress(ops.synchronize(handle), cctx)

    @staticmethod
    def backward(ctx, grad_output):
        name, op, prescale, postscale, compression = ctx.meta
        grad = ops.allreduce(grad_output.contiguous(), name=f"{name}.grad", op=op,
                             compression=compression, prescale_factor=prescale,
                             postscale_factor=postscale)
        return grad, None, None, None, None, None


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        handle = ops.allgather_async(tensor, name=name)
        rows = ops.allgather(torch.tensor([tensor.shape[0]], dtype=torch.int64),
                             name=f"{handle.name}.rows")
        r = ops.rank()
        ctx.meta = (handle.name, int(rows[:r].sum()), int(rows[r]))
        return ops.synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        name, offset, count = ctx.meta
        total = ops.allreduce(grad_output.contiguous(), name=f"{name}.grad", op=ops.Sum)
        return total[offset:offset + count], None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        handle = ops.broadcast_async(tensor, root_rank, name=name)
        ctx.meta = (handle.name, root_rank)
        return ops.synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        name, root_rank = ctx.meta
        total = ops.allreduce(grad_output.contiguous(), name=f"{name}.grad", op=ops.Sum)
        if ops.rank() != root_rank:
            total = torch.zeros_like(total)
        return total, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """gyre.allreduce, differentiable for Sum and Average (see the module doc)."""
    name = ops._op_name("allreduce", name)  # consumed before anything can refuse the call
    rop = ops._reduce_op(average, op)
    if _wants_grad(tensor) and rop in (ops.Sum, ops.Average):
        return _Allreduce.apply(tensor, name, rop, float(prescale_factor),
                                float(postscale_factor), compression)
    return ops.allreduce(tensor, None, name, compression, rop, prescale_factor, postscale_factor)


def allgather(tensor, name=None):
    """gyre.allgather, differentiable (see the module doc)."""
    if _wants_grad(tensor):
        return _Allgather.apply(tensor, name)
    return ops.allgather(tensor, name)


def broadcast(tensor, root_rank, name=None):
    """gyre.broadcast, differentiable (see the module doc)."""
    if _wants_grad(tensor):
        return _Broadcast.apply(tensor, root_rank, name)
    return ops.broadcast(tensor, root_rank, name)
