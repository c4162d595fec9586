"""gyre.torch.elastic in the ordinary build and job (no ULFM, or fault
tolerance off): Horovod's elastic API works, run() calls the function once
and says on rank 0 that a rank's failure ends the job and how to get ULFM.
The recovery itself is tested under Open MPI 5 with ULFM by
tests/elastic/ (scripts/elastic.sh)."""

import copy
import threading
import time

import pytest
import torch

import gyre
import gyre.torch as hvd
from gyre.torch.elastic import ElasticSampler, TorchState


def test_rank_failed_error_is_horovods_internal_error():
    assert issubclass(gyre.RankFailedError, gyre.HorovodInternalError)
    assert issubclass(gyre.RankFailedError, gyre.TransportError)
    assert issubclass(gyre.HostsUpdatedInterrupt, RuntimeError)
    assert gyre.HostsUpdatedInterrupt(skip_sync=True).skip_sync is True


def test_elastic_support_is_reported():
    assert isinstance(gyre.elastic_supported(), bool)
    assert isinstance(gyre.elastic_enabled(), bool)
    assert gyre.elastic_enabled() <= gyre.elastic_supported()


def test_rebuild_without_ulfm_says_how_to_get_it():
    if gyre.elastic_enabled():
        pytest.skip("fault tolerance is on: rebuild() would rebuild")
    with pytest.raises(gyre.StateError) as e:
        gyre.rebuild()
    assert "ulfm" in str(e.value).lower() and "docs/elastic.md" in str(e.value)
    # Nothing was stopped: gyre still runs.
    assert gyre.allreduce(torch.ones(1), op=gyre.Sum, name="after_rebuild").item() == gyre.size()


def test_run_without_ulfm_calls_once_and_says_so(capfd, rank):
    if gyre.elastic_enabled():
        pytest.skip("fault tolerance is on")
    model = torch.nn.Linear(3, 2)
    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=0)
    calls = []

    @hvd.elastic.run
    def train(state, x, scale=1):
        calls.append(x)
        return x * scale

    assert train(state, 21, scale=2) == 42
    assert calls == [21]
    err = capfd.readouterr().err
    if rank == 0:
        assert "a rank's failure will end the job" in err
        assert "ULFM" in err or "--with-ft ulfm" in err
    else:
        assert "will end the job" not in err


def test_state_commit_restore_and_committed_steps():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, opt, epoch=3, batch=5)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # creates momentum buffers
    before = gyre.committed_steps()
    state.epoch, state.batch = 4, 0
    state.commit()
    assert gyre.committed_steps() == before + 1
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    state.wait_for_commit()  # before changing parameters other than by opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt.step()
    state.epoch, state.batch = 9, 9
    state.restore()
    assert (state.epoch, state.batch) == (4, 0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k])
    for p, m in zip(model.parameters(), momentum):
        assert torch.equal(opt.state[p]["momentum_buffer"], m)


def test_commit_reuses_its_buffers_and_restore_can_repeat():
    # commit() copies into the previous commit's tensors (no allocation per
    # step), and the commit survives a restore followed by a step: a second
    # failure before the next commit restores the same state again.
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train_step():
        model(torch.randn(5, 3)).sum().backward()
        opt.step()

    train_step()
    state = TorchState(model, opt)
    state.commit()
    ptrs = [v.data_ptr() for v in state._model_saved.values()]
    mptrs = [s["momentum_buffer"].data_ptr() for s in state._optimizer_saved["state"].values()]
    train_step()
    state.commit()
    assert [v.data_ptr() for v in state._model_saved.values()] == ptrs
    assert [s["momentum_buffer"].data_ptr()
            for s in state._optimizer_saved["state"].values()] == mptrs
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    for _ in range(2):  # fail, restore, step; fail again before a commit, restore
        train_step()
        state.restore()
        for k, v in model.state_dict().items():
            assert torch.equal(v, saved[k]), k
        for p, m in zip(model.parameters(), momentum):
            assert torch.equal(opt.state[p]["momentum_buffer"], m)
    # After the restores, a commit holds the new values again.
    train_step()
    state.commit()
    state.wait_for_commit()  # the parameters are copied in the background
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state._model_saved.items())


def _wait_until(pred, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_step_waits_for_the_background_copy_of_the_commit():
    # commit() returns before its copy is done; optimizer.step() right after
    # it must wait for the copy, so that the commit holds the values at
    # commit() bit for bit, and a restore (as after a failure) returns to
    # them, also when it comes while the copy is still under way.
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)

    def train_step():
        model(torch.randn(8, 16)).sum().backward()
        opt.step()

    train_step()
    state = TorchState(model, opt)
    train_step()
    release = threading.Event()
    state._copy_gate = release.wait  # the copy starts only when released
    state.commit()
    assert state._copy is not None  # the copy is pending
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())
    # Released only once the step is blocked in its wait for the copy: a
    # step that did not wait would change the parameters before the copy.
    releaser = threading.Thread(
        target=lambda: (_wait_until(lambda: state._copy_waiting, "the step's wait"),
                        release.set()))
    releaser.start()
    train_step()
    releaser.join()
    assert not all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    state.restore()
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    got = opt.state_dict()
    for i, st in saved_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(got["state"][i][k], v), (i, k)
    # A restore while the copy is still under way (a failure during the
    # next step's communication) waits for it and returns to the commit too.
    train_step()
    release.clear()
    state.commit()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    releaser = threading.Thread(
        target=lambda: (_wait_until(lambda: state._copy_waiting, "restore's wait"),
                        release.set()))
    releaser.start()
    with torch.no_grad():
        model[1].running_mean.add_(5.0)  # the forward pass changes buffers: copied at commit()
    state.restore()
    releaser.join()
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k


