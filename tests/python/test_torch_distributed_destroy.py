"""destroy_process_group on the gyre backend releases gyre's process sets:
a subgroup's set is made by its members when torch creates the group on
them, and destroy_process_group(group) on the members removes it with the
last group on it (on the members alone; the other ranks never held it);
destroy_process_group() removes every set made for torch groups, and
init_process_group("gyre") works again afterwards. Runs under mpirun -np 2
and -np 3."""

import pytest
import torch
import torch.distributed as dist

import gyre
import gyre.torch.distributed  # noqa: F401 (registers the backend)
from gyre import _gyre


def _sets():
    return set(_gyre.process_set_ids()) - {0}


def test_destroying_a_subgroup_removes_its_set(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    before = _sets()
    ranks = [size - 1]  # a set of its own (the other tests use other rank lists)
    member = rank in ranks
    group = dist.new_group(ranks)
    added = _sets() - before
    assert len(added) == (1 if member else 0)  # the members alone hold it
    if member:
        t = torch.ones(2)
        dist.all_reduce(t, group=group)
        assert t.tolist() == [1.0, 1.0]
    dist.destroy_process_group(group)  # NON_GROUP_MEMBER on the others: nothing
    assert _sets() == before
    # A set still used by a group on one of its members is kept.
    g1 = dist.new_group(ranks)
    g2 = dist.new_group(ranks)
    kept = _sets() - before
    assert len(kept) == (1 if member else 0)  # one set for both groups
    dist.destroy_process_group(g1)
    assert _sets() - before == kept
    if member:
        t = torch.ones(1)
        dist.all_reduce(t, group=g2)
        assert t.item() == 1.0
    dist.destroy_process_group(g2)
    assert _sets() == before
    dist.barrier()


def test_destroy_everything_removes_every_set_and_init_works_again(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    dist.new_group([0])
    dist.new_group([size - 1, 0])
    if rank == 0:
        assert _sets()  # at least [0]'s (sets are their members' alone)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    assert _sets() == set()
    assert gyre.is_initialized()  # gyre itself runs on (gyre.torch may use it)
    dist.init_process_group("gyre")
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(size)] * 3
    g = dist.new_group([0])
    if rank == 0:
        t = torch.full((1,), 5.0)
        dist.all_reduce(t, group=g)
        assert t.item() == 5.0
