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


def survivor_pass(start_rank, done, back_to, state, step_done_at, fail, hvd):
    """Prints a survivor's PASS line: `done` (what it finished), now rank r
    of n, back to step `back_to`, the rebuild's time and the recovery's
    (from the failure this rank saw, elastic.run's record, to the first
    step completed after it); fails if no failure was seen or no step
    completed after it."""
    failed_at = getattr(state, "_failure_seen_at", None)
    later = [t for _, t in step_done_at if failed_at is not None and t > failed_at]
    if not later:
        fail("no failure was seen, or no step completed after it")
    print(f"elastic: rank {start_rank} PASS: {done}, now rank {hvd.rank()} of {hvd.size()}, "
          f"back to step {back_to} after the failure, rebuild "
          f"{state._last_rebuild['seconds']:.3f} s, recovery {later[0] - failed_at:.3f} s",
          flush=True)
