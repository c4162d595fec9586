"""gyre.torch: DistributedOptimizer against single-process training on the
union of every rank's batches, parameter and optimizer-state broadcast, and
the divergence checks (skipped step, drifted parameter, resync)."""

import warnings

import pytest
import torch
from torch import nn

import gyre.torch as hvd

LR = 0.1


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(r, step, n=8):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)


def loss_fn(model, x, y):
    return nn.functional.mse_loss(model(x), y)


def union(size, step):
    xs, ys = zip(*(batch(r, step) for r in range(size)))
    return torch.cat(xs), torch.cat(ys)


def assert_same_on_every_rank(model, size):
    flat = torch.cat([t.detach().flatten() for t in model.state_dict().values()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    for r in range(size):
        assert torch.equal(gathered[r], flat), f"rank {r} differs"


def assert_models_close(model, ref, rtol=1e-5, atol=1e-6):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=rtol, atol=atol, msg=name)


def distributed(model, opt_class=torch.optim.SGD, **kwargs):
    base = opt_class(model.parameters(), lr=LR, **({"momentum": 0.9} if opt_class is torch.optim.SGD else {}))
    return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), **kwargs)


def test_training_matches_one_process_on_the_union(size, rank):
    model = make_model(seed=100 + rank)  # different on every rank until broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ref = make_model(seed=100)
    assert_models_close(model, ref, rtol=0, atol=0)
    opt = distributed(model)
    assert isinstance(opt, torch.optim.SGD)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
    steps_before = hvd.committed_steps()
    for step in range(4):
        opt.zero_grad()
        loss_fn(model, *batch(rank, step)).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref, *union(size, step)).backward()
        ref_opt.step()
    assert_models_close(model, ref)
    assert_same_on_every_rank(model, size)
    assert hvd.committed_steps() == steps_before + 4
    assert hvd.version_vector()[rank] == hvd.committed_steps()


def test_fp16_compression_and_skip_synchronize(size, rank):
    model = make_model(seed=1)
    opt = distributed(model, compression=hvd.Compression.fp16)
    ref = make_model(seed=1)
    opt.zero_grad()
    loss_fn(model, *batch(rank, 50)).backward()
    opt.synchronize()
    # Expected: every rank's gradient rounded to float16, averaged, rounded again.
    per_rank = []
    for r in range(size):
        ref.zero_grad()
        loss_fn(ref, *batch(r, 50)).backward()
        per_rank.append([p.grad.clone() for p in ref.parameters()])
    for i, (name, p) in enumerate(model.named_parameters()):
        assert p.grad.dtype == torch.float32
        expected = (sum(g[i].half().float() for g in per_rank) / size).half().float()
        torch.testing.assert_close(p.grad, expected, rtol=2e-3, atol=1e-4, msg=name)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    with opt.skip_synchronize():
        opt.step()
    assert_same_on_every_rank(model, size)


def test_gradient_predivide_factor_keeps_the_average(size, rank):
    model, ref = make_model(seed=11), make_model(seed=11)
    opt = distributed(model, gradient_predivide_factor=4.0)
    opt.zero_grad()
    loss_fn(model, *batch(rank, 40)).backward()
    opt.step()
    loss_fn(ref, *union(size, 40)).backward()
    torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9).step()
    assert_models_close(model, ref)


def test_backward_passes_per_step_accumulates_then_reduces(size, rank):
    model, ref = make_model(seed=2), make_model(seed=2)
    opt = distributed(model, backward_passes_per_step=2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
    for step in range(3):
        opt.zero_grad()
        for micro in range(2):
            loss_fn(model, *batch(rank, 10 * step + micro)).backward()
            # The allreduces start with the second pass's gradients, not before.
            assert bool(opt._gyre_handles) == (micro == 1)
        opt.step()
        ref_opt.zero_grad()
        # Locally summed over the passes, averaged over ranks.
        total = sum(loss_fn(ref, *batch(r, 10 * step + m)) for r in range(size) for m in range(2))
        (total / size).backward()
        ref_opt.step()
    assert_models_close(model, ref)
    assert_same_on_every_rank(model, size)


def test_parameter_unused_on_one_rank(size, rank):
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.body, self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3), nn.Linear(8, 3)

        def forward(self, x, use_b):
            h = torch.tanh(self.body(x))
            return self.a(h) + (self.b(h) if use_b else 0)

    model, ref = TwoHeads(), TwoHeads()
    opt = distributed(model)
    x, y = batch(rank, 60)
    opt.zero_grad()
    nn.functional.mse_loss(model(x, use_b=rank != 0), y).backward()
    opt.step()  # rank 0 contributes zeros for head b instead of hanging
    ref.zero_grad()
    sum(nn.functional.mse_loss(ref(*batch(r, 60)[:1], use_b=r != 0), batch(r, 60)[1])
        for r in range(size)).div(size).backward()
    torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9).step()
    assert_models_close(model, ref)


