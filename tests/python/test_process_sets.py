"""Horovod's process sets on `import gyre.torch as hvd`: registration (init,
add, remove) and ProcessSet's answers, every collective and helper with
process_set= against values computed locally, ranks outside a set refused
with a ValueError, a set not held up by another, and DistributedOptimizer
averaging within its set only. Runs under mpirun -np 2 and -np 3."""

import pytest
import torch

import gyre
import gyre.torch as hvd


def _sub(size):
    """Every rank but rank 1 ({0} with 2 ranks, {0, 2} with 3)."""
    return [r for r in range(size) if r != 1]


@pytest.fixture
def halves(size, multi_rank):
    """Two disjoint sets, registered on every rank, removed afterwards."""
    lower = hvd.add_process_set(list(range(size // 2)))
    upper = hvd.add_process_set(hvd.ProcessSet(list(range(size // 2, size))))
    yield lower, upper
    assert hvd.remove_process_set(upper) is True
    assert hvd.remove_process_set(lower) is True


def test_registration_and_answers(size, rank, halves):
    lower, upper = halves
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(size))
    assert hvd.global_process_set.size() == size and hvd.global_process_set.rank() == rank
    assert {lower.process_set_id, upper.process_set_id}.isdisjoint({0, None})
    mine, other = (lower, upper) if rank < size // 2 else (upper, lower)
    assert mine.included() is True and other.included() is False
    assert mine.rank() == mine.ranks.index(rank) and other.rank() == -1
    assert mine.size() == len(mine.ranks) and other.size() == len(other.ranks)
    assert f"process_set_id={lower.process_set_id}" in str(lower)
    # A registered set cannot be added again; the global set is not removed.
    with pytest.raises(ValueError, match="already"):
        hvd.add_process_set(list(lower.ranks))
    assert hvd.remove_process_set(hvd.global_process_set) is False


def test_removed_set_is_invalidated_and_can_be_added_again(size, rank, multi_rank):
    ps = hvd.add_process_set(_sub(size))
    copy = hvd.ProcessSet(_sub(size))
    assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None and ps.size() is None and ps.included() is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=ps)
    again = hvd.add_process_set(copy)
    assert again is copy and again.process_set_id is not None
    if again.included():
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=again).tolist() == \
            [len(again.ranks)] * 2
    hvd.remove_process_set(again)


def test_init_takes_process_sets_and_dynamic(size, rank, multi_rank):
    ps = hvd.ProcessSet(_sub(size))
    hvd.init(process_sets=[ps])  # gyre runs already: registers the sets
    assert ps.process_set_id not in (None, 0)
    hvd.init(process_sets="dynamic")
    hvd.init(process_sets=[hvd.ProcessSet(list(range(size)))])  # the global set: nothing new
    if ps.included():
        hvd.barrier(process_set=ps)
    hvd.remove_process_set(ps)


def test_ranks_that_disagree_fail_everywhere(size, rank, multi_rank):
    with pytest.raises(ValueError, match="same call"):
        hvd.add_process_set([0] if rank == 0 else [1])
    with pytest.raises(TypeError):
        hvd.allreduce(torch.ones(1), process_set="everyone")


def test_collectives_on_a_subset(size, rank, multi_rank):
    ranks = _sub(size)
    ps = hvd.add_process_set(ranks)
    k = len(ranks)
    if not ps.included():
        t = torch.ones(2)
        for call in [lambda: hvd.allreduce(t, process_set=ps),
                     lambda: hvd.allgather(t, process_set=ps),
                     lambda: hvd.broadcast(t, 0, process_set=ps),
                     lambda: hvd.alltoall(t, process_set=ps),
                     lambda: hvd.reducescatter(t, process_set=ps),
                     lambda: hvd.grouped_allreduce([t], process_set=ps),
                     lambda: hvd.barrier(process_set=ps),
                     lambda: hvd.join(process_set=ps),
                     lambda: hvd.broadcast_object(1, 0, process_set=ps),
                     lambda: hvd.allgather_object(1, process_set=ps)]:
            with pytest.raises(ValueError, match="not in process set"):
                call()
    else:
        me = ps.rank()
        x = torch.full((3,), float(rank))
        assert hvd.allreduce(x, op=hvd.Sum, process_set=ps).tolist() == [float(sum(ranks))] * 3
        assert torch.allclose(hvd.allreduce(x, process_set=ps),
                              torch.full((3,), sum(ranks) / k))
        g = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, process_set=ps)
        assert g[1].tolist() == [2.0 * sum(ranks)] * 3
        # allgather orders rows by rank in the set; ranks differ in rows.
        rows = hvd.allgather(torch.full((me + 1, 2), float(rank)), process_set=ps)
        assert rows[:, 0].tolist() == [float(r) for i, r in enumerate(ranks) for _ in range(i + 1)]
        # broadcast: the root is a world rank.
        root = ranks[-1]
        assert hvd.broadcast(torch.full((4,), float(rank)), root, process_set=ps).tolist() == \
            [float(root)] * 4
        out, received = hvd.alltoall(torch.arange(k, dtype=torch.float32) + 10 * me,
                                     splits=[1] * k, process_set=ps)
        assert out.tolist() == [float(10 * i + me) for i in range(k)]
        assert received.tolist() == [1] * k
        block = hvd.reducescatter(torch.ones(k, 2), op=hvd.Sum, process_set=ps)
        assert block.tolist() == [[float(k)] * 2]
        hvd.barrier(process_set=ps)
        assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == \
            {"from": root}
        assert hvd.allgather_object(rank, process_set=ps) == ranks
        assert hvd.join(process_set=ps) in ranks
    # Unnamed operations count names per set: a global one still pairs.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
    hvd.remove_process_set(ps)


def test_a_set_waiting_does_not_hold_up_another(size, rank):
    if size < 3:
        pytest.skip("needs 3 ranks")
    a = hvd.add_process_set([0, 1])
    b = hvd.add_process_set([0, 2])
    if rank == 0:
        ha = hvd.allreduce_async(torch.ones(2), name="w", op=hvd.Sum, process_set=a)
        assert hvd.allreduce(torch.ones(2), name="w", op=hvd.Sum, process_set=b).tolist() == [2, 2]
        assert not hvd.poll(ha)  # rank 1 enqueues only after the barrier
        hvd.barrier()
        assert hvd.synchronize(ha).tolist() == [2, 2]
    elif rank == 1:
        hvd.barrier()
        assert hvd.allreduce(torch.ones(2), name="w", op=hvd.Sum, process_set=a).tolist() == [2, 2]
    elif rank == 2:
        assert hvd.allreduce(torch.ones(2), name="w", op=hvd.Sum, process_set=b).tolist() == [2, 2]
        hvd.barrier()
    else:
        hvd.barrier()
    hvd.remove_process_set(b)
    hvd.remove_process_set(a)


def test_parameters_optimizer_state_and_distributed_optimizer(size, rank, halves):
    lower, upper = halves
    mine = lower if lower.included() else upper
    root = mine.ranks[0]
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
    torch.manual_seed(root)
    reference = torch.nn.Linear(3, 2)
    assert torch.equal(model.weight, reference.weight)
    # Each rank's gradient is its rank: the set averages its own ranks only.
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    process_set=mine)
    # Made by backward() itself: the optimizer's hooks start each reduction
    # as its gradient is ready, so a gradient written after backward() (as
    # this test once did with fill_) races with the reduction reading it.
    (model.weight.sum() * float(rank) + model.bias.sum() * float(rank)).backward()
    dopt.synchronize()
    expected = sum(mine.ranks) / len(mine.ranks)
    assert torch.allclose(model.bias.grad, torch.full((2,), expected))
    with dopt.skip_synchronize():
        dopt.step()
    hvd.broadcast_optimizer_state(dopt, root_rank=root, process_set=mine)
    buf = dopt.state[model.bias]["momentum_buffer"]
    assert torch.allclose(buf, torch.full((2,), expected))


def test_gradients_on_a_subset(size, rank, multi_rank):
    ranks = _sub(size)
    ps = hvd.add_process_set(ranks)
    if ps.included():
        k, me = len(ranks), ps.rank()
        x = torch.full((2,), float(rank + 1), requires_grad=True)
        hvd.allreduce(x, op=hvd.Sum, process_set=ps).sum().backward()
        assert x.grad.tolist() == [float(k)] * 2  # the gradients' sum over the set
        z = torch.ones(me + 1, 1, requires_grad=True)
        g = hvd.allgather(z, process_set=ps)
        (g * torch.arange(float(g.shape[0])).reshape(-1, 1)).sum().backward()
        offset = sum(i + 1 for i in range(me))  # the rows of the set's earlier ranks
        assert z.grad.flatten().tolist() == [float(offset + i) for i in range(me + 1)]
        y = torch.full((3,), float(rank), requires_grad=True)
        hvd.broadcast(y, ranks[0], process_set=ps).sum().backward()
        assert y.grad.tolist() == ([1.0] * 3 if rank == ranks[0] else [0.0] * 3)
    hvd.remove_process_set(ps)


def test_training_on_a_subset_commits_nothing_to_the_job(size, rank, multi_rank):
    """The version vector is the job's: DistributedOptimizer and LocalSGD steps
    on a set that leaves rank 1 out are not commits, so the job's collectives
    afterwards (and the set's removal, an allgather of every rank) are not
    taken for a divergence of the set's members from rank 1."""
    ps = hvd.add_process_set(_sub(size))
    before = gyre.committed_steps()
    if ps.included():
        model = torch.nn.Linear(3, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       process_set=ps)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
        local = gyre.torch.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                    period=1, process_set=ps)
        for _ in range(2):
            local.zero_grad()
            model(torch.ones(1, 3)).sum().backward()
            local.step()
        assert local.rounds == 2 and local.fragment_versions() == [2]
    assert gyre.committed_steps() == before
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.subset.training")
    assert total.tolist() == [float(size)] * 2
    assert hvd.remove_process_set(ps) is True


def test_removing_a_set_drops_its_name_counters(size, rank, multi_rank):
    from gyre.handles import _name_counters

    def counted(sid):
        return sorted(k[0] for k in list(_name_counters) if isinstance(k, tuple) and k[1] == sid)

    ps = hvd.add_process_set(_sub(size))
    sid = ps.process_set_id
    if ps.included():
        # Unnamed operations count generated names per set.
        hvd.allreduce(torch.ones(1), process_set=ps)
        assert hvd.broadcast_object(rank, root_rank=ps.ranks[0], process_set=ps) == ps.ranks[0]
        assert "allreduce" in counted(sid) and "broadcast_object" in counted(sid)
    hvd.allreduce(torch.ones(1))  # the global set's counters are not the set's
    hvd.remove_process_set(ps)
    assert counted(sid) == []
    assert "allreduce" in _name_counters


def test_sets_made_by_their_members_alone(size, rank, multi_rank):
    """add_process_set(members_only=True): ranks outside never call it; the
    members agree on one id, and a set of the job added afterwards still has
    the same id on every rank (the larger of the ranks' next ids)."""
    mine = [r for r in range(size) if r % 2 == rank % 2]
    if len(mine) == size:
        pytest.skip("needs ranks of both parities")
    ps = hvd.add_process_set(mine, members_only=True, timeout=30)
    ids = hvd.allgather_object(ps.process_set_id)
    assert ids[rank] == ps.process_set_id
    assert len({ids[r] for r in mine}) == 1
    assert ps.rank() == mine.index(rank) and ps.size() == len(mine)
    out = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Sum, process_set=ps)
    assert out.tolist() == [float(sum(mine))] * 3
    job_set = hvd.add_process_set([0])
    assert len(set(hvd.allgather_object(job_set.process_set_id))) == 1
    assert job_set.process_set_id > max(ids)
    assert hvd.remove_process_set(job_set) is True
    assert hvd.remove_process_set(ps) is True  # its members alone
    assert ps.process_set_id is None