def test_change_in_place_during_the_commit_copy_is_refused():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    state = TorchState(model, opt)
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)  # without state.wait_for_commit() first
    with pytest.raises(gyre.StateError, match=r"\['weight'\].*changed in place"):
        opt.step()
    with pytest.raises(gyre.StateError, match="not exact"):
        state.restore()
    # The next commit is exact again.
    state.commit()
    saved = model.weight.detach().clone()
    opt.step()
    state.restore()
    assert torch.equal(model.weight, saved)


def test_sync_takes_rank_zeros_state(rank, size):
    torch.manual_seed(100 + rank)  # a different model on every rank
    model = torch.nn.Linear(4, 3)
    state = TorchState(model, None, epoch=rank, note=f"from {rank}")
    state.sync()
    assert (state.epoch, state.note) == (0, "from 0")
    for name, p in model.state_dict().items():
        first = gyre.broadcast(p.clone(), root_rank=0, name=f"sync_check.{name}")
        assert torch.equal(first, p)
    # sync() also commits the synchronised state: restore() returns to it.
    state.epoch = 7
    state.restore()
    assert state.epoch == 0


def test_elastic_sampler_sees_each_sample_once_across_a_resize():
    n, bs = 50, 3
    three = [ElasticSampler(range(n), seed=1, num_replicas=3, rank=r) for r in range(3)]
    assert len({i for s in three for i in s.indices}) == n  # a partition (with padding)
    seen = []
    for b in range(4):
        for s in three:
            seen += s.get_indices(b, bs)
        for s in three:
            s.record_batch(b, bs)
    assert all(s.state_dict() == three[0].state_dict() for s in three)
    two = [ElasticSampler(range(n), seed=1, num_replicas=2, rank=r) for r in range(2)]
    for s in two:
        s.load_state_dict(three[0].state_dict())
    rest = [i for s in two for i in s.indices]
    assert set(rest).isdisjoint(seen)
    assert set(rest) | set(seen) == set(range(n))
    assert len(seen) == len(set(seen)) == 4 * 3 * bs
    # A new epoch starts over, in another order.
    two[0].set_epoch(1)
    assert len(two[0]) == n // 2 and two[0].processed_indices == set()


def test_elastic_sampler_defaults_to_gyres_world(rank, size):
    s = ElasticSampler(range(10 * size), shuffle=False)
    assert (s.num_replicas, s.rank, len(s)) == (size, rank, 10)
    assert list(s) == list(range(rank, 10 * size, size))


def test_a_launched_rank_is_not_a_replacement():
    # Only ranks started by a rebuild with GYRE_ELASTIC_RESPAWN=1 are
    # (tests/elastic/elastic_respawn.py checks that side).
    assert gyre.is_replacement() is False
    with pytest.raises(gyre.StateError, match="not started by a rebuild"):
        gyre.replacement_info()


def test_commit_then_model_load_state_dict_is_exact():
    # Horovod's scripts load weights into the model right after a commit; the
    # load waits for the commit's background copy (a pre-hook), so the commit
    # stays exact and restore() returns to it.
    model = torch.nn.Linear(2, 2)
    other = {k: torch.full_like(v, 7.0) for k, v in model.state_dict().items()}
    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(other)
    state.commit()  # raised "the commit is not exact" before
    model.load_state_dict(committed)
    state.restore()
    for k, v in model.state_dict().items():
        assert torch.equal(v, other[k])


def test_elastic_sampler_counts_processed_samples_as_horovod(rank, size):
    bs, per_rank = 2, 8
    s = ElasticSampler(list(range(per_rank * size)), shuffle=True)
    state = TorchState(sampler=s)
    assert s.processed_num == 0 and len(s) == per_rank
    for b in range(per_rank // bs):
        s.record_batch(b, bs)
        assert s.processed_num == bs * (b + 1)
    # No reset: len() and the samples stay those of the epoch's partition.
    assert len(s) == per_rank and len(list(s)) == per_rank
    s.set_epoch(1)
    assert s.processed_num == 0
    s.record_batch(0, bs)
    state.commit()
    s.record_batch(1, bs)
    state.restore()
    assert s.processed_num == bs
    # The partition is kept by restore(): batch 1 is the next one, not a new batch 0.
    s.record_batch(1, bs)
    assert s.processed_num == 2 * bs
    state.commit()
    state.sync()
    # Every rank's progress is counted, the rest is partitioned anew.
    assert s.processed_num == 2 * bs * size
    assert len(s) == per_rank - 2 * bs
    assert not set(s.indices) & s.processed_indices
