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


@pytest.mark.parametrize("fragments,sync_delay", [(2, 0), (2, 1), (3, 2)])
def test_streaming_with_every_rank_on_time_equals_local_sgd_streaming(rank, size, fragments,
                                                                       sync_delay):
    """Fragments with staggered rounds and a sync delay: with every rank on
    time each fragment round merges everyone, so the model equals LocalSGD's
    streaming (a collective per fragment round) with the same outer step, at
    every step; one commit per fragment round."""
    period = 4
    model, twin = _net(), _net()
    opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=period,
                              late_after_s=30.0, outer_optimizer=hvd.LocalSGD.diloco_outer,
                              timeout_s=30.0, fragments=fragments, sync_delay=sync_delay)
    ref = hvd.LocalSGD(torch.optim.SGD(twin.parameters(), lr=0.05), twin, period=period,
                       outer_optimizer=hvd.LocalSGD.diloco_outer, fragments=fragments,
                       sync_delay=sync_delay)
    assert opt.fragments == fragments
    assert [len(opt.fragment_parameters(f)) for f in range(fragments)] == \
        [len(ref.fragment_parameters(f)) for f in range(fragments)]
    commits = gyre.committed_steps()
    steps = 2 * period + sync_delay
    for step in range(steps):
        for o, m in ((opt, model), (ref, twin)):
            x, y = _batch(rank, step)
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        torch.testing.assert_close(_flat(model), _flat(twin), rtol=1e-5, atol=1e-6)
        assert opt.fragment_versions() == ref.fragment_rounds(), step
    # Each fragment round adopted is one commit (LocalSGD's rounds too); a
    # round still in flight (posted within the last sync_delay steps) may
    # have closed already.
    adopted = sum(opt.fragment_versions())
    assert adopted >= 2 * fragments - 1
    assert gyre.committed_steps() == commits + adopted + sum(ref.fragment_rounds())
    c = opt.counters()
    assert adopted <= c["rounds"] <= adopted + fragments
    assert (c["merged_late"], c["rejected"], c["rounds_late"]) == (0, 0, 0)
    # close() completes the rounds in flight: every rank holds one model,
    # whose fragment rounds merged everyone.
    opt.close()
    assert len(set(gyre.allgather_object(_digest(model)))) == 1
    c = opt.counters()
    assert c["rounds"] == sum(opt.fragment_versions())
    assert gyre.committed_steps() == commits + c["rounds"] + sum(ref.fragment_rounds())
    for f in range(fragments):
        assert opt.merged_rounds(f) == [opt.fragment_versions()[f]] * size


@pytest.mark.parametrize("max_staleness", [0, 10])
def test_streaming_straggler_does_not_hold_the_others(rank, size, multi_rank, max_staleness):
    """Two fragments, a sync delay of 1: the last rank sleeps 1 s inside its
    inner steps; each fragment's next round closes without it (the others
    are not held), its late contributions are merged (max_staleness 10) or
    rejected (0), counted; every contribution is accounted for exactly once
    in each fragment, and after close() every rank holds one model."""
    straggler = size - 1
    model = _net()
    opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                              late_after_s=0.2, max_staleness=max_staleness, timeout_s=60.0,
                              fragments=2, sync_delay=1)
    steps = 8
    for step in range(steps):
        _inner_step(opt, model, rank, step)
        if rank == straggler and step == 2:
            time.sleep(1.0)
        opt.step()
    opt.close()
    histories = gyre.broadcast_object([opt.round_history(f) for f in range(2)], 0)
    c = opt.counters()
    for f, history in enumerate(histories):
        # Some round of the fragment closed without the straggler.
        assert any(h["merged"] and straggler not in h["merged"] + h["late"] for h in history), history
        # Fragment f's rounds fall every 2 steps: steps / 2 contributions per
        # rank, each merged on time, merged late or rejected exactly once.
        for r in range(size):
            seen = sum(h["merged"].count(r) + h["late"].count(r) + h["rejected"].count(r)
                       for h in history)
            assert seen == steps // 2, (f, r, history)
    if max_staleness == 0:
        assert c["rejected_by_rank"][straggler] > 0 and c["merged_late_by_rank"][straggler] == 0
    else:
        assert c["merged_late_by_rank"][straggler] > 0 and c["rejected_by_rank"][straggler] == 0
    assert sum(c["rejected_by_rank"][:straggler]) == 0
    assert len(set(gyre.allgather_object(_digest(model)))) == 1


def test_streaming_refusals():
    model = _net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(gyre.InvalidArgumentError, match="fragments"):
        hvd.PartialLocalSGD(sgd, model, period=2, late_after_s=1.0, fragments=3)
    with pytest.raises(gyre.InvalidArgumentError, match="fragments"):
        hvd.PartialLocalSGD(sgd, model, period=8, late_after_s=1.0, fragments=7)  # 6 parameters
    with pytest.raises(gyre.InvalidArgumentError, match="sync_delay"):
        hvd.PartialLocalSGD(sgd, model, period=2, late_after_s=1.0, sync_delay=2)


@pytest.mark.parametrize("fragments,sync_delay", [(2, 0), (2, 1), (1, 1)])
def test_streaming_under_a_torch_state_restores_its_commit_and_reopens(rank, size, fragments,
                                                                       sync_delay):
    # A recovery without a death: restore() (the store dropped with the
    # rounds in flight, the parameters, steps and rounds back to the last
    # commit, taken inside a sync delay), then sync() (a new store holding
    # rank 0's parameters), then training on to one final model.
    model = _net()
    opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                              late_after_s=30.0, timeout_s=30.0, fragments=fragments,
                              sync_delay=sync_delay)
    state = hvd.elastic.TorchState(model, opt, step=0)
    committed = None
    for step in range(5):
        _inner_step(opt, model, rank, step)
        opt.step()
        state.step = step + 1
        if opt.completed_round:
            state.commit()
            committed = (state.step, opt.local_step, opt.version, _flat(model).clone())
    assert committed is not None and committed[2] > 0
    for step in range(5, 7):  # a round or two past the commit, undone below
        _inner_step(opt, model, rank, step)
        opt.step()
        state.step = step + 1
    assert opt.version > committed[2]
    # A failure breaks every rank's store at once, and the calls to it fail
    # at once; here each rank drops its own, whose shards the others (and
    # the aggregators, polling) would wait on until their timeout: the
    # aggregators stop and every rank finishes its steps first.
    for part in opt._parts:
        if part.aggregator is not None:
            part.aggregator.stop.set()
            part.aggregator.join()
    gyre.barrier()
    state.restore()
    assert (state.step, opt.local_step, opt.version) == committed[:3]
    assert torch.equal(_flat(model), committed[3])
    assert opt.fragment_versions() == [0] * fragments
    state.sync()
    assert opt.version == committed[2] and opt.fragment_versions() == [0] * fragments
    assert len(set(gyre.allgather_object(_digest(model)))) == 1  # rank 0's commit
    rounds = 0
    for step in range(state.step, state.step + 4):
        _inner_step(opt, model, rank, step)
        opt.step()
        rounds += opt.completed_round
        if opt.completed_round:
            state.commit()
    opt.close()
    assert len(set(gyre.allgather_object(_digest(model)))) == 1
    assert opt.version == committed[2] + sum(opt.fragment_versions())
    assert sum(opt.fragment_versions()) >= rounds >= 2
