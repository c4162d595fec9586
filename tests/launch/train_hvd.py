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

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
gen = torch.Generator().manual_seed(1000 + hvd.rank())
for _ in range(20):
    x = torch.randn(16, 32, generator=gen)
    y = torch.randn(16, 4, generator=gen)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
assert torch.equal(hvd.broadcast(flat, root_rank=0, name="check"), flat), "ranks differ"
if hvd.rank() == 0:
    torch.save({"params": flat, "size": hvd.size(), "local_size": hvd.local_size()}, sys.argv[1])
    print(f"hvd: rank {hvd.rank()} of {hvd.size()}, local size {hvd.local_size()}, "
          f"|w| = {flat.norm():.6f}", flush=True)
