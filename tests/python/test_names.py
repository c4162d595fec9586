"""Generated names ("allgather.noname.N") advance alike on every rank whatever
happens to a call: a call refused on one rank only (its refusal reaches the
other ranks' matching call) still consumes its name there, so the next
unnamed calls pair with each other and not with the refused one."""

import pytest
import torch

import gyre


def expected(size, base):
    return [float(base + r) for r in range(size)]


def test_allgather_names_after_a_refusal_on_one_rank(size, rank, multi_rank):
    # A 0-d tensor cannot be gathered: refused on rank 1 alone.
    mine = torch.tensor(1.0) if rank == 1 else torch.ones(1)
    with pytest.raises(gyre.InvalidArgumentError, match="dimension"):
        gyre.allgather(mine)
    first = gyre.allgather_async(torch.full((1,), 10.0 + rank))
    second = gyre.allgather_async(torch.full((1,), 100.0 + rank))
    assert gyre.synchronize(first).tolist() == expected(size, 10)
    assert gyre.synchronize(second).tolist() == expected(size, 100)


def test_alltoall_names_after_a_refusal_on_one_rank(size, rank, multi_rank):
    # size + 1 rows do not split evenly: refused on rank 1 alone.
    rows = size + 1 if rank == 1 else size
    with pytest.raises(gyre.InvalidArgumentError, match="split"):
        gyre.alltoall(torch.zeros(rows))
    first = gyre.alltoall_async(torch.full((size,), 10.0 + rank))
    second = gyre.alltoall_async(torch.full((size,), 100.0 + rank))
    # As Horovod: synchronize() of an alltoall gives (output, received_splits).
    assert gyre.synchronize(first)[0].tolist() == expected(size, 10)
    assert gyre.synchronize(second)[0].tolist() == expected(size, 100)


def test_reducescatter_names_after_a_refusal_on_one_rank(size, rank, multi_rank):
    # A 0-d tensor has no first dimension to scatter: refused on rank 1 alone.
    mine = torch.tensor(1.0) if rank == 1 else torch.ones(size)
    with pytest.raises(gyre.InvalidArgumentError, match="dimension"):
        gyre.reducescatter(mine, op=gyre.Sum)
    first = gyre.reducescatter_async(torch.full((size,), 10.0 + rank), op=gyre.Sum)
    second = gyre.reducescatter_async(torch.full((size,), 100.0 + rank), op=gyre.Sum)
    assert gyre.synchronize(first).tolist() == [sum(expected(size, 10))]
    assert gyre.synchronize(second).tolist() == [sum(expected(size, 100))]


def test_generated_names_of_refused_calls_are_consumed(size):
    """A call refused on every rank alike consumes its name on every rank:
    the counter moves whether or not the call is accepted."""
    before = gyre.ops._name_counters.get("allgather", 0)
    with pytest.raises(gyre.InvalidArgumentError):
        gyre.allgather(torch.tensor(1.0))
    assert gyre.ops._name_counters.get("allgather", 0) == before + 1
    assert gyre.allgather(torch.full((1,), 7.0)).tolist() == [7.0] * size


def test_unnamed_calls_in_turn_are_cache_hits(size, rank):
    """Generated names never repeat; the response cache takes each as the
    next call of its kind ("allreduce.noname.N"), so a call repeating an
    earlier signature travels as one bit (docs/architecture.md, "Response
    cache"), and the results are those of full requests."""
    a, b = torch.full((3,), 1.0 + rank), torch.full((5,), 2.0 + rank, dtype=torch.float64)
    gyre.allreduce(a, op=gyre.Sum)  # each signature once, in full
    gyre.allreduce(b, op=gyre.Sum)
    before = gyre.runtime_stats()
    for i in range(10):
        x = a if i % 2 == 0 else b
        got = gyre.allreduce(x, op=gyre.Sum)
        assert torch.equal(got, x * 0 + sum(x[0].item() - rank + r for r in range(size)))
    after = gyre.runtime_stats()
    assert after["cache_hits_sent"] - before["cache_hits_sent"] == 10
    assert after["requests_sent"] == before["requests_sent"]
