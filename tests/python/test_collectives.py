"""Every collective of the gyre package against a numpy/torch reference.

Each rank's input is computable by every rank (conftest.rank_data), so the
reference is computed locally and compared with what gyre returns.
"""

import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import gyre
from conftest import rank_data

REDUCERS = {
    gyre.Sum: lambda xs: np.sum(xs, axis=0),
    gyre.Average: lambda xs: np.mean(xs, axis=0),
    gyre.Min: lambda xs: np.min(xs, axis=0),
    gyre.Max: lambda xs: np.max(xs, axis=0),
    gyre.Product: lambda xs: np.prod(xs, axis=0),
}
FLOAT_TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-3}


def to_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class DLPackOnly:
    """A DLPack producer that is neither torch nor numpy (and has no buffer
    protocol): gyre must take it through __dlpack__ alone."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8]
# Integer average truncates toward zero, as Horovod's (tested in
# test_integer_average_truncates_as_horovod); here the floating types.
DTYPE_OPS = [(d, op) for d in DTYPES for op in REDUCERS
             if not (op == gyre.Average and np.issubdtype(d, np.integer))]


@pytest.mark.parametrize("dtype,op", DTYPE_OPS)
def test_allreduce_numpy_every_dtype_and_op(size, rank, dtype, op):
    shape = (3, 5)
    inputs = [rank_data(r, shape, dtype, seed=int(op)) for r in range(size)]
    result = gyre.allreduce(inputs[rank], op=op, name=f"ar.{np.dtype(dtype).name}.{int(op)}")
    wide = np.float64 if np.issubdtype(dtype, np.floating) else np.int64
    expected = REDUCERS[op](np.stack([x.astype(wide) for x in inputs]))
    assert result.dtype == dtype and result.shape == shape
    if np.issubdtype(dtype, np.floating):
        np.testing.assert_allclose(result.astype(np.float64), expected, rtol=FLOAT_TOL[dtype],
                                   atol=FLOAT_TOL[dtype])
    else:
        np.testing.assert_array_equal(result, expected.astype(dtype))


def test_allreduce_torch_bfloat16_and_scaling(size, rank):
    x = torch.from_numpy(rank_data(rank, (17,), np.float32, seed=3))
    expected = sum(torch.from_numpy(rank_data(r, (17,), np.float32, seed=3)) for r in range(size))
    bf = gyre.allreduce(x.to(torch.bfloat16), op=gyre.Sum)
    assert bf.dtype == torch.bfloat16
    torch.testing.assert_close(bf.float(), expected, rtol=2e-2, atol=2e-2)
    scaled = gyre.allreduce(x, op=gyre.Sum, prescale_factor=0.5, postscale_factor=3.0)
    torch.testing.assert_close(scaled, expected * 1.5, rtol=1e-5, atol=1e-5)
    avg = gyre.allreduce(x, average=True)
    torch.testing.assert_close(avg, expected / size, rtol=1e-5, atol=1e-6)


def test_fp16_compression_of_collectives(size, rank):
    inputs = [rank_data(r, (40,), np.float32, seed=13) for r in range(size)]
    rounded = [x.astype(np.float16).astype(np.float64) for x in inputs]
    out = gyre.allreduce(torch.from_numpy(inputs[rank]), op=gyre.Sum,
                         compression=gyre.Compression.fp16)
    assert out.dtype == torch.float32  # decompressed to the caller's dtype
    np.testing.assert_allclose(out.numpy(), np.sum(rounded, axis=0), rtol=2e-3, atol=2e-3)
    outs = gyre.grouped_allreduce([inputs[rank], inputs[rank][:5]], op=gyre.Max,
                                  compression=gyre.Compression.fp16)
    assert all(o.dtype == np.float32 for o in outs)
    np.testing.assert_array_equal(outs[1], np.max(rounded, axis=0)[:5].astype(np.float32))
    rs = gyre.reducescatter(inputs[rank].reshape(40, 1), op=gyre.Sum,
                            compression=gyre.Compression.fp16)
    assert rs.dtype == np.float32
    counts = [40 // size + (1 if r < 40 % size else 0) for r in range(size)]
    lo = sum(counts[:rank])
    np.testing.assert_allclose(rs[:, 0], np.sum(rounded, axis=0)[lo:lo + counts[rank]], rtol=2e-3,
                               atol=2e-3)
    # Integers are sent as they are.
    ints = gyre.allreduce(np.full(3, rank, np.int64), op=gyre.Sum, compression=gyre.Compression.fp16)
    assert ints.dtype == np.int64 and ints.tolist() == [sum(range(size))] * 3


def test_allreduce_in_place_async_and_grad_tensors(size, rank):
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    t = base * (rank + 1)
    h = gyre.allreduce_async_(t, op=gyre.Sum, name="inplace")
    assert isinstance(h, gyre.Handle)
    out = gyre.synchronize(h)
    assert out is t and gyre.poll(h)
    torch.testing.assert_close(t, base * sum(range(1, size + 1)))
    # A tensor that requires grad is detached, not refused; in place lands in it.
    w = torch.full((4,), float(rank), requires_grad=True)
    gyre.allreduce_(w, op=gyre.Max)
    assert torch.equal(w.detach(), torch.full((4,), float(size - 1)))
    r = gyre.synchronize(gyre.allreduce_async(torch.ones(3, requires_grad=True), op=gyre.Sum))
    assert not r.requires_grad and torch.equal(r, torch.full((3,), float(size)))


def test_generic_dlpack_producer_and_readonly_input(size, rank):
    a = np.full((2, 2), rank + 1, dtype=np.float32)
    out = gyre.allreduce(DLPackOnly(a), op=gyre.Sum)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.full((2, 2), size * (size + 1) / 2))
    ro = np.full(3, 2.0)
    ro.flags.writeable = False  # numpy refuses DLPack export: the buffer protocol takes it
    np.testing.assert_array_equal(gyre.allreduce(ro, op=gyre.Product), np.full(3, 2.0 ** size))
    gyre.allreduce_(DLPackOnly(a), op=gyre.Min)  # in place through DLPack alone
    np.testing.assert_array_equal(a, np.ones((2, 2)))


def test_grouped_allreduce(size, rank):
    tensors = [torch.from_numpy(rank_data(rank, s, np.float32, seed=i))
               for i, s in enumerate([(3,), (2, 4), (1,)])]
    expected = [sum(torch.from_numpy(rank_data(r, t.shape, np.float32, seed=i)) for r in range(size))
                for i, t in enumerate(tensors)]
    outs = gyre.grouped_allreduce(tensors, op=gyre.Sum)
    for o, e in zip(outs, expected):
        torch.testing.assert_close(o, e)
    h = gyre.grouped_allreduce_async_(tensors, op=gyre.Sum, name="grouped.inplace")
    assert gyre.synchronize(h) == tensors
    for t, e in zip(tensors, expected):
        torch.testing.assert_close(t, e)
    assert gyre.grouped_allreduce_(tensors, op=gyre.Min) == tensors  # equal everywhere now
    for t, e in zip(tensors, expected):
        torch.testing.assert_close(t, e)
    # A numpy array and a torch tensor in one group.
    mixed = gyre.grouped_allreduce([np.ones(2), torch.ones(3)], average=False)
    assert isinstance(mixed[0], np.ndarray) and isinstance(mixed[1], torch.Tensor)
    assert mixed[0].tolist() == [size] * 2 and mixed[1].tolist() == [size] * 3


def test_allgather_uneven_first_dimension(size, rank):
    mine = torch.full((rank + 1, 2), rank, dtype=torch.int64)
    out = gyre.allgather(mine)
    expected = torch.cat([torch.full((r + 1, 2), r, dtype=torch.int64) for r in range(size)])
    assert torch.equal(out, expected)
    arr = gyre.synchronize(gyre.allgather_async(np.arange(3, dtype=np.float16) + rank))
    assert arr.dtype == np.float16
    np.testing.assert_array_equal(arr, np.concatenate([np.arange(3) + r for r in range(size)]))
    # An empty contribution from every rank.
    assert tuple(gyre.allgather(torch.zeros(0, 3)).shape) == (0, 3)


def test_broadcast_every_root(size, rank):
    for root in range(size):
        t = torch.from_numpy(rank_data(rank, (4, 3), np.float32, seed=7))
        expected = torch.from_numpy(rank_data(root, (4, 3), np.float32, seed=7))
        copy = gyre.broadcast(t, root_rank=root)
        torch.testing.assert_close(copy, expected)
        if rank != root:
            assert not torch.equal(t, expected)  # broadcast (no underscore) left t alone
        gyre.broadcast_(t, root)
        torch.testing.assert_close(t, expected)
    a = np.full(5, rank, dtype=np.int32)
    gyre.synchronize(gyre.broadcast_async_(a, size - 1))
    np.testing.assert_array_equal(a, np.full(5, size - 1))


def test_alltoall_with_and_without_splits(size, rank):
    # Rank r sends (p + 1) rows to rank p; row values encode (sender, receiver).
    splits = [p + 1 for p in range(size)]
    rows = np.concatenate([np.full((p + 1, 2), 10 * rank + p) for p in range(size)]).astype(np.float32)
    out, received = gyre.alltoall(torch.from_numpy(rows), splits=splits)
    expected = np.concatenate([np.full((rank + 1, 2), 10 * s + rank) for s in range(size)])
    np.testing.assert_array_equal(out.numpy(), expected)
    assert received.tolist() == [rank + 1] * size
    even = gyre.alltoall(np.arange(2 * size, dtype=np.int64) + 100 * rank)
    np.testing.assert_array_equal(even, np.array([100 * s + 2 * rank + k for s in range(size)
                                                  for k in range(2)]))


def test_reducescatter_uneven_rows(size, rank):
    n_rows = 2 * size + 1  # does not divide evenly: earlier ranks take one extra row
    inputs = [rank_data(r, (n_rows, 3), np.float64, seed=11) for r in range(size)]
    total = np.sum(inputs, axis=0)
    bounds = np.cumsum([0] + [n_rows // size + (1 if r < n_rows % size else 0) for r in range(size)])
    out = gyre.reducescatter(torch.from_numpy(inputs[rank]), op=gyre.Sum)
    np.testing.assert_allclose(out.numpy(), total[bounds[rank]:bounds[rank + 1]], rtol=1e-12)
    avg = gyre.reducescatter(inputs[rank])
    np.testing.assert_allclose(avg, total[bounds[rank]:bounds[rank + 1]] / size, rtol=1e-12)


def test_objects(size, rank):
    obj = {"rank": rank, "payload": list(range(rank * 3))}
    assert gyre.broadcast_object(obj, root_rank=size - 1) == {"rank": size - 1,
                                                              "payload": list(range((size - 1) * 3))}
    assert gyre.allgather_object(obj) == [{"rank": r, "payload": list(range(r * 3))}
                                          for r in range(size)]


def test_topology_barrier_and_version_vector(size, rank):
    assert 0 <= gyre.local_rank() < gyre.local_size() <= size
    assert gyre.is_initialized()
    gyre.barrier()
    vv = gyre.version_vector()
    assert len(vv) == size and vv[rank] == gyre.committed_steps()


def test_join_last_rank_reduces_with_zeros(size, rank):
    last = size - 1
    if rank == last:
        # Every other rank has joined: they contribute zeros, and Average
        # divides by every rank (Horovod's join).
        out = gyre.allreduce(torch.full((3,), 6.0), op=gyre.Sum, name="join.after")
        assert out.tolist() == [6.0] * 3
        out = gyre.allreduce(torch.full((3,), 6.0), op=gyre.Average, name="join.after.avg")
        assert out.tolist() == [6.0 / size] * 3
    assert gyre.join() == last


def test_tensor_kept_alive_in_flight_and_released_after(size, rank, multi_rank):
    a = np.full(4, 1.0)
    alive = weakref.ref(a)
    if rank == 0:
        gyre.allreduce_async_(a, op=gyre.Sum, name="keepalive")
        del a  # the handle is dropped too: gyre alone holds the array now
        gc.collect()
        assert alive() is not None  # in flight: the other ranks enqueue after the barrier
        gyre.barrier()
    else:
        gyre.barrier()
        gyre.allreduce_(a, op=gyre.Sum, name="keepalive")
        del a
    # Completed: released on this thread without any further gyre call.
    deadline = time.monotonic() + 30
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive() is None


def test_gil_released_while_waiting(size, rank, multi_rank):
    t = torch.ones(3)
    if rank == 0:
        h = gyre.allreduce_async_(t, op=gyre.Sum, name="gil")
        assert not gyre.poll(h)  # the other ranks enqueue after the barrier
        waiter = threading.Thread(target=gyre.synchronize, args=(h,))
        waiter.start()
        # This thread runs Python while the waiter blocks in synchronize(): it
        # could not if the wait held the GIL.
        spins, end = 0, time.monotonic() + 0.2
        while time.monotonic() < end:
            spins += 1
        assert spins > 0 and waiter.is_alive() and not gyre.poll(h)
        gyre.barrier()
        waiter.join(timeout=60)
        assert not waiter.is_alive() and gyre.poll(h)
    else:
        gyre.barrier()
        gyre.allreduce_(t, op=gyre.Sum, name="gil")
    assert t.tolist() == [float(size)] * 3


def test_topology_on_one_host():
    # Every rank of these runs is on this one machine.
    assert gyre.local_rank() == gyre.rank()
    assert gyre.local_size() == gyre.size()
    assert gyre.cross_rank() == 0
    assert gyre.cross_size() == 1


def test_integer_average_truncates_as_horovod(size, rank):
    # Rank r holds 5 + r: the average of 5..5+size-1, truncated toward zero.
    t = torch.full((4,), 5 + rank, dtype=torch.int32)
    want = (sum(5 + r for r in range(size))) // size
    out = gyre.allreduce(t, op=gyre.Average)
    assert out.dtype == torch.int32
    assert out.tolist() == [want] * 4


def test_blocking_calls_run_rounds_on_the_callers_thread(size, rank):
    """A Python caller waiting for its operation runs the negotiation rounds
    itself (GYRE_CALLER_ROUNDS, on by default), as a C++ caller in
    Handle::wait() does, instead of being woken by the background thread:
    runtime_stats()["caller_rounds"] grows over blocking calls, and every
    result is right."""
    if os.environ.get("GYRE_CALLER_ROUNDS", "1") == "0" or \
            os.environ.get("GYRE_P2P_ON_COORDINATOR", "0") != "0":
        pytest.skip("caller rounds are off in this environment")
    if torch.cuda.is_available():
        # Once a rank has used a CUDA tensor its rounds stay on the
        # background thread (NCCL's streams are that thread's).
        pytest.skip("the CUDA tests of this process may have turned caller rounds off")
    t = torch.ones(2)
    gyre.allreduce_(t, name="stats.caller", op=gyre.Sum)  # fills the response cache
    before = gyre.runtime_stats()["caller_rounds"]
    for i in range(200):
        t.fill_(rank + i)
        gyre.allreduce_(t, name="stats.caller", op=gyre.Sum)
        assert t.tolist() == [float(size * i + size * (size - 1) // 2)] * 2
    after = gyre.runtime_stats()
    assert after["caller_rounds"] > before
    # The hand-overs to the background thread and its wake-ups that left the
    # rounds to the callers are counted too (never negative, never missing).
    assert isinstance(after["caller_handoffs"], int) and after["caller_handoffs"] >= 0
    assert isinstance(after["rounds_left_to_callers"], int)


def test_int16_and_bool_allreduce(size, rank):
    s = gyre.allreduce(torch.full((3,), rank + 1, dtype=torch.int16), op=gyre.Sum)
    assert s.dtype == torch.int16 and s.tolist() == [size * (size + 1) // 2] * 3
    b = gyre.allreduce(torch.tensor([rank == 0, False, True]), op=gyre.Sum)  # logical or
    assert b.dtype == torch.bool and b.tolist() == [True, False, True]
    b = gyre.allreduce(torch.tensor([rank == 0, True, True]), op=gyre.Min)  # logical and
    assert b.tolist() == [size == 1, True, True]


def test_small_allreduces_are_reduced_within_the_round(size, rank):
    """A repeated allreduce of at most GYRE_SPECULATE_BYTES rides in the
    log-depth round itself where the round gives the backend's own bits (2
    ranks; a power of two of ranks each alone on its host; one host over
    shared memory, in rank order):
    runtime_stats()["speculation"] says so, the count follows it, and the
    results are the sums and averages."""
    gyre.barrier()
    before = gyre.runtime_stats()
    for i in range(20):
        s = gyre.allreduce(torch.tensor([rank + i, 0.5]), name="stats.spec", op=gyre.Sum)
        assert s.tolist() == [size * (size - 1) / 2 + size * i, 0.5 * size]
        a = gyre.allreduce(torch.tensor([2.0 * rank + i], dtype=torch.float64), name="stats.spec.avg")
        assert a.item() == pytest.approx((size - 1) + i)
    after = gyre.runtime_stats()
    env = os.environ
    on = (int(env.get("GYRE_SPECULATE_BYTES", "16384")) >= 16 and env.get("GYRE_LOG_NEGOTIATION", "1") != "0"
          and env.get("GYRE_CACHE_CAPACITY", "1024") != "0")
    if size == 2 and "GYRE_ALLREDUCE_SMALL_BYTES" not in env:
        assert after["speculation"] == on
    if size == 1:
        assert not after["speculation"]
    speculated = after["speculated_allreduces"] - before["speculated_allreduces"]
    assert (speculated > 0) == (on and after["speculation"]), (speculated, after["speculation"])


def test_runtime_stats_count_log_depth_rounds(size, rank):
    """Repeated allreduces of the same names are cache hits on every rank:
    runtime_stats() shows them decided by log-depth rounds, and this rank's
    negotiation messages grow by at least ceil(log2 size) per such round."""
    t = torch.ones(16)
    gyre.allreduce(t, name="stats.ld", op=gyre.Sum)  # fills the response cache
    gyre.barrier()
    before = gyre.runtime_stats()
    for _ in range(10):
        out = gyre.allreduce(t, name="stats.ld", op=gyre.Sum)
    after = gyre.runtime_stats()
    assert torch.equal(out, torch.full((16,), float(size)))
    log2 = (size - 1).bit_length()
    hosts = after["negotiation_tier_hosts"]
    if hosts:  # two tiers across hosts: ceil(log2 hosts) from local rank 0 only
        log2 = (hosts - 1).bit_length() if gyre.local_rank() == 0 else 0
    rounds = after["log_depth_rounds"] - before["log_depth_rounds"]
    assert rounds >= 10
    assert after["negotiation_messages"] - before["negotiation_messages"] >= log2 * rounds
    # The cost model's link parameters: built in unless GYRE_LINK_PROBE=1
    # across hosts of several ranks each; positive either way.
    link = after["link"]
    assert link["source"] in ("built-in", "probed", "cached")
    assert link["source"] == "built-in" or gyre.cross_size() > 1
    assert all(link[k] > 0 for k in ("net_alpha_s", "net_bytes_per_s", "shm_alpha_s",
                                       "shm_bytes_per_s"))
