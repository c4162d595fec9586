"""A small DDP training run for the launcher tests (scripts/launch.sh):

    torchrun --nproc_per_node=N tests/launch/train_ddp.py BACKEND OUT

`init_process_group(BACKEND)` with torchrun's environment and nothing else,
20 steps of SGD on a two-layer model (each rank its own data), then rank 0
saves the parameters to OUT; the test compares gyre's with gloo's.
"""
import sys

import torch
import torch.distributed as dist
from common import flat_parameters, make_model, train

backend, out = sys.argv[1], sys.argv[2]
if backend == "gyre":
    import gyre.torch.distributed  # noqa: F401 (registers the backend)

dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
model = make_model()
ddp = torch.nn.parallel.DistributedDataParallel(model)
train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), rank)
# Every rank holds the same parameters (DDP's promise): checked here too.
flat = flat_parameters(model)
gathered = [torch.empty_like(flat) for _ in range(size)]
dist.all_gather(gathered, flat)
assert all(torch.equal(g, flat) for g in gathered), "ranks hold different parameters"
if rank == 0:
    torch.save(flat, out)
    print(f"{backend}: {size} ranks, |w| = {flat.norm():.6f}", flush=True)
dist.destroy_process_group()
