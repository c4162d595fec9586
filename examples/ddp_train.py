"""A DistributedDataParallel training script, on the gyre backend.

    mpirun -np 2 python examples/ddp_train.py [--epochs 3] [--backend gyre]

Written the way DDP scripts are: init_process_group, a DistributedSampler,
DDP around the model, rank 0 reports. Moving a gloo script to gyre takes the
import below and the backend string; run it with mpirun instead of torchrun.
The data is synthetic (no download): points of four Gaussian clusters in 16
dimensions, the label is the cluster. At the end, every rank checks that its
parameters are the same as rank 0's (DDP keeps them identical) and that the
model learned something (accuracy well above chance); the exit status says.
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import gyre.torch.distributed  # noqa: F401  registers the "gyre" backend


def make_dataset(n: int, seed: int = 0) -> TensorDataset:
    centres = 2.0 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed + 1)
    labels = torch.randint(0, 4, (n,), generator=g)
    points = centres[labels] + torch.randn(n, 16, generator=g)
    return TensorDataset(points, labels)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--backend", default="gyre",
                        help="gyre; gloo to compare (it needs torchrun's MASTER_ADDR, RANK, ...)")
    args = parser.parse_args(argv)

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # DDP broadcasts rank 0's initial parameters

    train = make_dataset(4096)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, count = torch.zeros(1), torch.zeros(1)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += loss.detach() * len(y)
            count += len(y)
        stats = torch.cat([total, count])
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch}: loss {stats[0].item() / stats[1].item():.4f} ({world} ranks)")

    test = make_dataset(1024, seed=1)
    with torch.no_grad():
        acc = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    same = torch.equal(flat, ref)
    if rank == 0:
        print(f"test accuracy {acc.item():.3f}")
    dist.destroy_process_group()
    if not same:
        print(f"rank {rank}: parameters differ from rank 0's", file=sys.stderr)
        return 1
    if acc < 0.6:
        print(f"rank {rank}: accuracy {acc.item():.3f} is too low", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
