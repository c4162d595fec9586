"""torch.distributed subgroups on the gyre backend: dist.new_group(ranks) and
new_subgroups run on gyre process sets. Collectives on a subgroup against
values computed locally (roots given as world ranks, as torch takes them),
a rank outside the group, and DDP with process_group=subgroup matching
the average over the subgroup. Runs under mpirun -np 2 and -np 3."""

import pytest
import torch
import torch.distributed as dist

import gyre
import gyre.torch.distributed  # noqa: F401 (registers the backend)


def _sub(size):
    return [r for r in range(size) if r != 1]  # {0} with 2 ranks, {0, 2} with 3


def test_new_group_of_a_subset(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    ranks = _sub(size)
    group = dist.new_group(ranks)
    if rank not in ranks:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
    else:
        assert dist.get_world_size(group) == len(ranks)
        assert dist.get_rank(group) == ranks.index(rank)
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=group)
        assert t.tolist() == [float(sum(r + 1 for r in ranks))] * 5
        # broadcast: src is a world rank; torch passes the group rank down.
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=ranks[-1], group=group)
        assert b.tolist() == [float(ranks[-1])] * 3
        out = [torch.empty(2) for _ in ranks]
        dist.all_gather(out, torch.full((2,), float(rank)), group=group)
        assert [o[0].item() for o in out] == [float(r) for r in ranks]
        work = dist.all_reduce(torch.ones(1), group=group, async_op=True)
        work.wait()
        dist.barrier(group=group)
    # The default group goes on beside the subgroup.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == size
    if rank in ranks:
        dist.destroy_process_group(group)  # later tests count the sets held


def test_disjoint_subgroups_from_new_subgroups(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    mine, groups = dist.new_subgroups(group_size=1)
    assert len(groups) == size
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=mine)
    assert t.tolist() == [float(rank)] * 2
    for g in groups:
        dist.destroy_process_group(g)


def test_ddp_on_a_subgroup_averages_over_it(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    ranks = _sub(size)
    group = dist.new_group(ranks)
    if rank not in ranks:
        return
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    x = torch.full((2, 4), float(rank + 1))
    ddp(x).sum().backward()
    # d(sum(w.x))/dw = sum of rows of x: 2 * (rank + 1) per entry, averaged.
    expected = sum(2.0 * (r + 1) for r in ranks) / len(ranks)
    assert torch.allclose(model.weight.grad, torch.full((1, 4), expected))
    del ddp
    dist.destroy_process_group(group)


def test_subgroups_of_a_subgroup_made_on_its_members_only(world):
    """torch's new_subgroups(group=parent) calls new_group on the parent's
    members only (torch's own test_new_subgroups_with_group_param at 4
    ranks): the gyre sets are made by their members alone."""
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    ranks = _sub(size)
    parent = dist.new_group(ranks)
    if rank in ranks:
        mine, groups = dist.new_subgroups(group_size=1, group=parent)
        assert len(groups) == len(ranks) and mine.size() == 1
        t = torch.full((2,), float(rank))
        dist.all_reduce(t, group=mine)
        assert t.tolist() == [float(rank)] * 2
        # And a pair made by its members alone (use_local_synchronization).
        if len(ranks) > 1:
            pair = dist.new_group(ranks, use_local_synchronization=True)
            t = torch.ones(1)
            dist.all_reduce(t, group=pair)
            assert t.item() == len(ranks)
            dist.destroy_process_group(pair)
        for g in groups:
            dist.destroy_process_group(g)
        dist.destroy_process_group(parent)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == size
