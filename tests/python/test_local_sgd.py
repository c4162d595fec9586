"""gyre.torch.LocalSGD under mpirun -np 2 and -np 3: period 1 with plain
averaging equals synchronous gradient averaging for SGD; between rounds the
ranks' parameters differ and right after one they are identical; DiLoCo's
Nesterov outer step against a reference computed in one process from every
rank's local parameters; buffers averaged; the round counted as a commit.
Streaming: one fragment without delay is the unfragmented round bit for bit;
each fragment is identical on every rank right after its own round; staggered
rounds with a sync delay (both merge rules) against every rank's training
simulated in one process; 8-bit pseudo-gradients within half a quantisation
step of the exact average."""

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


# -- streaming DiLoCo: fragments and a sync delay -------------------------------

def _fragment_flat(opt, f):
    return torch.cat([p.detach().reshape(-1) for p in opt.fragment_parameters(f)])


def test_fragment_split_is_contiguous_and_balanced():
    from gyre.torch.local_sgd import _fragment_bounds
    assert _fragment_bounds([10, 10, 10, 10], 2) == [0, 2, 4]
    assert _fragment_bounds([100, 1, 1, 1], 2) == [0, 1, 4]
    assert _fragment_bounds([1, 1, 1, 100], 2) == [0, 3, 4]
    assert _fragment_bounds([5, 5, 5], 3) == [0, 1, 2, 3]
    assert _fragment_bounds([48, 8, 16, 2], 2) == [0, 1, 4]  # _net's parameters
    assert _fragment_bounds([1, 1, 1, 1, 1, 1], 3) == [0, 2, 4, 6]


def test_one_fragment_no_delay_is_the_unfragmented_round_bit_for_bit(rank, size):
    a, b = _net(), _net()
    opt = hvd.LocalSGD(torch.optim.SGD(a.parameters(), lr=0.05), a, period=3,
                       outer_optimizer=hvd.LocalSGD.diloco_outer, fragments=1, sync_delay=0)
    inner = torch.optim.SGD(b.parameters(), lr=0.05)
    synced = [torch.nn.Parameter(p.detach().clone()) for p in b.parameters()]
    outer = torch.optim.SGD(synced, lr=0.7, momentum=0.9, nesterov=True)
    for step in range(7):
        x, y = _batch(rank, step)
        for model, o in ((a, opt), (b, inner)):
            o.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            o.step()
        if (step + 1) % 3 == 0:  # the round as one grouped allreduce, by hand
            with torch.no_grad():
                avg = gyre.grouped_allreduce([s - p for s, p in zip(synced, b.parameters())],
                                             op=gyre.Average)
                for s, g in zip(synced, avg):
                    s.grad = g
                outer.step()
                for p, s in zip(b.parameters(), synced):
                    p.copy_(s)
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.equal(p, q), f"step {step}"
    assert opt.fragment_rounds() == [2] and opt.rounds == 2


def test_each_fragment_agrees_right_after_its_own_round(rank, size):
    model = _net()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=4,
                       outer_optimizer=hvd.LocalSGD.diloco_outer, fragments=2)
    assert [len(opt.fragment_parameters(f)) for f in range(2)] == [1, 3]
    offsets = {0: 2, 1: 0}  # fragment 0 at steps 2, 6; fragment 1 at 4, 8
    for step in range(1, 9):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        for f in range(2):
            if step % 4 == offsets[f]:
                assert _all_equal(_fragment_flat(opt, f)), f"fragment {f} after step {step}"
                assert opt.fragment_versions()[f] == gyre.committed_steps()
            elif size > 1:
                assert not _all_equal(_fragment_flat(opt, f)), f"fragment {f} after step {step}"
    assert opt.fragment_rounds() == [2, 2]
    v = opt.fragment_versions()
    assert v[1] == gyre.committed_steps() and v[0] == v[1] - 1
    # The outer optimizer's state is the same on every rank.
    assert len(opt.outer_optimizer.state) == 4
    for s in opt.outer_optimizer.state.values():
        assert _all_equal(s["momentum_buffer"].reshape(-1))