def test_zero_grad_with_allreduces_in_flight(size, rank):
    model, ref = make_model(seed=4), make_model(seed=4)
    opt = distributed(model)
    loss_fn(model, *batch(rank, 70)).backward()  # enqueues; never stepped
    opt.zero_grad()  # waits for those allreduces, drops their results
    loss_fn(model, *batch(rank, 71)).backward()
    opt.step()
    loss_fn(ref, *union(size, 71)).backward()
    torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9).step()
    assert_models_close(model, ref)


def test_broadcast_optimizer_state_and_bool_buffers(size, rank):
    model = make_model(seed=5)
    model.register_buffer("mask", torch.tensor([rank == 0, True, False]))
    hvd.broadcast_parameters(dict(model.named_buffers()), root_rank=0)
    assert model.mask.tolist() == [True, True, False]
    root = size - 1
    base = torch.optim.Adam(model.parameters(), lr=0.5 if rank == root else 0.01)
    if rank == root:  # only the root has state (as after loading a checkpoint)
        for step in range(2):
            base.zero_grad()
            loss_fn(model, *batch(rank, step)).backward()
            base.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(base, root_rank=root)
    assert base.param_groups[0]["lr"] == 0.5
    state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for s in base.state_dict()["state"].values()]
    root_state = hvd.broadcast_object(state, root_rank=root)
    assert len(state) == len(root_state) == len(list(model.parameters()))
    for mine, theirs in zip(state, root_state):
        for key in theirs:
            torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=0)


def test_skipped_step_raises_divergence_on_every_rank_then_resync(size, rank, multi_rank):
    model = make_model(seed=6)
    opt = distributed(model)
    skipper = size - 1
    with pytest.raises(hvd.DivergenceError):
        for step in range(3):
            opt.zero_grad()
            loss_fn(model, *batch(rank, 80 + step)).backward()
            if step == 1 and rank == skipper:
                continue  # this rank skips optimizer.step() once
            opt.step()
    # Repair: every rank takes the newest model, optimizer state (the
    # skipper's momentum is stale too) and the agreed step count.
    hvd.resync(model, policy="newest", optimizer=opt)
    vv = hvd.version_vector()
    assert len(set(vv)) == 1, vv
    hvd.check_consistency(model)
    opt.zero_grad()
    loss_fn(model, *batch(rank, 90)).backward()
    opt.step()  # training goes on
    assert_same_on_every_rank(model, size)