def test_a_member_that_never_makes_the_set_fails_the_others(size, rank):
    """Of the members [0, 1], rank 1 never calls: rank 0 gets TimeoutError
    naming it after the timeout (no wait in MPI_Comm_create_group), and the
    job goes on."""
    if size < 3:
        pytest.skip("needs 3 ranks (a set of 2 of them)")
    if rank == 0:
        with pytest.raises(TimeoutError, match=r"rank\(s\) 1 did not make it within 1.5 s"):
            hvd.add_process_set([0, 1], members_only=True, timeout=1.5)
    hvd.barrier()
    # Made again by both members: the failed attempt leaves nothing behind.
    if rank in (0, 1):
        ps = hvd.add_process_set([0, 1], members_only=True, timeout=30)
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item() == 2
        hvd.remove_process_set(ps)
    hvd.barrier()


def test_members_asking_for_other_ranks_all_fail(size, rank):
    """Three members, one asking for another set with the same lowest rank:
    InvalidArgumentError on all three, naming what that rank asked for
    (np 4: the set may not be every rank)."""
    if size < 4:
        pytest.skip("needs 4 ranks")
    if rank <= 2:
        asked = [0, 1] if rank == 1 else [0, 1, 2]
        with pytest.raises(ValueError, match=r"rank.* 1 asked for"):
            hvd.add_process_set(asked, members_only=True, timeout=30)
    hvd.barrier()
