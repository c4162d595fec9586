"""CPU torch tensors in flight are used in place, their memory pinned by
gyre._torch_memory (bindings/src/torch_memory_api.h), where that module was
built for the installed torch; and a storage the caller leaves alone ends
each operation exactly as it began. Runs under mpirun -np 2 and -np 3, and
again with GYRE_TORCH_IN_FLIGHT=copy (tests/python/CMakeLists.txt), where
the mode tests check the copies instead. What changing a tensor in flight
does is tests/python/test_inflight_tensors.py's."""

import importlib.util
import os

import pytest
import torch

import gyre
from gyre import InvalidArgumentError
from gyre import _gyre

N = 1 << 20  # float32 elements: 4 MiB, mapped and unmapped by the C library


def _expected_mode():
    if os.environ.get("GYRE_TORCH_IN_FLIGHT") == "copy":
        return "copy"
    spec = importlib.util.find_spec("gyre._torch_memory")
    if spec is None:
        return "copy"
    import gyre._torch_memory as m
    return "pin" if m.torch_version == torch.__version__ else "copy"


def test_mode_is_pin_where_the_module_serves_this_torch(rank, size):
    torch.ones(1)  # torch imported
    assert _gyre._torch_in_flight_mode() == _expected_mode()


def test_in_place_result_lands_in_the_same_memory(rank, size):
    t = torch.full((N,), float(rank + 1))
    before = t.data_ptr()
    gyre.allreduce_(t, op=gyre.Sum, name="pin.same_memory")
    assert t.data_ptr() == before
    assert torch.all(t == float(sum(r + 1 for r in range(size))))


def _is_pinned(t):
    if _gyre._torch_in_flight_mode() != "pin":
        return False
    import gyre._torch_memory as m
    return m.is_pinned(t.untyped_storage())


def test_pinned_in_flight_and_given_back_after(rank, size, multi_rank):
    # Rank 0's operation stays in flight until the others call it (after a
    # release rank 0 sends): pinned meanwhile where the mode is "pin"; the
    # storage's own DataPtr is back once the operation has ended.
    name = "pin.given_back"
    t = torch.full((N,), float(rank + 1))
    pinning = _gyre._torch_in_flight_mode() == "pin"
    if rank == 0:
        handle = gyre.allreduce_async_(t, op=gyre.Sum, name=name)
        assert _is_pinned(t) == pinning
        gyre.allreduce(torch.ones(1), name=name + ".after")
        gyre.synchronize(handle)
    else:
        gyre.allreduce(torch.ones(1), name=name + ".after")
        gyre.allreduce_(t, op=gyre.Sum, name=name)
    assert not _is_pinned(t)
    assert torch.all(t == float(sum(r + 1 for r in range(size))))


def test_shared_memory_is_copied_not_pinned_and_stays_shared(rank, size):
    # torch finds shared memory by the storage's deleter (is_shared(), the
    # sharing between processes): such storages are copied, never pinned.
    t = torch.full((N,), 1.0).share_memory_()
    h = gyre.allreduce_async_(t, op=gyre.Sum, name="pin.shared")
    assert t.is_shared() and not _is_pinned(t)
    gyre.synchronize(h)
    assert t.is_shared()
    assert torch.all(t == float(size))


def test_views_of_one_storage_in_flight_together(rank, size):
    t = torch.full((2 * N,), float(rank + 1))
    a, b = t[:N], t[N:]
    ha = gyre.allreduce_async_(a, op=gyre.Sum, name="pin.view.a")
    hb = gyre.allreduce_async_(b, op=gyre.Max, name="pin.view.b")
    gyre.synchronize(ha)
    assert _is_pinned(t) == (_gyre._torch_in_flight_mode() == "pin")  # b still holds it
    gyre.synchronize(hb)
    assert torch.all(a == float(sum(r + 1 for r in range(size))))
    assert torch.all(b == float(size))
    assert not _is_pinned(t)  # the last one to finish gave it back