def test_a_skipped_whole_iteration_pairs_with_the_next_undetected(size, rank, multi_rank):
    # What DistributedOptimizer's docstring says is not detected: a rank that
    # skips an iteration entirely (no backward, no step) has its iteration
    # k + 1 paired with the others' iteration k, at equal step counts; here it
    # runs one more iteration at the end, so every allreduce is matched. The
    # parameters stay equal (everyone applies the same averages).
    model = make_model(seed=9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = distributed(model)
    skipper = size - 1
    iterations = [0, 2, 3] if rank == skipper else [0, 1, 2]
    for step in iterations:
        opt.zero_grad()
        loss_fn(model, *batch(rank, 120 + step)).backward()
        opt.step()  # no DivergenceError: the skip is not seen
    assert len(set(hvd.allgather_object(hvd.committed_steps()))) == 1
    assert_same_on_every_rank(model, size)


def test_check_consistency_names_the_perturbed_parameter_and_resync_repairs(size, rank, multi_rank):
    model = make_model(seed=7)
    hvd.check_consistency(model)  # identical: no error
    victim = size - 1
    if rank == victim:
        with torch.no_grad():
            model[2].bias[1] += 0.25
    with pytest.raises(hvd.DivergenceError, match=r"'2\.bias'") as info:
        hvd.check_consistency(model)
    assert set(info.value.mismatches) == {"2.bias"}
    groups = list(info.value.mismatches["2.bias"].values())
    assert sorted(groups) == sorted([[r for r in range(size) if r != victim], [victim]])
    hvd.resync(model, policy="newest")  # all at the same step: the lowest rank wins
    hvd.check_consistency(model)
    assert model[2].bias[1].item() == pytest.approx(make_model(seed=7)[2].bias[1].item(), abs=0)


def test_resync_average(size, rank):
    model = nn.Sequential(make_model(seed=8), nn.BatchNorm1d(3))
    with torch.no_grad():
        model[0][0].weight.fill_(float(rank))
        model[1].running_mean.fill_(2.0 * rank)
        model[1].num_batches_tracked.fill_(10 + rank)  # int64: not averaged
    hvd.resync(model, policy="average")
    hvd.check_consistency(model)
    torch.testing.assert_close(model[0][0].weight, torch.full_like(model[0][0].weight, (size - 1) / 2))
    torch.testing.assert_close(model[1].running_mean, torch.full((3,), float(size - 1)))
    assert model[1].num_batches_tracked.item() == 10  # every rank at the same step: rank 0's


def test_differentiable_collectives(size, rank):
    # Output gradient on rank s: w_s = s + 1 (times a per-element pattern).
    pattern = torch.arange(1.0, 4.0)
    w_sum = sum(s + 1 for s in range(size)) * pattern

    x = torch.full((3,), float(rank), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0)
    assert y.requires_grad
    (y * (rank + 1) * pattern).sum().backward()
    torch.testing.assert_close(x.grad, 2.0 * w_sum)

    x = torch.full((3,), float(rank), requires_grad=True)
    (hvd.allreduce(x) * (rank + 1) * pattern).sum().backward()  # Average
    torch.testing.assert_close(x.grad, w_sum / size)

    # Horovod's allgather and broadcast gradients average the output
    # gradients over ranks (horovod/torch/mpi_ops.py), they do not sum them.
    x = torch.full((rank + 1, 3), float(rank), requires_grad=True)
    y = hvd.allgather(x)
    assert y.shape[0] == size * (size + 1) // 2
    (y * (rank + 1) * pattern).sum().backward()
    torch.testing.assert_close(x.grad, (w_sum / size).expand(rank + 1, 3))

    root = size - 1
    x = torch.full((3,), float(rank), requires_grad=True)
    y = hvd.broadcast(x, root_rank=root)
    assert y.tolist() == [float(root)] * 3
    (y * (rank + 1) * pattern).sum().backward()
    torch.testing.assert_close(x.grad, w_sum / size if rank == root else torch.zeros(3))

    # Min/Max/Product have no gradient: backward through them raises
    # (rather than dropping that path's gradient silently).
    y = hvd.allreduce(torch.ones(2, requires_grad=True), op=hvd.Max)
    with pytest.raises(hvd.InvalidArgumentError, match="not differentiable"):
        y.sum().backward()


def test_optimizer_argument_errors():
    model = make_model(seed=9)
    base = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(hvd.InvalidArgumentError, match="were not named"):
        hvd.DistributedOptimizer(base, named_parameters=list(model.named_parameters())[:1])
    with pytest.raises(hvd.InvalidArgumentError, match="must be unique"):
        named = list(model.named_parameters())
        hvd.DistributedOptimizer(base, named_parameters=named + named[:1])
    with pytest.raises(hvd.InvalidArgumentError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(base, backward_passes_per_step=0)
    with pytest.raises(hvd.InvalidArgumentError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(base, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(hvd.InvalidArgumentError, match="policy"):
        hvd.resync(model, policy="oldest")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd.DistributedOptimizer(base)  # unnamed: positional names, no warning
