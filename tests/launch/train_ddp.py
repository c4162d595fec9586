"""A small DDP training run for the launcher tests (scripts/launch.sh):

    torchrun --nproc_per_node=N tests/launch/train_ddp.py BACKEND OUT

`init_process_group(BACKEND)` with torchrun's environment and nothing else,
20 steps of SGD on a two-layer model (each rank its own data), then rank 0
saves the parameters to OUT; the test compares gyre's with gloo's.
"""
import os
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
if backend == "gloo":
    # The reference run ends here, without the interpreter's teardown: gloo's
    # own teardown aborts now and then under load ("terminate called without
    # an active exception" from a gloo rank after the last collective, no
    # gyre code loaded; twice in a row in one CI run while the suite built
    # its sanitizer tree beside it). Its parameters are saved and checked by
    # now. gyre's runs exit normally: a crash at their exit is a failure.
    sys.stdout.flush()
    os._exit(0)
