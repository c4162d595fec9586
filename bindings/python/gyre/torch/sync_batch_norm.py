"""SyncBatchNorm: a drop-in for torch.nn.BatchNorm1d/2d/3d whose batch
statistics are taken over every rank's batch (Horovod's hvd.SyncBatchNorm).

In training, each rank sums its count, per-channel sum and sum of squares;
one allreduce (Sum) gives the statistics of the union batch, with which every
rank normalises its own rows, so the output equals what one process would
compute on the union batch. The backward pass needs two more per-channel
sums over the union batch (of dy and of dy * x_hat), one allreduce; the
weight and bias gradients stay local, as in Horovod and torch's SyncBatchNorm
(DistributedOptimizer then reduces them like any gradient). In eval mode, or
when statistics are neither tracked nor taken from the batch, it is a plain
batch norm. Ranks may hold batches of different sizes (none empty).
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from gyre import ops
from gyre.exceptions import InvalidArgumentError


def _channel_view(t, x):
    """A per-channel (C,) tensor shaped to broadcast against x (N, C, ...)."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, name):
        dims = _reduce_dims(x)
        count = x.numel() // x.shape[1]
        xf = x.detach().to(torch.float64)  # the sums of squares in double: no cancellation
        stats = torch.cat([torch.tensor([float(count)], dtype=torch.float64),
                           xf.sum(dims), (xf * xf).sum(dims)])
        stats = ops.allreduce(stats, name=f"{name}.stats", op=ops.Sum)
        total = stats[0]
        channels = x.shape[1]
        mean = stats[1:1 + channels] / total
        var = (stats[1 + channels:] / total - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        x_hat = (x - _channel_view(mean, x).to(x.dtype)) * _channel_view(invstd, x).to(x.dtype)
        out = x_hat
        if weight is not None:
            out = out * _channel_view(weight, x) + _channel_view(bias, x)
        ctx.save_for_backward(x_hat, weight, invstd.to(x.dtype))
        ctx.meta = (name, float(total))
        mean, var = mean.to(x.dtype), var.to(x.dtype)
        ctx.mark_non_differentiable(mean, var, total)
        return out, mean, var, total

    @staticmethod
    def backward(ctx, grad_out, _grad_mean, _grad_var, _grad_total):
        x_hat, weight, invstd = ctx.saved_tensors
        name, total = ctx.meta
        dims = _reduce_dims(grad_out)
        local = torch.cat([grad_out.sum(dims), (grad_out * x_hat).sum(dims)]).to(torch.float64)
        sums = ops.allreduce(local, name=f"{name}.grad", op=ops.Sum).to(grad_out.dtype)
        channels = grad_out.shape[1]
        sum_dy, sum_dy_xhat = sums[:channels], sums[channels:]
        scale = invstd if weight is None else invstd * weight
        grad_x = _channel_view(scale, grad_out) * (
            grad_out - _channel_view(sum_dy, grad_out) / total
            - x_hat * _channel_view(sum_dy_xhat, grad_out) / total)
        grad_w = grad_b = None
        if weight is not None:
            # Local, like any parameter gradient: DistributedOptimizer reduces them.
            grad_w = (grad_out * x_hat).sum(dims)
            grad_b = grad_out.sum(dims)
        return grad_x, grad_w, grad_b, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the union of every rank's batch.

    Same arguments as torch.nn.BatchNorm*d (num_features, eps, momentum,
    affine, track_running_stats); takes (N, C) and (N, C, ...) inputs. Every
    rank must run the same SyncBatchNorm forwards (and backwards) in the same
    order: each is a collective, named by its place in that order, as
    Horovod's unnamed operations are."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise InvalidArgumentError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise InvalidArgumentError(
                f"SyncBatchNorm: input has {input.shape[1]} channels, the module "
                f"{self.num_features}")
        # momentum=None: a cumulative average, as torch's BatchNorm does.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or ops.size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, use_batch_stats, factor, self.eps)
        name = ops._op_name("SyncBatchNorm", None)
        out, mean, var, total = _SyncBatchNormFunction.apply(input, self.weight, self.bias,
                                                             self.eps, name)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var * (float(total) / max(float(total) - 1.0, 1.0))
                self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        return out
