"""gyre.torch.empty_shared under mpirun with GYRE_SHM_POOL_BYTES=8M (2 and 3
ranks): tensors in the host's pool reduced in place straight from one another
(runtime_stats()["pool_allreduces"] counts them) with the slots' results, the
memory given back to the pool when the tensor goes, MemoryError when the pool
has no room, and a tensor read after shutdown() still holding its result."""
import gc
import os
import sys

import torch

import gyre.torch as gt
from gyre import _gyre

assert os.environ.get("GYRE_SHM_POOL_BYTES") == "8M", "run with GYRE_SHM_POOL_BYTES=8M"
gt.init()
rank, size = gt.rank(), gt.size()
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def filled(t):
    flat = t.view(-1)
    flat.copy_(rank + torch.arange(flat.numel(), dtype=torch.float64) % 7)
    return t


def want(t):
    i = torch.arange(t.numel(), dtype=torch.float64) % 7
    return (size * (size - 1) / 2 + size * i).to(t.dtype).view(t.shape)


before = gt.runtime_stats()["pool_allreduces"]
t = filled(gt.empty_shared(3, 100001))
check(t.shape == (3, 100001) and t.dtype == torch.float32 and t.is_contiguous(), "shape")
gt.allreduce_(t, op=gt.Sum, name="pool.t")
check(torch.equal(t, want(t)), "float32 sum")
d = filled(gt.empty_shared((50000,), dtype=torch.float64))
gt.allreduce_(d, op=gt.Average, name="pool.d")
priv = filled(torch.empty(50000, dtype=torch.float64))
gt.allreduce_(priv, op=gt.Average, name="private.d")
check(torch.equal(d, priv), "float64 average: the slots' bits")
check(gt.runtime_stats()["pool_allreduces"] == before + 2, "both reduced from the pool")

# The memory goes back when the tensor (and its views) go.
big = gt.empty_shared(1 << 20)  # 4 MiB of the 8
check(_gyre.alloc_shared(5 << 20) is None, "5 MiB while 4 are out")
view = big[10:]
del big
gc.collect()
check(_gyre.alloc_shared(5 << 20) is None, "a view still holds the memory")
del view
gc.collect()
b = _gyre.alloc_shared(5 << 20)
check(b is not None, "5 MiB once the tensor is gone")
del b
try:
    gt.empty_shared(4 << 20)  # 16 MiB: more than the pool
    check(False, "MemoryError")
except MemoryError as e:
    check("GYRE_SHM_POOL_BYTES" in str(e), "the error names the variable")

gt.shutdown()
check(torch.equal(t, want(t)), "after shutdown the tensor still holds its result")
t += 1  # and can be written
del t, d
gc.collect()

if failures:
    print(f"rank {rank}: FAILED: {failures}", flush=True)
    sys.exit(1)
print(f"rank {rank}: OK", flush=True)