def test_moved_to_shared_memory_in_flight_never_touches_freed_memory(rank, size, multi_rank):
    # share_memory_() copies the storage into new shared memory and frees the
    # old memory at once, as resize_() does: the operation keeps using the
    # old memory; the rank that moved it is told, the others get the sum.
    name = "pin.share_in_flight"
    t = torch.full((N,), float(rank + 1))
    if rank == 0:
        handle = gyre.allreduce_async_(t, op=gyre.Sum, name=name)
        t.share_memory_()
        gyre.allreduce(torch.ones(1), name=name + ".after")
        with pytest.raises(InvalidArgumentError, match="in flight"):
            gyre.synchronize(handle)
        assert torch.all(t == 1.0)  # its new memory holds the values it had
    else:
        gyre.allreduce(torch.ones(1), name=name + ".after")
        gyre.synchronize(gyre.allreduce_async_(t, op=gyre.Sum, name=name))
        assert torch.all(t == float(sum(r + 1 for r in range(size))))
    gyre.barrier()


def test_many_operations_leave_no_memory_held(rank, size):
    # A pinned storage's memory is freed once the tensor and the operation
    # are both gone: 200 operations on 4 MiB tensors would hold 800 MiB.
    import resource
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    for i in range(20):
        gyre.allreduce_(torch.ones(N), op=gyre.Sum, name="pin.leak")
    start = rss_mb()
    for i in range(200):
        t = torch.ones(N)
        gyre.allreduce_(t, op=gyre.Sum, name="pin.leak")
        del t
    assert rss_mb() - start < 100, (start, rss_mb())


def test_new_output_of_a_dropped_handle_is_kept_alive(rank, size, multi_rank):
    # The new tensor an out-of-place allreduce writes into is the call's own
    # (neither pinned nor copied: nobody else holds it), so the extension
    # alone keeps it alive: rank 0 drops the handle, and with it the output,
    # while the operation waits for the others. 4 MiB: freed memory is
    # unmapped, so a write into it would be a SIGSEGV.
    import gc
    name = "pin.dropped_output"
    t = torch.full((N,), float(rank + 1))
    if rank == 0:
        handle = gyre.allreduce_async(t, op=gyre.Sum, name=name)
        del handle
        gc.collect()
        gyre.allreduce(torch.ones(1), name=name + ".after")
    else:
        gyre.allreduce(torch.ones(1), name=name + ".after")
        out = gyre.synchronize(gyre.allreduce_async(t, op=gyre.Sum, name=name))
        assert torch.all(out == float(sum(r + 1 for r in range(size))))
    gyre.barrier()
    gyre.allreduce(torch.ones(N), name=name + ".again")  # the job goes on
    assert torch.all(t == float(rank + 1))  # the input untouched


def _facts_from_python(t):
    """What torch's Python accessors say of `t`, in read_tensor's terms."""
    codes = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
             torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 11,
             torch.bfloat16: 15}
    s = t.untyped_storage()
    return (codes[t.dtype], t.is_contiguous(), t.is_neg(), tuple(t.shape), t.data_ptr(),
            s.data_ptr(), s.nbytes())


def test_tensor_facts_read_in_cpp_agree_with_torchs_accessors(rank, size):
    """The extension reads a plain CPU tensor's dtype, contiguity, negative
    bit, shape and memory from its TensorImpl in C++ (read_tensor), not
    through Python: the same facts as torch's own accessors, for views at an
    offset, transposes, negative views, every dtype, 0-d and empty tensors
    and parameters; and nothing (Python then decides) for sparse tensors."""
    if _expected_mode() != "pin":
        pytest.skip("gyre._torch_memory does not serve this torch here")
    import gyre._torch_memory as m
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    cases = [base, base[1:], base[:, 2:], base.t(), base[2, 3], torch.empty(0, 5),
             torch.tensor(3.5), torch.nn.Parameter(torch.ones(3, 2)),
             torch.ones(4, dtype=torch.complex64).conj().imag, torch.ones(3)._neg_view()]
    cases += [torch.ones(5, dtype=dt) for dt in (torch.uint8, torch.int8, torch.int16, torch.int32,
                                                 torch.int64, torch.float16, torch.float64,
                                                 torch.bool, torch.bfloat16)]
    for t in cases:
        assert m.read_tensor(t) == _facts_from_python(t), (t.shape, t.dtype, t.stride())
    assert m.read_tensor(torch.ones(3, 3).to_sparse()) is None