@pytest.mark.parametrize("mixing", [None, 0.5])
def test_staggered_delayed_rounds_match_a_single_process_reference(rank, size, mixing):
    period, delay, steps, lr = 4, 2, 13, 0.05
    model = _net()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=lr), model, period=period,
                       outer_optimizer=hvd.LocalSGD.diloco_outer, fragments=2, sync_delay=delay,
                       mixing=mixing)
    # Every rank's training simulated in this process.
    refs = [_net() for _ in range(size)]
    inners = [torch.optim.SGD(m.parameters(), lr=lr) for m in refs]
    synced = [torch.nn.Parameter(p.detach().clone()) for p in refs[0].parameters()]
    outer = torch.optim.SGD(synced, lr=0.7, momentum=0.9, nesterov=True)
    frags, offsets = [[0], [1, 2, 3]], [2, 0]
    in_flight = {}  # fragment -> (due, averaged pseudo-gradients, every rank's values at start)
    for step in range(1, steps + 1):
        for r in range(size):
            x, y = _batch(r, step)
            inners[r].zero_grad()
            torch.nn.functional.mse_loss(refs[r](x), y).backward()
            inners[r].step()
        with torch.no_grad():
            for f in sorted(in_flight):
                due, avg, at_start = in_flight[f]
                if due != step:
                    continue
                del in_flight[f]
                for i, g in zip(frags[f], avg):
                    synced[i].grad = g
                outer.step()
                for i in frags[f]:
                    synced[i].grad = None
                for r in range(size):
                    params = list(refs[r].parameters())
                    for k, i in enumerate(frags[f]):
                        if mixing is None:
                            params[i].copy_(synced[i] + (params[i] - at_start[r][k]))
                        else:
                            params[i].copy_(mixing * params[i] + (1 - mixing) * synced[i])
            for f in range(2):
                if step % period == offsets[f]:
                    every = [[list(m.parameters())[i].detach().clone() for i in frags[f]]
                             for m in refs]
                    avg = [torch.stack([synced[i] - every[r][k] for r in range(size)]).mean(0)
                           for k, i in enumerate(frags[f])]
                    in_flight[f] = (step + delay, avg, every)
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        for p, q in zip(model.parameters(), refs[rank].parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"step {step}: {m}")
    # Rounds of fragment 0 started at 2, 6, 10 (done at 4, 8, 12); of fragment 1
    # at 4, 8, 12 (done at 6, 10; the last one in flight).
    assert opt.fragment_rounds() == [3, 2]
    # With a round in flight, the state from before it; loading one waits
    # for none to be in flight.
    before = opt.state_dict()
    assert before["fragment_rounds"] == [3, 2]
    with pytest.raises(gyre.StateError, match="in flight"):
        opt.load_state_dict(before)
    opt.sync()  # completes it, then one round of each fragment
    assert opt.fragment_rounds() == [4, 4]
    assert _all_equal(_flat(model))


def test_int8_pseudo_gradients(rank, size):
    model = _net(bn=True)
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                       compression=hvd.LocalSGD.int8)
    synced = [p.detach().clone() for p in model.parameters()]
    for step in range(2):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 1:
            opt.optimizer.step()
            local = [hvd.allgather(p.detach().unsqueeze(0)) for p in model.parameters()]
            mean_before = hvd.allreduce(model[1].running_mean.detach().clone(), op=gyre.Average)
            opt.local_step += 1
            opt.sync()
        else:
            opt.step()
    assert _all_equal(_flat(model)) and _all_equal(model[1].running_mean)
    torch.testing.assert_close(model[1].running_mean, mean_before, rtol=1e-5, atol=1e-6)
    pseudo = torch.cat([(s.unsqueeze(0) - every).reshape(size, -1) for s, every in zip(synced, local)],
                       dim=1)
    bound = pseudo.abs().max().item() / 254 + 1e-7  # half a quantisation step at most
    exact = torch.cat([s.reshape(-1) for s in synced]) - pseudo.mean(dim=0)
    err = (_flat(model) - exact).abs().max().item()
    assert err <= bound, (err, bound)
    assert err > 0 or pseudo.abs().max() == 0  # it was quantised, not sent in float32


def test_streaming_refusals():
    model = _net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(gyre.InvalidArgumentError, match="fragments"):
        hvd.LocalSGD(sgd, model, period=2, fragments=3)
    with pytest.raises(gyre.InvalidArgumentError, match="fragments"):
        hvd.LocalSGD(sgd, model, period=8, fragments=5)  # 4 parameters
    with pytest.raises(gyre.InvalidArgumentError, match="sync_delay"):
        hvd.LocalSGD(sgd, model, period=4, sync_delay=4)
    with pytest.raises(gyre.InvalidArgumentError, match="mixing"):
        hvd.LocalSGD(sgd, model, period=4, mixing=1.5)


