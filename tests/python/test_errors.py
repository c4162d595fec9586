"""Bad arguments raise the documented exceptions on the calling rank, before
anything is enqueued (the refusal is announced to the other ranks, so none
waits for an operation that never comes: test_refusals.py); the runtime's
errors surface as gyre exceptions."""

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import gyre


class FakeCudaTensor:
    """Claims to live on a GPU the build cannot take (CUDA without NCCL, ROCm
    with it); exporting it must never be attempted."""

    exported = False
    device_type = 10 if gyre._gyre.built_with_nccl else 2  # kDLROCM : kDLCUDA

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None):
        FakeCudaTensor.exported = True
        raise AssertionError("__dlpack__ called on a CUDA tensor")


def assert_nothing_enqueued(size):
    """A collective right after a refused call still matches across ranks:
    the refused call enqueued nothing, and consumed its generated name on
    every rank alike."""
    out = gyre.allreduce(torch.ones(2), op=gyre.Sum)
    assert out.tolist() == [size, size]


@pytest.mark.parametrize("make,match", [
    (lambda: torch.ones(4, 3).t(), "not contiguous"),
    (lambda: np.ones((4, 3))[:, ::2], "not contiguous"),
    (lambda: torch.ones(3, dtype=torch.complex64), "unsupported dtype complex64"),
    (lambda: np.ones(3, dtype=np.uint32), "unsupported dtype uint32"),
    (lambda: [1.0, 2.0], "expected a tensor"),
    (lambda: FakeCudaTensor(), "is on a GPU"),
])
def test_bad_tensors_are_refused_before_enqueue(size, make, match):
    bad = make()
    for call in (lambda: gyre.allreduce(bad), lambda: gyre.allreduce_async_(bad),
                 lambda: gyre.allgather(bad), lambda: gyre.broadcast_(bad, 0)):
        with pytest.raises(gyre.InvalidArgumentError, match=match):
            call()
    assert not FakeCudaTensor.exported
    assert_nothing_enqueued(size)


def test_error_names_the_tensor(size):
    with pytest.raises(gyre.InvalidArgumentError, match="'weights.fc1'.*not contiguous"):
        gyre.allreduce(torch.ones(2, 2).t(), name="weights.fc1")
    # InvalidArgumentError is both a GyreError and a ValueError.
    with pytest.raises(ValueError):
        gyre.allreduce(torch.ones(2, dtype=torch.bool))
    assert issubclass(gyre.InvalidArgumentError, gyre.GyreError)
    assert issubclass(gyre.DivergenceError, gyre.GyreError)


def test_bad_arguments(size):
    t = torch.ones(2 * size)
    with pytest.raises(gyre.InvalidArgumentError, match="read-only"):
        ro = np.ones(3)
        ro.flags.writeable = False
        gyre.allreduce_(ro)
    with pytest.raises(gyre.InvalidArgumentError, match="unknown reduction op"):
        gyre.allreduce(t, op=17)
    with pytest.raises(gyre.InvalidArgumentError, match="either average= or op="):
        gyre.allreduce(t, average=True, op=gyre.Sum)
    with pytest.raises(gyre.InvalidArgumentError, match="not defined for bool"):
        gyre.allreduce(torch.ones(2, dtype=torch.bool), op=gyre.Average)
    with pytest.raises(gyre.InvalidArgumentError, match="root rank"):
        gyre.broadcast(t, root_rank=size)
    with pytest.raises(gyre.InvalidArgumentError, match="root rank"):
        gyre.broadcast_(t, root_rank=-1)
    with pytest.raises(gyre.InvalidArgumentError, match="root_rank must be an integer"):
        gyre.broadcast_(t, root_rank=0.5)
    with pytest.raises(gyre.InvalidArgumentError, match="splits"):
        gyre.alltoall(t, splits=[1] * (size + 1))
    with pytest.raises(gyre.InvalidArgumentError, match="add up to"):
        gyre.alltoall(t, splits=[1] * size + [0] * 0 if size > 1 else [5])
    with pytest.raises(gyre.InvalidArgumentError, match="at least one tensor"):
        gyre.grouped_allreduce([])
    with pytest.raises(gyre.InvalidArgumentError, match="name"):
        gyre.allreduce(t, name="")
    with pytest.raises(gyre.InvalidArgumentError, match="synchronize"):
        gyre.synchronize("not a handle")
    assert_nothing_enqueued(size)


