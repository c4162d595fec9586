"""Tensors in the host's shared pool (``GYRE_SHM_POOL_BYTES``).

``empty_shared(shape, dtype)`` gives a CPU tensor whose memory the other ranks
of the host map (``gyre::alloc_shared``). An in-place allreduce of such
tensors (``allreduce_``, 64 KiB or more), one on every rank, reduces them
straight from one another instead of copying through the shared-memory
slots (docs/architecture.md, "Shared buffers"): a flat gradient buffer, an
accumulation buffer, anything reduced again and again in place. Otherwise
it is an ordinary tensor; its memory goes back to the pool when the tensor
(and every view of it) is gone, and stays valid after ``shutdown()``.
"""

import math
from typing import Sequence, Union

import torch

from gyre import _gyre


def empty_shared(*size: Union[int, Sequence[int]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor of ``size`` in the host's pool.

    Raises MemoryError when the pool has no room for it, or there is no pool
    (``GYRE_SHM_POOL_BYTES`` unset, or the ranks not on one host); raises
    gyre's StateError before ``init()``."""
    shape = torch.Size(size[0] if len(size) == 1 and not isinstance(size[0], int) else size)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)  # no memory to share
    buf = _gyre.alloc_shared(max(numel * itemsize, 1))
    if buf is None:
        raise MemoryError(
            f"gyre.torch.empty_shared: no room for {numel * itemsize} bytes in the host's shared "
            "pool (GYRE_SHM_POOL_BYTES sets each rank's part; the pool exists only when every "
            "rank is on one host)")
    # frombuffer holds `buf` until the tensor's storage goes, which frees it.
    return torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)
