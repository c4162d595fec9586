"""Horovod's API as horovod.torch 0.28 defines it, on `import gyre.torch as hvd`:
lifecycle and build information, signatures and positional order, handles,
alltoall and reducescatter results, process_set= arguments and error classes."""

import os

import numpy as np
import pytest
import torch

import gyre
import gyre.torch as hvd


def test_init_is_idempotent_and_takes_horovods_arguments(size):
    hvd.init()
    hvd.init(comm=list(range(size)))
    hvd.init(comm=None, process_sets=[hvd.ProcessSet(list(range(size)))])
    assert hvd.is_initialized()


def test_init_on_other_ranks_while_running_is_refused_and_leaves_gyre_running(size, multi_rank):
    # Running on a subset is tested by init_subset.py (a job of its own) and
    # by the mpi4py test below.
    with pytest.raises(hvd.InvalidArgumentError, match="runs already"):
        hvd.init(comm=[0])
    assert hvd.is_initialized()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_build_information_is_truthful():
    assert hvd.mpi_built() is True and hvd.mpi_enabled() is True
    assert hvd.gloo_built() is False and hvd.gloo_enabled() is False
    assert hvd.nccl_built() == hvd.cuda_built() == bool(gyre._gyre.built_with_nccl)
    assert not (hvd.rocm_built() or hvd.ddl_built() or hvd.ccl_built())
    assert isinstance(hvd.mpi_threads_supported(), bool)
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    assert isinstance(hvd.is_homogeneous(), bool)


def test_process_set_argument_global(size, rank, multi_rank):
    t = torch.ones(2)
    assert hvd.allreduce(t, op=hvd.Sum, process_set=hvd.global_process_set).tolist() == [size] * 2
    assert hvd.global_process_set.size() == size and hvd.global_process_set.rank() == rank
    hvd.barrier(process_set=hvd.global_process_set)
    assert hvd.remove_process_set(hvd.global_process_set) is False
    # Every rank is the global set: not a new one.
    with pytest.raises(ValueError, match="global process set"):
        hvd.add_process_set(list(range(size)))
    # Not registered: refused where it is used (tests/python/test_process_sets.py
    # has registered sets).
    sub = hvd.ProcessSet([0])
    calls = [
        lambda: hvd.allreduce(t, process_set=sub), lambda: hvd.allgather(t, process_set=sub),
        lambda: hvd.broadcast(t, 0, process_set=sub), lambda: hvd.alltoall(t, process_set=sub),
        lambda: hvd.reducescatter(t, process_set=sub), lambda: hvd.barrier(process_set=sub),
        lambda: hvd.grouped_allreduce([t], process_set=sub),
        lambda: hvd.broadcast_object(1, process_set=sub),
        lambda: hvd.allgather_object(1, process_set=sub),
        lambda: hvd.broadcast_parameters({"t": t}, 0, process_set=sub),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="not registered"):
            call()
    with pytest.raises(TypeError):
        hvd.allreduce(t, process_set="everyone")


def test_positional_order_of_reducescatter_is_horovods(size, rank):
    rows = torch.arange(2.0 * size).reshape(2 * size, 1) + rank
    # (tensor, name, compression, op, process_set, prescale_factor, postscale_factor)
    out = hvd.reducescatter(rows, "rs.positional", hvd.Compression.none, hvd.Sum,
                            hvd.global_process_set, 2.0, 0.5)
    expected = (torch.arange(2.0 * size) * size + sum(range(size)))[2 * rank:2 * rank + 2]
    torch.testing.assert_close(out[:, 0], expected)
    h = hvd.reducescatter_async(rows, "rs.positional.async", hvd.Average,
                                hvd.global_process_set, 1.0, 3.0)
    torch.testing.assert_close(hvd.synchronize(h)[:, 0], 3.0 * expected / size)


