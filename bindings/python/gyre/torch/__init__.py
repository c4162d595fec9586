"""gyre for PyTorch, with Horovod's names::

    import gyre.torch as gyre
    gyre.init()
    optimizer = gyre.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    gyre.broadcast_parameters(model.state_dict(), root_rank=0)
    gyre.broadcast_optimizer_state(optimizer, root_rank=0)

A drop-in for ``horovod.torch``: ``import gyre.torch as hvd`` (see
docs/horovod.md). Everything in ``gyre`` (the collectives, which take torch
tensors directly) is here too, with the collectives differentiable as in
Horovod (gyre/torch/autograd.py), plus the optimizer wrapper, parameter and
optimizer-state broadcast, SyncBatchNorm, sparse allreduce, and the
divergence checks ``check_consistency`` and ``resync``.
"""

import torch as _torch

from gyre import *  # noqa: F401,F403
from gyre import __all__ as _gyre_all

# Differentiable versions of the collectives replace gyre's here.
from .autograd import (allgather, allreduce, alltoall, broadcast, grouped_allgather,  # noqa: F811
                       grouped_allreduce, grouped_reducescatter, reducescatter)
from .consistency import check_consistency, resync
from .functions import broadcast_optimizer_state, broadcast_parameters, sparse_allreduce_async
from .optimizer import DistributedOptimizer
from .async_optimizer import AsyncOptimizer
from .local_sgd import LocalSGD
from .partial_local_sgd import PartialLocalSGD
from .shared import empty_shared
from .sync_batch_norm import SyncBatchNorm
from . import elastic  # noqa: E402 (Horovod's hvd.elastic)


def _check_torch_version():
    major, minor = (int(p) for p in _torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) < (2, 1):
        raise ImportError(
            f"gyre.torch needs torch >= 2.1 (register_post_accumulate_grad_hook); found {_torch.__version__}"
        )


_check_torch_version()

__all__ = list(_gyre_all) + [
    "DistributedOptimizer", "AsyncOptimizer", "LocalSGD", "PartialLocalSGD",
    "broadcast_parameters", "broadcast_optimizer_state",
    "sparse_allreduce_async", "SyncBatchNorm", "check_consistency", "resync", "elastic",
    "empty_shared",
]
