"""gyre.torch.LocalSGD under mpirun -np 2 and -np 3: period 1 with plain
averaging equals synchronous gradient averaging for SGD; between rounds the
ranks' parameters differ and right after one they are identical; DiLoCo's
Nesterov outer step against a reference computed in one process from every
rank's local parameters; buffers averaged; the round counted as a commit."""

import functools

import pytest
import torch

import gyre
import gyre.torch as hvd


def _net(bn=False):
    torch.manual_seed(3)
    layers = [torch.nn.Linear(6, 8)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(8))
    layers += [torch.nn.Tanh(), torch.nn.Linear(8, 2)]
    return torch.nn.Sequential(*layers)


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _all_equal(t):
    every = hvd.allgather(t.reshape(1, -1))
    return all(torch.equal(every[0], every[i]) for i in range(every.shape[0]))


def test_period_one_equals_synchronous_sgd(rank, size):
    a, b = _net(), _net()
    local = hvd.LocalSGD(torch.optim.SGD(a.parameters(), lr=0.1), a, period=1)
    sync = hvd.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1),
                                    named_parameters=b.named_parameters())
    for step in range(5):
        x, y = _batch(rank, step)
        for model, opt in ((a, local), (b, sync)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    # Averaging the parameters after a step equals stepping with the average
    # gradient, up to float32 rounding.
    torch.testing.assert_close(_flat(a), _flat(b), rtol=1e-5, atol=1e-6)
    assert local.rounds == 5


def test_ranks_differ_between_rounds_and_agree_after(rank, size):
    model = _net()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=3)
    assert _all_equal(_flat(model))  # rank 0's model everywhere at the start
    for step in range(6):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        steps_before = gyre.committed_steps()
        opt.step()
        if (step + 1) % 3 == 0:
            assert _all_equal(_flat(model))
            assert gyre.committed_steps() == steps_before + 1
        elif size > 1:
            assert not _all_equal(_flat(model))
    assert opt.rounds == 2


def test_diloco_outer_step_matches_a_single_process_reference(rank, size):
    model = _net()
    opt = hvd.LocalSGD(torch.optim.AdamW(model.parameters(), lr=0.01), model, period=2,
                       outer_optimizer=hvd.LocalSGD.diloco_outer)
    ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    ref_outer = torch.optim.SGD(ref, lr=0.7, momentum=0.9, nesterov=True)
    for step in range(6):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if (step + 1) % 2 == 0:
            # Just before the round: every rank's local parameters, gathered.
            opt.optimizer.step()
            local = [hvd.allgather(p.detach().unsqueeze(0)) for p in model.parameters()]
            opt.local_step += 1
            opt.sync()
            with torch.no_grad():
                for r, every in zip(ref, local):
                    r.grad = (r.detach().unsqueeze(0) - every).mean(dim=0)
            ref_outer.step()
            for p, r in zip(model.parameters(), ref):
                torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
        else:
            opt.step()
    # The outer optimizer's state is the same on every rank.
    for s in opt.outer_optimizer.state.values():
        assert _all_equal(s["momentum_buffer"].reshape(-1))


def test_buffers_are_averaged_and_fp16_compression(rank, size):
    model = _net(bn=True)
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                       compression=gyre.Compression.fp16)
    for step in range(2):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 1:
            mean_before = hvd.allreduce(model[1].running_mean.detach().clone(), op=gyre.Average)
        opt.step()
    assert _all_equal(model[1].running_mean)
    torch.testing.assert_close(model[1].running_mean, mean_before, rtol=1e-3, atol=1e-3)
    assert _all_equal(_flat(model))


def test_refusals():
    model = _net()
    with pytest.raises(gyre.InvalidArgumentError, match="period"):
        hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, period=0)
    with pytest.raises(gyre.InvalidArgumentError, match="compression"):
        hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, period=2, compression="fp16")