def test_grouped_allgather_and_reducescatter(size, rank):
    a, b = torch.full((rank + 1, 2), float(rank)), torch.arange(3, dtype=torch.int64) + rank
    ga, gb = hvd.grouped_allgather([a, b])
    assert ga.shape == (size * (size + 1) // 2, 2)
    assert gb.tolist() == [i + r for r in range(size) for i in range(3)]
    xs = [torch.ones(size, 3) * (rank + 1), torch.arange(float(size)) + rank]
    ra, rb = hvd.synchronize(hvd.grouped_reducescatter_async(xs, op=hvd.Sum))
    assert ra.tolist() == [[float(sum(range(1, size + 1)))] * 3]
    assert rb.tolist() == [float(rank * size + sum(range(size)))]
    ra, rb = hvd.grouped_reducescatter(xs)  # Average
    torch.testing.assert_close(ra, torch.full((1, 3), (size + 1) / 2))


def test_alltoall_returns_received_splits_as_horovod(size, rank):
    splits = [r + 1 for r in range(size)]
    t = torch.full((sum(splits), 2), float(rank))
    out, received = hvd.alltoall(t, splits=splits)
    assert received.dtype == torch.int32 and received.tolist() == [rank + 1] * size
    assert out.shape == ((rank + 1) * size, 2)
    out, received = hvd.alltoall(t, splits=torch.tensor(splits, dtype=torch.int64))
    assert received.dtype == torch.int64
    even = hvd.alltoall(torch.arange(float(size)))  # no splits: the output alone
    assert isinstance(even, torch.Tensor) and even.tolist() == [float(rank)] * size
    out, received = hvd.synchronize(hvd.alltoall_async(torch.arange(float(size))))
    assert out.tolist() == [float(rank)] * size and received.tolist() == [1] * size


def test_handles_work_as_horovods_integers(size):
    h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
    number = int(h)
    assert h == number and hash(h) == hash(number) and {number: "x"}[h] == "x"
    assert hvd.synchronize(number).tolist() == [size] * 2
    assert hvd.poll(number)
    assert hvd.synchronize(number) is None  # synchronized already: None, as Horovod
    handles = [hvd.allreduce_async_(torch.ones(1) * i, op=hvd.Sum) for i in range(3)]
    assert [hvd.synchronize(int(x)).item() for x in handles] == [0, size, 2 * size]
    with pytest.raises(ValueError, match="not a handle"):
        hvd.synchronize(10 ** 9)
    with pytest.raises(TypeError):
        hvd.poll("handle")


def test_join_returns_the_last_rank_to_join(size):
    last = hvd.join(device=-1)
    assert isinstance(last, int) and 0 <= last < size


def test_error_classes_are_horovods(size, rank, multi_rank):
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hvd.HorovodInternalError, hvd.GyreError)
    for cls in (hvd.MismatchError, hvd.TransportError, hvd.TimeoutError, hvd.StateError,
                hvd.DivergenceError):
        assert issubclass(cls, hvd.HorovodInternalError)
    assert issubclass(hvd.StateError, ValueError)  # Horovod: "not initialized" is ValueError
    assert issubclass(hvd.InvalidArgumentError, ValueError)
    assert issubclass(hvd.InvalidTypeError, TypeError)
    assert issubclass(hvd.NotSupportedError, NotImplementedError)
    # Shapes that differ across ranks: a failed collective, Horovod's class.
    with pytest.raises(hvd.HorovodInternalError, match="shape"):
        hvd.allreduce(torch.ones(rank + 1), name="horovod.mismatch")
    with pytest.raises(ValueError):
        hvd.broadcast(torch.ones(1), root_rank=size + 5)


def test_compression_bf16_and_user_compressors(size, rank):
    x = torch.full((4,), 1.0 + rank, dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.full((4,), float(sum(range(1, size + 1)))))

    class Halving(hvd.Compressor):
        """Sends half the value, restores it: a user compressor."""
        calls = 0

        @staticmethod
        def compress(tensor):
            Halving.calls += 1
            return tensor / 2, "half"

        @staticmethod
        def decompress(tensor, ctx):
            assert ctx == "half"
            return tensor * 2

    out = hvd.allreduce(x, op=hvd.Sum, compression=Halving)
    torch.testing.assert_close(out, torch.full((4,), float(sum(range(1, size + 1)))))
    assert Halving.calls == 1
    # numpy has no bfloat16: arrays travel unchanged.
    arr = hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum, compression=hvd.Compression.bf16)
    assert arr.dtype == np.float32 and arr.tolist() == [size] * 2


def test_objects_take_process_set(size, rank):
    assert hvd.broadcast_object({"r": rank}, root_rank=0,
                                process_set=hvd.global_process_set) == {"r": 0}
    assert hvd.allgather_object(rank, process_set=hvd.global_process_set) == list(range(size))


# Parameter names, in order, of horovod.torch 0.28's functions (mpi_ops.py,
# functions.py, optimizer.py): a script passing arguments by position or by
# keyword means the same on gyre.torch.
_ALLREDUCE = ["tensor", "average", "name", "op", "prescale_factor", "postscale_factor",
              "process_set"]