def test_under_a_torch_state_a_commit_inside_a_sync_delay(rank, size):
    """Streaming with a sync delay under a TorchState: each commit falls
    while the other fragment's round is in flight and holds the state from
    before it (that fragment's synchronised parameters and round count);
    restore() comes back to it (the round in flight dropped, as after a
    failure: here it has completed first, so that no allreduce is left in
    the runtime), and after sync() training goes on to one model."""
    model = _net()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), model, period=2,
                       outer_optimizer=hvd.LocalSGD.diloco_outer, fragments=2, sync_delay=1)
    state = hvd.elastic.TorchState(model, opt, step=0)
    held = None
    for step in range(3):  # fragment 0 starts at 1, merges at 2 (commit); 1 starts at 2
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        state.step = step + 1
        if opt.completed_round:
            assert any(f.handle is not None for f in opt._fragments)  # one in flight
            state.commit()
            held = (state.step, opt.fragment_rounds(), _flat(model).clone(),
                    [s.detach().clone() for s in opt._synced])
    assert held is not None and held[0] == 3 and opt.fragment_rounds() == [1, 1]
    for frag in opt._fragments:  # complete the allreduce in flight (a failure would drop it)
        if frag.handle is not None:
            gyre.synchronize(frag.handle)
    state.restore()
    assert all(f.handle is None for f in opt._fragments)
    assert (state.step, opt.fragment_rounds()) == held[:2]
    assert torch.equal(_flat(model), held[2])
    assert all(torch.equal(a, b) for a, b in zip(opt._synced, held[3]))
    state.sync()
    for step in range(3, 7):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if opt.completed_round:
            state.commit()
    opt.sync()
    assert _all_equal(_flat(model))


def test_under_a_torch_state_commits_restores_and_syncs(rank, size):
    """LocalSGD as a TorchState's optimizer (gyre.torch.elastic): the
    TorchState counts one commit per round (the round itself none), the
    fragment versions are those commits; restore() brings back the model,
    the synchronised parameters, the outer (DiLoCo) momentum and the counters
    of the last commit after local steps moved them on; sync() from a root
    makes every rank's LocalSGD state that root's; training goes on and the
    next round leaves identical parameters."""
    model = _net()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5), model,
                       period=2, outer_optimizer=hvd.LocalSGD.diloco_outer)
    state = hvd.elastic.TorchState(model, opt, step=0)
    assert opt._gyre_auto_commit is False

    def train(step):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = gyre.committed_steps()
        opt.step()
        assert gyre.committed_steps() == before  # the round does not count it
        state.step = step + 1
        if opt.completed_round:
            state.commit()
            assert gyre.committed_steps() == before + 1
            assert opt.fragment_versions() == [gyre.committed_steps()]
        return opt.completed_round

    rounds = [train(s) for s in range(4)]
    assert rounds == [False, True, False, True]
    held = _flat(model).clone()
    outer = opt.outer_optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    version = opt.fragment_versions()
    assert _all_equal(held) and _all_equal(outer.reshape(-1))
    train(4)  # a local step after the commit
    assert not torch.equal(_flat(model), held)
    state.restore()
    assert torch.equal(_flat(model), held)
    assert torch.equal(torch.cat([s.detach().reshape(-1) for s in opt._synced]), held)
    assert torch.equal(opt.outer_optimizer.state_dict()["state"][0]["momentum_buffer"], outer)
    assert (opt.local_step, opt.rounds, state.step, opt.fragment_versions()) == (4, 2, 4, version)
    # sync() from the last rank: its state everywhere (inner momentum too).
    root = size - 1
    state._sync_root = root
    state.sync()
    inner = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    root_inner = hvd.broadcast(inner, root_rank=root, name="test.lsgd.state.inner")
    assert torch.equal(inner, root_inner)
    assert all(s.grad is None for s in opt._synced)
    assert _all_equal(_flat(model))
    for s in range(4, 6):
        train(s)
    assert opt.rounds == 3 and _all_equal(_flat(model))
