"""Data-parallel training of a small CNN with gyre, on synthetic data.

    mpirun -np 2 python examples/train_cnn.py [--epochs 5]

The data set is generated here (no download): 16x16 single-channel images of
one of four patterns (horizontal stripes, vertical stripes, a checkerboard, a
centred blob) with random phase, contrast and noise; the label is the
pattern. Every rank builds the same data set and trains on its own shard;
gyre averages the gradients while backward runs. Rank 0 prints the loss
(averaged over all ranks) and the accuracy per epoch.
"""

import argparse
import time

import torch
from torch import nn

import gyre.torch as gyre


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    coords = torch.arange(16, dtype=torch.float32)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    phase = torch.rand(n, 1, 1, generator=g) * 6.28
    freq = 0.8 + 0.4 * torch.rand(n, 1, 1, generator=g)
    patterns = torch.stack([
        torch.sin(freq * yy + phase),                                    # horizontal stripes
        torch.sin(freq * xx + phase),                                    # vertical stripes
        torch.sin(freq * xx + phase) * torch.sin(freq * yy + phase),     # checkerboard
        torch.exp(-((xx - 7.5) ** 2 + (yy - 7.5) ** 2) / (8 + 8 * torch.rand(n, 1, 1, generator=g))),
    ], dim=1)
    images = patterns[torch.arange(n), labels]
    contrast = 0.3 + 0.7 * torch.rand(n, 1, 1, generator=g)
    images = contrast * images + 1.5 * torch.randn(n, 16, 16, generator=g)
    return images.unsqueeze(1), labels


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(),
                                        nn.Linear(32, 4))

    def forward(self, x):
        return self.classifier(self.features(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--fp16", action="store_true", help="compress gradients to float16")
    args = parser.parse_args()

    gyre.init()
    rank, size = gyre.rank(), gyre.size()
    torch.set_num_threads(1)  # ranks share the cores
    torch.manual_seed(1234 + rank)  # different initial weights: the broadcast fixes that

    images, labels = make_dataset(args.samples, seed=42)
    shard = torch.arange(rank, args.samples, size)  # this rank's share
    images, labels = images[shard], labels[shard]

    model = SmallCNN()
    # Scale the learning rate with the number of ranks (the global batch grows).
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    optimizer = gyre.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=gyre.Compression.fp16 if args.fp16 else gyre.Compression.none)
    gyre.broadcast_parameters(model.state_dict(), root_rank=0)
    gyre.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = nn.CrossEntropyLoss()

    if rank == 0:
        print(f"training SmallCNN on {args.samples} synthetic images, {size} ranks, "
              f"batch {args.batch_size} per rank", flush=True)
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch + 100 * rank))
        total_loss, correct, seen = 0.0, 0, 0
        n_batches = len(labels) // args.batch_size  # equal on every rank: shards differ by < 1 batch
        for b in range(n_batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = images[idx], labels[idx]
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
        stats = gyre.allreduce(torch.tensor([total_loss, correct, seen], dtype=torch.float64),
                               op=gyre.Sum, name=f"epoch_stats.{epoch}")
        if rank == 0:
            print(f"epoch {epoch}: loss {stats[0] / stats[2]:.4f}  accuracy {stats[1] / stats[2]:.3f}  "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)

    gyre.check_consistency(model)  # raises DivergenceError if any rank drifted
    if rank == 0:
        print("parameters identical on every rank", flush=True)
    gyre.shutdown()


if __name__ == "__main__":
    main()