_GROUPED = ["tensors"] + _ALLREDUCE[1:]
HOROVOD_SIGNATURES = {
    "allreduce_async": _ALLREDUCE, "allreduce_async_": _ALLREDUCE, "allreduce_": _ALLREDUCE,
    "allreduce": _ALLREDUCE[:3] + ["compression"] + _ALLREDUCE[3:],
    "grouped_allreduce_async": _GROUPED, "grouped_allreduce_async_": _GROUPED,
    "grouped_allreduce_": _GROUPED,
    "grouped_allreduce": _GROUPED[:3] + ["compression"] + _GROUPED[3:],
    "allgather": ["tensor", "name", "process_set"],
    "allgather_async": ["tensor", "name", "process_set"],
    "grouped_allgather": ["tensors", "name", "process_set"],
    "grouped_allgather_async": ["tensors", "name", "process_set"],
    "broadcast": ["tensor", "root_rank", "name", "process_set"],
    "broadcast_": ["tensor", "root_rank", "name", "process_set"],
    "broadcast_async": ["tensor", "root_rank", "name", "process_set"],
    "broadcast_async_": ["tensor", "root_rank", "name", "process_set"],
    "alltoall": ["tensor", "splits", "name", "process_set"],
    "alltoall_async": ["tensor", "splits", "name", "process_set"],
    "reducescatter": ["tensor", "name", "compression", "op", "process_set", "prescale_factor",
                      "postscale_factor"],
    "reducescatter_async": ["tensor", "name", "op", "process_set", "prescale_factor",
                            "postscale_factor"],
    "grouped_reducescatter": ["tensors", "name", "compression", "op", "process_set",
                              "prescale_factor", "postscale_factor"],
    "grouped_reducescatter_async": ["tensors", "name", "op", "process_set", "prescale_factor",
                                    "postscale_factor"],
    "sparse_allreduce_async": ["tensor", "name", "op", "process_set"],
    # join: Horovod's device, then gyre's process_set (an addition at the end).
    "join": ["device", "process_set"], "barrier": ["process_set"], "poll": ["handle"],
    "synchronize": ["handle"], "init": ["comm", "process_sets"],
    "broadcast_parameters": ["params", "root_rank", "process_set"],
    "broadcast_optimizer_state": ["optimizer", "root_rank", "model", "process_set"],
    "broadcast_object": ["obj", "root_rank", "name", "process_set"],
    "allgather_object": ["obj", "name", "process_set"],
    "DistributedOptimizer": ["optimizer", "named_parameters", "compression",
                             "backward_passes_per_step", "op", "gradient_predivide_factor",
                             "num_groups", "groups", "sparse_as_dense", "process_set"],
}


def test_signatures_are_horovods():
    import inspect
    differ = {name: list(inspect.signature(getattr(hvd, name)).parameters)
              for name in HOROVOD_SIGNATURES
              if list(inspect.signature(getattr(hvd, name)).parameters) != HOROVOD_SIGNATURES[name]}
    assert differ == {}
    for name in ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
                 "SyncBatchNorm", "Compression", "HorovodInternalError", "Average", "Sum",
                 "Adasum", "Min", "Max", "Product", "is_homogeneous", "ccl_built", "ddl_built"]:
        assert hasattr(hvd, name), name


def test_init_takes_an_mpi4py_communicator(size):
    MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed")
    hvd.init(comm=MPI.COMM_WORLD)
    if size > 1:
        single = MPI.COMM_WORLD.Split(color=MPI.COMM_WORLD.Get_rank(), key=0)
        with pytest.raises(ValueError, match="runs already"):
            hvd.init(comm=single)
        single.Free()
    assert hvd.is_initialized()


def test_init_on_mpi4py_subcommunicators_runs_each_alone(size, rank):
    """Even and odd ranks each run gyre on their own communicator at the same
    time, in the communicator's rank order (reversed here); then init()
    without comm runs on every rank again."""
    MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed")
    hvd.shutdown()
    try:
        sub = MPI.COMM_WORLD.Split(color=rank % 2, key=-rank)
        members = [r for r in range(size) if r % 2 == rank % 2][::-1]
        hvd.init(comm=sub)
        assert (hvd.size(), hvd.rank()) == (sub.Get_size(), sub.Get_rank())
        assert (hvd.size(), hvd.rank()) == (len(members), members.index(rank))
        assert hvd.allgather(torch.tensor([rank])).tolist() == members
        assert hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).item() == sum(members)
        hvd.barrier()
        hvd.shutdown()
        sub.Free()
    finally:
        hvd.init()
    assert (hvd.size(), hvd.rank()) == (size, rank)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_start_and_stop_timeline_at_run_time(rank):
    import json
    import gyre.torch as hvd
    path = f"/tmp/gyre-timeline-test-{os.getpid()}-{{rank}}.json"
    mine = path.replace("{rank}", str(rank))
    hvd.allreduce(torch.ones(3), name="before.timeline")      # not in the file
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(3), name="inside.timeline")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(3), name="after.timeline")       # not in the file
    with open(mine) as f:
        events = json.load(f)["traceEvents"]
    text = json.dumps(events)
    os.unlink(mine)
    assert "inside.timeline" in text
    assert "before.timeline" not in text and "after.timeline" not in text