def test_tensor_resized_while_in_flight(size, rank, multi_rank):
    t = torch.ones(8)
    if rank == 0:
        handle = gyre.allreduce_async_(t, op=gyre.Sum, name="resized")
        # Shrinking keeps the storage (the runtime's writes stay in bounds),
        # but the tensor no longer is what was sent.
        t.resize_(4)
        gyre.barrier()  # the others enqueue only now: the operation is in flight
        with pytest.raises(gyre.InvalidArgumentError, match="'resized' was resized"):
            gyre.synchronize(handle)
    else:
        gyre.barrier()
        assert gyre.allreduce_(t, op=gyre.Sum, name="resized").tolist() == [size] * 8


def test_mismatched_shapes_raise_on_every_rank(size, rank, multi_rank):
    t = torch.ones(3 + rank)
    with pytest.raises(gyre.MismatchError, match="mismatch"):
        gyre.allreduce(t, name="mismatched.shape")
    assert_nothing_enqueued(size)


def test_duplicate_pending_name_is_refused(size, rank, multi_rank):
    t1, t2 = torch.ones(2), torch.ones(2)
    if rank == 0:
        h = gyre.allreduce_async_(t1, name="dup", op=gyre.Sum)
        # Still pending: the other ranks enqueue "dup" only after the barrier.
        with pytest.raises(gyre.InvalidArgumentError, match="dup"):
            gyre.allreduce_async_(t2, name="dup", op=gyre.Sum)
        gyre.barrier()
    else:
        gyre.barrier()
        h = gyre.allreduce_async_(t1, name="dup", op=gyre.Sum)
    assert gyre.synchronize(h).tolist() == [size, size]


def test_completed_name_stays_reserved_until_waited(size, rank, multi_rank):
    """The first call's operation has completed (its done callback ran)
    before the second call of its name: still refused, since nothing waited
    for it and nothing was enqueued since; on this rank alone, so the
    operation that follows pairs as usual."""
    done = threading.Event()
    h = gyre.allreduce_async_(torch.ones(2), name="completed.dup", op=gyre.Sum)
    h._op.add_done_callback(done.set)
    assert done.wait(60)
    with pytest.raises(gyre.InvalidArgumentError, match="'completed.dup'.*already pending"):
        gyre.allreduce_async_(torch.ones(2), name="completed.dup", op=gyre.Sum)
    assert gyre.synchronize(h).tolist() == [size, size]
    # Waited: the name is free at once.
    assert gyre.allreduce(torch.ones(2), name="completed.dup", op=gyre.Sum).tolist() == [size] * 2


_DUPLICATE_CALLS = {
    "allreduce": lambda t, name: gyre.allreduce_async(t, name=name),
    "allgather": lambda t, name: gyre.allgather_async(t, name=name),
    "broadcast": lambda t, name: gyre.broadcast_async(t, 0, name=name),
    "alltoall": lambda t, name: gyre.alltoall_async(t, name=name),
    "reducescatter": lambda t, name: gyre.reducescatter_async(t, name=name),
}


@pytest.mark.parametrize("kind", sorted(_DUPLICATE_CALLS))
def test_second_call_without_a_wait_is_refused_every_time(size, rank, multi_rank, kind):
    """Horovod's test_horovod_*_duplicate_name_error, repeated: rank 0 calls
    twice with its handles dropped, then the others. On the others the first
    call pairs with rank 0's pending one and may complete before their second
    call; the second must be refused all the same. The refusals stay local
    (the barriers and the last call pair), and the names do not stay
    reserved past the barrier: the last one serves another kind of call."""
    call = _DUPLICATE_CALLS[kind]
    t = torch.ones(2 * size)
    accepted = []
    for i in range(20):
        name = f"dup.{kind}.{i}"
        for turn in range(2):
            if (rank == 0) == (turn == 0):
                call(t, name)
                try:
                    call(t, name)
                    accepted.append(name)
                except ValueError:
                    pass
            gyre.barrier()
    try:
        reuse = gyre.allgather_async(torch.full((1,), float(rank)), name=name)
    except ValueError:
        reuse = None
    # Every rank's outcome on every rank, so that a failure fails them all
    # at once instead of leaving the others waiting.
    outcome = gyre.allgather(torch.tensor([len(accepted), int(reuse is None)]),
                             name=f"dup.{kind}.outcome").view(size, 2).tolist()
    assert outcome == [[0, 0]] * size, "per rank: [second calls accepted, last name refused]"
    assert gyre.synchronize(reuse).tolist() == [float(r) for r in range(size)]


def test_calls_before_init_raise_state_error():
    code = ("import numpy, gyre\n"
            "for call in (gyre.rank, lambda: gyre.allreduce(numpy.ones(2))):\n"
            "    try:\n"
            "        call()\n"
            "    except gyre.StateError as e:\n"
            "        print('StateError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("StateError:") == 2, out.stdout
