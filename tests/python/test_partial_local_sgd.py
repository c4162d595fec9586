"""gyre.torch.PartialLocalSGD under mpirun -np 2 and -np 3: with every rank on
time a round merges everyone and equals a one-process DiLoCo reference (the
outer optimizer on the aggregator); a straggler (the last rank sleeps inside
its inner steps, well beyond late_after_s) does not hold the others: the
round closes without it, its contribution is merged late (max_staleness
large) or rejected with a warning (max_staleness 0), counted, and the ranks
that adopt a round all hold the same model."""

import hashlib
import logging
import time

import pytest
import torch

import gyre
import gyre.torch as hvd


def _net():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                     [b.detach().reshape(-1).float() for b in model.buffers()
                      if b.dtype.is_floating_point])


def _digest(model):
    return hashlib.sha1(_flat(model).numpy().tobytes()).hexdigest()


def _inner_step(opt, model, rank, step):
    x, y = _batch(rank, step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()


def test_on_time_rounds_merge_everyone_and_match_a_diloco_reference(rank, size):
    model = _net()
    opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                              late_after_s=30.0, outer_optimizer=hvd.LocalSGD.diloco_outer,
                              timeout_s=30.0)
    params = list(model.parameters())
    ref = [p.detach().clone().requires_grad_(True) for p in params]
    ref_outer = torch.optim.SGD(ref, lr=0.7, momentum=0.9, nesterov=True)
    commits = gyre.committed_steps()
    for step in range(4):
        _inner_step(opt, model, rank, step)
        if (step + 1) % 2:
            opt.step()
            continue
        opt.optimizer.step()
        local = [hvd.allgather(p.detach().unsqueeze(0)) for p in params]
        bn = hvd.allgather(model[1].running_mean.detach().unsqueeze(0))
        opt.local_step += 1
        opt.round()  # late_after_s is long: the round waits for every rank
        with torch.no_grad():
            for r, every in zip(ref, local):
                r.grad = (r.detach().unsqueeze(0) - every).mean(dim=0)
        ref_outer.step()
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model[1].running_mean, bn.mean(dim=0), rtol=1e-5, atol=1e-6)
        every = gyre.allgather_object(_digest(model))
        assert len(set(every)) == 1
    assert opt.version == 2 and gyre.committed_steps() == commits + 2
    c = opt.counters()
    assert (c["rounds"], c["merged_late"], c["rejected"], c["rounds_late"]) == (2, 0, 0, 0)
    assert opt.merged_rounds() == [2] * size
    history = opt.round_history()
    opt.close()
    if rank == 0:
        assert [h["merged"] for h in history] == [list(range(size))] * 2
        assert all(not h["late"] and not h["rejected"] for h in history)
    assert len(set(gyre.allgather_object(_digest(model)))) == 1


def _run_with_straggler(rank, size, max_staleness):
    """The last rank sleeps 1 s before its 2nd inner step (round 1 is due after
    it); rounds close 0.2 s after the first on-time contribution. Returns
    (opt, history on rank 0, every rank's [(version, digest)] after each
    adoption, the seconds the rank's first round took to return)."""
    straggler = size - 1
    model = _net()
    opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                              late_after_s=0.2, max_staleness=max_staleness, timeout_s=60.0)
    seen = []
    first_round_s = None
    for step in range(6):
        _inner_step(opt, model, rank, step)
        if rank == straggler and step == 1:
            time.sleep(1.0)  # makes this rank late; nothing waits on a sleep here
        start = time.monotonic()
        opt.step()
        if (step + 1) % 2 == 0:
            seen.append((opt.version, _digest(model)))
            if first_round_s is None:
                first_round_s = time.monotonic() - start
    opt.close()
    history = opt.round_history()  # complete once the aggregator has finished
    seen.append((opt.version, _digest(model)))
    return opt, gyre.broadcast_object(history, 0), gyre.allgather_object(seen), first_round_s


def _check_common(opt, history, seen, rank, size):
    straggler = size - 1
    # Round 1 closed without the straggler: the others did not wait for it.
    assert history[0]["round"] == 1 and straggler not in history[0]["merged"]
    assert history[0]["merged"], history
    # Every contribution (3 per rank) is accounted for exactly once.
    for r in range(size):
        assert sum(h["merged"].count(r) + h["late"].count(r) + h["rejected"].count(r)
                   for h in history) == 3, (r, history)
    # The same round is the same model on every rank that adopted it.
    by_version = {}
    for per_rank in seen:
        for version, digest in per_rank:
            by_version.setdefault(version, set()).add(digest)
    assert all(len(d) == 1 for d in by_version.values()), by_version
    # close() leaves every rank with the final model.
    assert len({per_rank[-1] for per_rank in seen}) == 1
    c = opt.counters()
    assert c["rounds"] == len([h for h in history if h["round"] is not None])
    if rank == straggler:
        assert c["rounds_late"] >= 1


def test_straggler_contribution_merged_into_a_later_round(rank, size, multi_rank):
    opt, history, seen, _ = _run_with_straggler(rank, size, max_staleness=10)
    _check_common(opt, history, seen, rank, size)
    straggler = size - 1
    first = next(h for h in history if straggler in h["merged"] + h["late"] + h["rejected"])
    assert straggler in first["late"], history  # its round-1 contribution, merged late
    assert not any(h["rejected"] for h in history)
    c = opt.counters()
    assert c["merged_late_by_rank"][straggler] >= 1 and c["rejected_by_rank"] == [0] * size


def test_straggler_contribution_beyond_max_staleness_is_rejected(rank, size, multi_rank, caplog):
    caplog.set_level(logging.WARNING, logger="gyre.torch.local_sgd")
    opt, history, seen, _ = _run_with_straggler(rank, size, max_staleness=0)
    _check_common(opt, history, seen, rank, size)
    straggler = size - 1
    first = next(h for h in history if straggler in h["merged"] + h["late"] + h["rejected"])
    assert straggler in first["rejected"], history
    c = opt.counters()
    assert c["rejected_by_rank"][straggler] >= 1 and c["merged_late_by_rank"] == [0] * size
    if rank == straggler:
        assert c["rejected"] >= 1
        assert any("rejected" in r.getMessage() for r in caplog.records), caplog.records


def test_refusals():
    model = _net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(gyre.InvalidArgumentError, match="period"):
        hvd.PartialLocalSGD(sgd, model, period=0, late_after_s=1.0)
    with pytest.raises(gyre.InvalidArgumentError, match="late_after_s"):
        hvd.PartialLocalSGD(sgd, model, period=2, late_after_s=-1.0)
    with pytest.raises(gyre.InvalidArgumentError, match="max_staleness"):
        hvd.PartialLocalSGD(sgd, model, period=2, late_after_s=1.0, max_staleness=-1)
    with pytest.raises(gyre.InvalidArgumentError, match="warmup_steps"):
        hvd.PartialLocalSGD(sgd, model, period=2, late_after_s=1.0, warmup_steps=-1)


def test_warmup_steps_each_end_in_a_round(rank, size):
    model = _net()
    opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=4,
                              late_after_s=30.0, warmup_steps=3)
    # Rounds after steps 1, 2, 3 (the warm-up), then 4 and 8.
    versions = []
    for step in range(1, 10):
        _inner_step(opt, model, rank, step)
        opt.step()
        versions.append(opt.version)
        digests = gyre.allgather_object(_digest(model), name=f"warmup.digest.{step}")
        assert (len(set(digests)) == 1) == (step in (1, 2, 3, 4, 8)), (step, digests)
    assert versions == [1, 2, 3, 4, 4, 4, 4, 5, 5]
    opt.close()
