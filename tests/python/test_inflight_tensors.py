"""What a rank does to a torch tensor while its operation is in flight
(resize_, storage resize, set_, del) never makes gyre read or write freed
memory, and never gives a rank a wrong result without an error: gyre takes
a torch tensor's values when the operation is called and writes an in-place
result back only into the tensor's own, unchanged memory. The rank whose
tensor changed gets InvalidArgumentError; every other rank gets the sum of
the values as they were passed. Runs under mpirun -np 2 and -np 3.

Rank 0 changes its tensor while the others have not yet called the
operation (they call it only after a later operation rank 0 enqueues, so
the first one is still in flight on rank 0 when it changes the tensor).
The tensors are 4 MiB, which the C library maps and unmaps on its own: a
read or write of freed memory is a SIGSEGV, not a silent corruption.
"""

import pytest
import torch

import gyre
from gyre import InvalidArgumentError

N = 1 << 20  # float32 elements: 4 MiB


def _values(rank):
    return torch.full((N,), float(rank + 1))


def _expected_sum(size):
    return float(sum(r + 1 for r in range(size)))


def _tamper(kind, t):
    """Changes t as a user might while its operation is in flight."""
    if kind == "resize_":
        t.resize_(4 * N)  # grows: torch reallocates and frees the old memory
        t.fill_(-7.0)
    elif kind == "storage_resize":
        t.untyped_storage().resize_(0)  # what FSDP does to free a parameter
    elif kind == "set_":
        t.set_(torch.full((N,), -7.0))
    else:
        raise AssertionError(kind)


def _run(rank, size, name, start, tamper):
    """start(t) enqueues the operation on t and returns (handle, result of
    the tensor's view). Rank 0 tampers before the others enqueue."""
    t = _values(rank)
    if rank == 0:
        handle = start(t)
        tamper(t)
        gyre.allreduce(torch.ones(1), name=name + ".after")  # releases the others
    else:
        gyre.allreduce(torch.ones(1), name=name + ".after")
        handle = start(t)
    return t, handle


@pytest.mark.parametrize("kind", ["resize_", "storage_resize", "set_"])
def test_in_place_changed_in_flight_errors_there_and_others_get_the_sum(rank, size, multi_rank,
                                                                          kind):
    name = f"inflight.in_place.{kind}"
    t, handle = _run(rank, size, name, lambda x: gyre.allreduce_async_(x, op=gyre.Sum, name=name),
                     lambda x: _tamper(kind, x))
    if rank == 0:
        with pytest.raises(InvalidArgumentError, match="in flight"):
            gyre.synchronize(handle)
        # Nothing was written into the tensor's new memory.
        if kind == "resize_":
            assert torch.all(t == -7.0)
        elif kind == "set_":
            assert torch.all(t == -7.0)
    else:
        out = gyre.synchronize(handle)
        assert out is t
        assert torch.all(t == _expected_sum(size)), t[:4].tolist()
    gyre.barrier()


@pytest.mark.parametrize("kind", ["resize_", "storage_resize", "set_"])
def test_out_of_place_input_changed_in_flight_never_gives_a_wrong_sum(rank, size, multi_rank,
                                                                       kind):
    name = f"inflight.out_of_place.{kind}"
    t, handle = _run(rank, size, name, lambda x: gyre.allreduce_async(x, op=gyre.Sum, name=name),
                     lambda x: _tamper(kind, x))
    if rank == 0:
        # The values were taken at the call: the result is right, or this
        # rank is told its input changed under the operation.
        try:
            out = gyre.synchronize(handle)
        except InvalidArgumentError as e:
            assert "in flight" in str(e)
        else:
            assert torch.all(out == _expected_sum(size)), out[:4].tolist()
    else:
        out = gyre.synchronize(handle)
        assert torch.all(out == _expected_sum(size)), out[:4].tolist()
    gyre.barrier()


def test_tensor_deleted_in_flight_still_reduced(rank, size, multi_rank):
    name = "inflight.deleted"

    def start(x):
        return gyre.allreduce_async(x, op=gyre.Sum, name=name)

    def drop(x):
        del x

    t, handle = _run(rank, size, name, start, drop)
    del t
    out = gyre.synchronize(handle)
    assert torch.all(out == _expected_sum(size)), out[:4].tolist()
    gyre.barrier()


def test_torch_distributed_resize_in_flight(rank, size, multi_rank, world):
    import torch.distributed as dist

    t = _values(rank)
    # The release goes through gyre's own API under a name of its own, so the
    # process group's calls pair by order as usual.
    release = "inflight.torch_distributed.after"
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        t.resize_(4 * N)
        gyre.allreduce(torch.ones(1), name=release)
        with pytest.raises(InvalidArgumentError, match="in flight"):
            work.wait()
    else:
        gyre.allreduce(torch.ones(1), name=release)
        dist.all_reduce(t)
        assert torch.all(t == _expected_sum(size)), t[:4].tolist()
    dist.barrier()
