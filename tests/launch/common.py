"""What the launcher tests' training scripts share: the model (the same
initial parameters on every rank), each rank's own data, the loop, and the
parameters flattened for comparison."""
import torch


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def train(forward, opt, rank: int, steps: int = 20) -> None:
    """`steps` steps of MSE regression on rank `rank`'s own random batches."""
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(forward(x), y).backward()
        opt.step()


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
