"""A small training run on gyre's Horovod API for the launcher tests
(scripts/launch.sh), the same whatever started it (torchrun or mpiexec):

    torchrun --nproc_per_node=N tests/launch/train_hvd.py OUT
    mpiexec -n N python tests/launch/train_hvd.py OUT

Rank 0 saves the parameters to OUT, with the world it saw; the test
compares the two launches.
"""
import sys

import torch

import gyre.torch as hvd
from common import flat_parameters, make_model, train

hvd.init()
model = make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
train(model, opt, hvd.rank())
flat = flat_parameters(model)
assert torch.equal(hvd.broadcast(flat, root_rank=0, name="check"), flat), "ranks differ"
if hvd.rank() == 0:
    torch.save({"params": flat, "size": hvd.size(), "local_size": hvd.local_size()}, sys.argv[1])
    print(f"hvd: rank {hvd.rank()} of {hvd.size()}, local size {hvd.local_size()}, "
          f"|w| = {flat.norm():.6f}", flush=True)
