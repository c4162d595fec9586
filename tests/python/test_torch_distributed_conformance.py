"""What torch's own backend suite (tests/conformance/torch) found the gyre
process group doing differently from gloo: each case here failed before
its fix. Values are closed forms of the rank (rank r fills with r + 1 + i)."""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group

import gyre.exceptions
import gyre.torch.distributed  # noqa: F401 (registers the backend)


def test_group_allreduce_without_options(world):
    """group.allreduce([t]) with no options, as DDP communication hooks call
    it: a sum (it raised AttributeError on the bare RedOpType)."""
    rank, size = world
    t = torch.full((5,), float(rank + 1))
    fut = _get_default_group().allreduce([t]).get_future()
    out = fut.wait()[0]
    assert torch.equal(out, torch.full((5,), float(size * (size + 1) // 2)))
    assert torch.equal(t, out)


@pytest.mark.parametrize("count", ["world", "world+1", "one"])
def test_all_gather_coalesced_layout(world, count):
    """output_lists[rank][i] receives that rank's inputs[i], with as many
    inputs as ranks too (which used to gather into the wrong tensors
    without an error) and inputs of different shapes."""
    rank, size = world
    n = {"world": size, "world+1": size + 1, "one": 1}[count]
    inputs = [torch.full((i + 1, 2), float(10 * rank + i)) for i in range(n)]
    outputs = [[torch.zeros(i + 1, 2) for i in range(n)] for _ in range(size)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(size):
        for i in range(n):
            assert torch.equal(outputs[r][i], torch.full((i + 1, 2), float(10 * r + i))), (r, i)


def test_all_gather_coalesced_with_empty(world):
    rank, size = world
    inputs = [torch.full((3,), float(rank)), torch.empty(0), torch.full((2, 2), float(-rank))]
    outputs = [[torch.zeros(3), torch.zeros(0), torch.zeros(2, 2)] for _ in range(size)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(size):
        assert torch.equal(outputs[r][0], torch.full((3,), float(r)))
        assert outputs[r][1].numel() == 0
        assert torch.equal(outputs[r][2], torch.full((2, 2), float(-r)))


def test_all_gather_coalesced_wrong_layout_is_refused_everywhere(world):
    """Output lists given per input (the transposed layout) with a count
    that cannot be read as torch's: refused on every rank."""
    rank, size = world
    inputs = [torch.ones(2)] * (size + 1)
    outputs = [[torch.zeros(2) for _ in range(size)] for _ in range(size + 1)]
    with pytest.raises(Exception, match="output lists"):
        dist.all_gather_coalesced(outputs, inputs)


def _sparse(rank, dense_dim=False):
    """Rank r: r + 1 nonzeros at rows r..2r, value r + 1 (rows overlap)."""
    rows = torch.arange(rank, 2 * rank + 1)
    idx = torch.stack([rows, rows % 3])
    vals = torch.full((rank + 1,) + ((2,) if dense_dim else ()), float(rank + 1))
    shape = (16, 3) + ((2,) if dense_dim else ())
    return torch.sparse_coo_tensor(idx, vals, shape)


@pytest.mark.parametrize("dense_dim", [False, True])
def test_sparse_all_reduce_sum(world, dense_dim):
    rank, size = world
    t = _sparse(rank, dense_dim)
    dist.all_reduce(t)
    want = sum(_sparse(r, dense_dim).to_dense() for r in range(size))
    assert t.layout == torch.sparse_coo
    assert torch.equal(t.to_dense(), want)


def test_sparse_all_reduce_max_refused_everywhere(world):
    rank, _ = world
    with pytest.raises(Exception, match="only ReduceOp.SUM"):
        dist.all_reduce(_sparse(rank), op=dist.ReduceOp.MAX)
    t = torch.ones(2)  # the group goes on
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(dist.get_world_size())))


# Timeouts: an operation some member never enqueues fails on every member
# that did, after the group's timeout (it used to wait GYRE_STALL_SHUTDOWN_S,
# 600 s by default). Each group here is used for one timed-out operation and
# destroyed: its members' sequences of names are out of step after it.

def _elapsed_call(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned for the caller to check
        return time.monotonic() - start, e
    return time.monotonic() - start, None


def test_new_group_timeout_fails_a_barrier_only_rank_0_enters(world):
    rank, _ = world
    g = dist.new_group(timeout=timedelta(seconds=1))
    if rank == 0:
        took, err = _elapsed_call(lambda: dist.barrier(g))
        assert isinstance(err, gyre.exceptions.TimeoutError), err
        assert " timeout " in str(err) and "never enqueued" in str(err)
        assert 0.9 <= took < 30, took
    dist.barrier()
    dist.destroy_process_group(g)


def test_subgroup_timeout_without_world_rank_0(world):
    """The set's own rank 0 (world rank 1 here) decides the timeout."""
    rank, size = world
    if size < 3:
        pytest.skip("needs 3 ranks: a subgroup without world rank 0 of 2 ranks")
    g = dist.new_group([1, 2], timeout=timedelta(seconds=1))
    if rank == 1:
        took, err = _elapsed_call(lambda: dist.all_reduce(torch.ones(1), group=g))
        assert isinstance(err, gyre.exceptions.TimeoutError), err
        assert "rank 1" in str(err) or "ranks [1]" in str(err) or "never enqueued" in str(err)
        assert 0.9 <= took < 30, took
    dist.barrier()
    if g is not None and rank in (1, 2):
        dist.destroy_process_group(g)


def test_group_monitored_barrier_timeout(world):
    rank, _ = world
    g = dist.new_group()
    if rank == 0:
        took, err = _elapsed_call(lambda: g.monitored_barrier(timedelta(seconds=0)))
        assert isinstance(err, RuntimeError) and "Rank 0 timed out in monitoredBarrier" in str(err)
        assert took < 30, took
    dist.barrier()
    dist.destroy_process_group(g)


def test_group_monitored_barrier_all_ranks_pass(world):
    g = dist.new_group(timeout=timedelta(seconds=2))
    for _ in range(3):
        g.monitored_barrier(timedelta(seconds=20))
    t = torch.ones(1)
    dist.all_reduce(t, group=g)  # the group goes on
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group(g)
