"""A call refused on one rank fails on every rank at once: the rank with the
bad argument raises InvalidArgumentError at the call, and the other ranks,
which passed a valid tensor of the same name, raise it from synchronize()
within a negotiation round, not after the stall timeout (600 s by default).
Every case uses an explicit name of its own, so that no case depends on the
generated names of another."""

import time

import numpy as np
import pytest
import torch

import gyre

# The bound: every rank raises within a second of its call.
BOUND_S = 1.0


def _valid(size):
    return torch.ones(2 * size)


# name -> (the bad rank's call, the valid ranks' call, text every rank's error contains)
CASES = {
    "refused.dtype": (
        lambda n, s: gyre.allreduce(torch.ones(2 * s, dtype=torch.complex64), name=n),
        lambda n, s: gyre.allreduce(_valid(s), name=n),
        "unsupported dtype complex64"),
    "refused.dtype_in_place": (
        lambda n, s: gyre.allreduce_(np.ones(2 * s, dtype=np.uint32), name=n),
        lambda n, s: gyre.allreduce_(_valid(s), name=n),
        "unsupported dtype uint32"),
    "refused.not_contiguous": (
        lambda n, s: gyre.allgather(torch.ones(3, 2 * s).t(), name=n),
        lambda n, s: gyre.allgather(torch.ones(2 * s, 3), name=n),
        "not contiguous"),
    "refused.not_contiguous_allreduce_": (
        lambda n, s: gyre.allreduce_(torch.ones(3, 2 * s).t(), name=n),
        lambda n, s: gyre.allreduce_(torch.ones(2 * s, 3), name=n),
        "not contiguous"),
    "refused.negative_view": (
        lambda n, s: gyre.allreduce(torch._neg_view(torch.ones(2 * s)), name=n),
        lambda n, s: gyre.allreduce(_valid(s), name=n),
        "negative view"),
    "refused.not_a_tensor": (
        lambda n, s: gyre.allgather([1.0, 2.0], name=n),
        lambda n, s: gyre.allgather(_valid(s), name=n),
        "expected a tensor"),
    "refused.average_of_bools": (
        lambda n, s: gyre.allreduce(torch.ones(2 * s, dtype=torch.bool), name=n),
        lambda n, s: gyre.allreduce(torch.ones(2 * s, dtype=torch.bool), name=n, op=gyre.Sum),
        "not defined for bool"),
    "refused.unknown_op": (
        lambda n, s: gyre.allreduce(_valid(s), name=n, op=17),
        lambda n, s: gyre.allreduce(_valid(s), name=n),
        "unknown reduction op 17"),
    "refused.scale": (
        lambda n, s: gyre.reducescatter(_valid(s), name=n, prescale_factor="half"),
        lambda n, s: gyre.reducescatter(_valid(s), name=n),
        "prescale_factor must be a number"),
    "refused.root": (
        lambda n, s: gyre.broadcast_(_valid(s), root_rank=s, name=n),
        lambda n, s: gyre.broadcast_(_valid(s), root_rank=0, name=n),
        "is not a rank of this job"),
    "refused.splits": (
        lambda n, s: gyre.alltoall(_valid(s), splits=[2 * s] + [1] * (s - 1), name=n),
        lambda n, s: gyre.alltoall(_valid(s), splits=[2] * s, name=n),
        "add up to"),
    "refused.group_member": (
        lambda n, s: gyre.grouped_allreduce([_valid(s), torch.ones(2, dtype=torch.complex64)],
                                            name=n),
        lambda n, s: gyre.grouped_allreduce([_valid(s), _valid(s)], name=n),
        "unsupported dtype complex64"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_refusal_on_one_rank_raises_on_every_rank(name, size, rank, multi_rank):
    bad_call, valid_call, reason = CASES[name]
    bad_rank = size - 1  # rank 0 reports: it must be among the waiting ranks
    gyre.barrier()  # the ranks start together: each one's time is its own wait
    start = time.monotonic()
    with pytest.raises(gyre.InvalidArgumentError, match=reason) as raised:
        if rank == bad_rank:
            bad_call(name, size)
        else:
            valid_call(name, size)
    elapsed = time.monotonic() - start
    if rank != bad_rank:
        assert f"failed on rank {bad_rank}" in str(raised.value)
    assert elapsed < BOUND_S, f"rank {rank} raised after {elapsed:.2f} s: {raised.value}"
    # Nothing is left pending: the ranks go on together.
    assert gyre.allreduce(torch.ones(2), op=gyre.Sum, name=f"{name}.after").tolist() == [size] * 2


def test_refusal_under_a_generated_name(size, rank, multi_rank):
    """Unnamed: the refusal is announced under the generated name, which every
    rank consumes alike, so the next unnamed call pairs up again."""
    bad = torch.ones(2, dtype=torch.complex64) if rank == size - 1 else torch.ones(2)
    gyre.barrier()
    start = time.monotonic()
    with pytest.raises(gyre.InvalidArgumentError, match="unsupported dtype complex64"):
        gyre.allreduce(bad, op=gyre.Sum)
    assert time.monotonic() - start < BOUND_S
    assert gyre.allreduce(torch.ones(2), op=gyre.Sum).tolist() == [size] * 2


def test_refused_call_of_a_pending_name_leaves_it_valid(size, rank, multi_rank):
    """A second call of a name still pending here, refused, is this rank's
    alone: announcing it would fail the pending operation everywhere."""
    t = torch.ones(2)
    if rank == 0:
        handle = gyre.allreduce_async_(t, name="pending.twice", op=gyre.Sum)
        # The duplicate check comes before the argument checks.
        with pytest.raises(gyre.InvalidArgumentError, match="already pending"):
            gyre.allreduce_(torch.ones(2, dtype=torch.complex64), name="pending.twice")
        gyre.barrier()  # the others enqueue only now: rank 0's is certainly pending
    else:
        gyre.barrier()
        handle = gyre.allreduce_async_(t, name="pending.twice", op=gyre.Sum)
    assert gyre.synchronize(handle).tolist() == [size] * 2
