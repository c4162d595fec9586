"""The torch route of the extension (tensor_import.h): plain CPU tensors are
described through torch's own accessors instead of a DLPack export. Results,
lifetimes and refusals must be those of the DLPack route: every dtype, views
with a storage offset, parameters and tensors that require grad, the storage
kept alive while in flight; subclasses still take the DLPack route;
non-contiguous tensors are refused as before (test_refusals.py has the
refusal on one rank reaching every rank)."""

import gc
import time
import weakref

import pytest
import torch

import gyre

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_in_place_and_out_of_place(size, rank, dtype):
    if dtype == torch.bool:
        x = torch.tensor([rank == 0, False, True, rank == size - 1])
        want = torch.tensor([True, False, True, True])
    else:
        x = torch.full((2, 3), rank + 1).to(dtype)
        want = torch.full((2, 3), size * (size + 1) // 2).to(dtype)
    out = gyre.allreduce(x, op=gyre.Sum, name=f"fast.{dtype}.out")
    assert out.dtype == dtype and out.data_ptr() != x.data_ptr() and torch.equal(out, want)
    assert gyre.allreduce_(x, op=gyre.Sum, name=f"fast.{dtype}.in") is x
    assert torch.equal(x, want)


def test_views_with_a_storage_offset(size, rank):
    base = torch.zeros(10)
    view = base[3:7]  # contiguous, storage offset 3
    view.fill_(rank + 1.0)
    gyre.allreduce_(view, op=gyre.Sum, name="fast.offset")
    want = torch.zeros(10)
    want[3:7] = size * (size + 1) / 2
    assert torch.equal(base, want)  # nothing outside the view was written
    rows = torch.arange(12, dtype=torch.float64).reshape(3, 4) * (rank + 1)
    row = rows[1]  # a row of a matrix: offset 4
    out = gyre.allreduce(row, op=gyre.Sum, name="fast.row")
    assert out.tolist() == [v * size * (size + 1) / 2 for v in (4.0, 5.0, 6.0, 7.0)]
    # Extent-1 dimensions may carry any stride and still be contiguous.
    col = torch.full((4, 1), float(rank)).t()  # shape (1, 4), strides (1, 1)
    assert col.is_contiguous()
    assert gyre.allreduce(col, op=gyre.Max, name="fast.col").tolist() == [[size - 1.0] * 4]


def test_parameters_and_tensors_that_require_grad(size, rank):
    p = torch.nn.Parameter(torch.full((3,), float(rank)))
    gyre.allreduce_(p, op=gyre.Max, name="fast.parameter")
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert p.detach().tolist() == [size - 1.0] * 3
    x = torch.full((2,), 1.0, requires_grad=True)
    out = gyre.allreduce(x, op=gyre.Sum, name="fast.grad")
    assert not out.requires_grad and out.tolist() == [float(size)] * 2


def test_subclass_takes_the_dlpack_route(size, rank):
    class Marked(torch.Tensor):
        pass

    x = torch.full((3,), float(rank + 1)).as_subclass(Marked)
    gyre.allreduce_(x, op=gyre.Sum, name="fast.subclass")
    assert type(x) is Marked and x.tolist() == [size * (size + 1) / 2] * 3


def test_non_contiguous_still_refused(size, rank):
    # Every rank passes the same transposed matrix: each refuses at the call.
    t = torch.ones(3, 2).t()
    with pytest.raises(gyre.InvalidArgumentError, match="not contiguous"):
        gyre.allreduce_(t, name="fast.transposed_")
    with pytest.raises(gyre.InvalidArgumentError, match="not contiguous"):
        gyre.allreduce(t, name="fast.transposed")


def test_negative_view_refused(size, rank):
    # Its memory holds the values without the sign: reducing it would be wrong.
    t = torch._neg_view(torch.ones(2))
    assert t.is_neg()
    with pytest.raises(gyre.InvalidArgumentError, match="negative view"):
        gyre.allreduce_(t, name="fast.negative")
    r = gyre.allreduce_(t.resolve_neg(), op=gyre.Sum, name="fast.resolved")
    assert r.tolist() == [-float(size)] * 2


def test_storage_kept_alive_in_flight_and_released_after(size, rank, multi_rank):
    t = torch.full((4,), 1.0)
    alive = weakref.ref(t.untyped_storage())
    if rank == 0:
        gyre.allreduce_async_(t, op=gyre.Sum, name="fast.keepalive")
        del t  # the handle is dropped too: gyre alone holds the storage now
        gc.collect()
        assert alive() is not None  # in flight: the other ranks enqueue after the barrier
        gyre.barrier()
    else:
        gyre.barrier()
        gyre.allreduce_(t, op=gyre.Sum, name="fast.keepalive")
        del t
    # Completed: released on this thread without any further gyre call.
    deadline = time.monotonic() + 30
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive() is None


def test_handle_numbers_taken_late(size, rank):
    h = gyre.allreduce_async(torch.ones(2), op=gyre.Sum, name="fast.number")
    number = int(h)  # the number is taken after the call, as Horovod scripts do
    assert gyre.synchronize(number).tolist() == [float(size)] * 2
    assert gyre.synchronize(number) is None  # Horovod: a synchronized number gives None
    done = gyre.allreduce_async(torch.ones(2), op=gyre.Sum, name="fast.number.done")
    gyre.synchronize(done)
    assert gyre.synchronize(int(done)) is None  # taken only after it completed
    assert gyre.synchronize(done).tolist() == [float(size)] * 2


def test_large_new_outputs_come_from_the_pool_and_are_reused(size, rank):
    # At least 1 MiB: the output is a block of gyre's pool, returned to it
    # when the tensor is freed and handed out again for the next output.
    n = (1 << 20) // 4 + 3
    x = torch.arange(n, dtype=torch.float32) * (rank + 1)
    want = torch.arange(n, dtype=torch.float32) * (size * (size + 1) / 2)
    first = gyre.allreduce(x, op=gyre.Sum, name="fast.pool")
    assert torch.equal(first, want) and first.data_ptr() != x.data_ptr()
    kept = gyre.allreduce(x, op=gyre.Sum, name="fast.pool")  # first still alive: another block
    assert kept.data_ptr() != first.data_ptr() and torch.equal(kept, want)
    # Freed blocks are handed out again: calls whose outputs are freed map
    # few new blocks. Each call needs two (its output, the staged copy of
    # its torch input); a staged copy returns to the pool when its operation
    # is released, which may be a call or two later (a handle completed on
    # another thread is released with the GIL), so the pool may grow by a
    # block or two before it holds what the calls need: 2 per call (16 here)
    # without reuse.
    del first
    mapped = gyre._gyre._host_blocks_mapped()
    for _ in range(8):
        out = gyre.allreduce(x * 2, op=gyre.Sum, name="fast.pool")
        assert torch.equal(out, want * 2)
        del out
    assert gyre._gyre._host_blocks_mapped() - mapped <= 3
    again = gyre.allreduce(x * 2, op=gyre.Sum, name="fast.pool")
    assert torch.equal(again, want * 2) and torch.equal(kept, want)
    assert again.shape == x.shape and again.dtype == x.dtype
    # Written to like any tensor, and still the caller's after more calls.
    again.add_(1)
    assert torch.equal(again, want * 2 + 1)
    # A refused input still raises at the call (nothing enqueued from the pool).
    with pytest.raises(gyre.InvalidArgumentError, match="not contiguous"):
        gyre.allreduce(torch.ones(512, 1024).t(), name="fast.pool.refused")
