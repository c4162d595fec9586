"""The small task of the elastic local-SGD tests (elastic_local_sgd.py,
elastic_partial_local_sgd.py): a 2-layer model, its inner optimizer, each
rank's deterministic batches, and the checks' flat views and checksums."""
import torch

BS = 8


def new_model(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 1))


def new_inner(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def batch(rank, size, step):
    """Rank `rank` of `size`'s batch at local step `step`."""
    g = torch.Generator().manual_seed(10000 * size + 100 * rank + step)
    x = torch.randn(BS, 8, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def loss_of(model, rank, size, step):
    x, y = batch(rank, size, step)
    return torch.nn.functional.mse_loss(model(x), y)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def checksum(model):
    """Two float64 sums of the parameters: plain and weighted by position."""
    v = flat(model.parameters()).double()
    return torch.stack([v.sum(), (v * torch.arange(1, v.numel() + 1, dtype=torch.float64)).sum()])
