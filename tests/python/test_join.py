"""Join as Horovod's own tests define it, and grouped allreduces that ranks
group differently. Run under mpirun -np 2 and 3 through mpi_pytest.py.

While a rank has joined, the ranks still running allreduce with the joined
ranks contributing zeros (an average divides by every rank), their
allgathers and broadcasts fail (StateError, a RuntimeError) without
desynchronising anyone, and join() returns the last rank to join, the same
on every rank; afterwards everyone runs in step, unnamed calls included.
"""

import pytest
import torch

import gyre


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float64])
def test_join_allreduce_zeros_and_average_over_every_rank(size, rank, multi_rank, dtype, caching):
    a = torch.arange(-4, 8, dtype=dtype) * 3
    if caching:  # everyone runs it once: it is then sent as a cache bit
        torch.testing.assert_close(gyre.allreduce(a, op=gyre.Average, name="join.a"), a)
    for first in range(size):
        if rank == first:
            ret = gyre.join()
        else:
            out = gyre.allreduce(a, op=gyre.Average, name="join.a")
            summed = gyre.allreduce(a, op=gyre.Sum, name="join.sum")
            expected = a * (size - 1)
            torch.testing.assert_close(summed, expected)
            if dtype.is_floating_point:
                expected = expected / size
            else:  # truncated toward zero, as Horovod's integer average
                expected = torch.div(expected, size, rounding_mode="trunc")
            torch.testing.assert_close(out, expected)
            ret = gyre.join()
        assert ret != first and 0 <= ret < size
        assert gyre.allgather_object(ret) == [ret] * size


@pytest.mark.parametrize("what", ["allgather", "broadcast"])
def test_join_allgather_and_broadcast_raise_on_running_ranks(size, rank, multi_rank, what):
    t = torch.ones(3, 4)
    for first in range(size):
        if rank == first:
            ret = gyre.join()
        else:
            # Unnamed on purpose: the joined rank issues none of these, and
            # the generated names must pair again after the join.
            with pytest.raises(RuntimeError, match=f"rank {first} joined|disagree on root"):
                if what == "allgather":
                    gyre.allgather(t)
                else:
                    gyre.broadcast(t, root_rank=rank)
            ret = gyre.join()
        assert ret != first
        assert gyre.allgather_object(ret) == [ret] * size
        # In step, unnamed calls included.
        gathered = gyre.allgather(torch.full((1, 2), float(rank)))
        assert gathered[:, 0].tolist() == [float(r) for r in range(size)]


@pytest.mark.parametrize("flip", [0, 1])
def test_grouped_allreduce_of_different_sizes_is_a_mismatch_everywhere(size, rank, multi_rank,
                                                                        flip):
    # Rank `flip` groups 3 tensors, the others 2; stall timeout at its
    # default (600 s): the mismatch must come from the round itself.
    count = 3 if rank == flip else 2
    tensors = [torch.ones(4) for _ in range(count)]
    with pytest.raises(gyre.MismatchError, match="of 3.*of 2|of 2.*of 3"):
        gyre.grouped_allreduce(tensors, op=gyre.Sum, name=f"grp{flip}")
    out = gyre.allreduce(torch.ones(2), op=gyre.Sum, name=f"after.grp{flip}")
    assert out.tolist() == [float(size)] * 2
