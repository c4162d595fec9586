"""A Horovod PyTorch training script, unchanged but for its import line.

    mpirun -np 2 python examples/horovod_mnist_style.py [--epochs 2]

Written the way Horovod's own pytorch_mnist.py example is (hvd.init(),
DistributedSampler with num_replicas=hvd.size(), broadcast_parameters,
broadcast_optimizer_state, DistributedOptimizer with named_parameters and
compression, metric averaging with hvd.allreduce), on synthetic MNIST-shaped
data (28x28 images of ten noisy class prototypes: no download). Exits
non-zero if the model did not learn or the ranks' parameters differ.
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import gyre.torch as hvd  # the one line that differs from a Horovod script


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = nn.Linear(256, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = x.view(-1, 256)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_mnist(n, seed):
    """Ten fixed 28x28 patterns of +-1 pixels (the same on every rank), plus noise."""
    g = torch.Generator().manual_seed(1234)
    prototypes = (torch.rand(10, 1, 28, 28, generator=g) > 0.5).float() * 2 - 1
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = prototypes[labels] + 1.0 * torch.randn(n, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def main():
    parser = argparse.ArgumentParser(description="Horovod-style training on gyre")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False)
    parser.add_argument("--use-adasum", action="store_true", default=False)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)

    train_dataset = synthetic_mnist(2048, seed=1)
    test_dataset = synthetic_mnist(256, seed=2)
    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=64, sampler=test_sampler)

    model = Net()
    # Horovod: scale learning rate by the number of GPUs (here: ranks).
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=1.0)

    def train(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()

    def test():
        model.eval()
        test_loss = 0.
        test_accuracy = 0.
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.data.max(1, keepdim=True)[1]
                test_accuracy += pred.eq(target.data.view_as(pred)).float().sum().item()
        # Horovod: use test_sampler to determine the number of examples in
        # this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100. * test_accuracy:.2f}%",
                  flush=True)
        return test_accuracy

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        accuracy = test()

    # Not part of a Horovod script: the checks that make this a test.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = torch.equal(hvd.broadcast(flat, root_rank=0, name="final.parameters"), flat)
    hvd.shutdown()
    if not same:
        print("ranks ended with different parameters", file=sys.stderr)
        return 1
    if accuracy < 0.3:  # chance is 0.1
        print(f"accuracy {accuracy:.2f} after {args.epochs} epochs: the model did not learn",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
