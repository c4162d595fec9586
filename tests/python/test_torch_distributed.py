"""torch.distributed on the gyre backend: every collective against a value
computed locally (rank r fills element i with r + 1 + i % 7), asynchrony
(futures completed by gyre's callback thread, without wait()), errors on
every rank (mismatch, a refusal on one rank), and how a job is launched."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

import gyre
import gyre.torch.distributed  # noqa: F401 (registers the backend)
from gyre.torch.distributed import _launch

N = 11


def fill(r, n=N, dtype=torch.float32):
    return (r + 1 + torch.arange(n) % 7).to(dtype)


def per_rank(size, n=N, dtype=torch.float64):
    return torch.stack([fill(r, n, dtype) for r in range(size)])


OPS = {
    "sum": (dist.ReduceOp.SUM, lambda a: a.sum(0)),
    "avg": (dist.ReduceOp.AVG, lambda a: a.mean(0)),
    "min": (dist.ReduceOp.MIN, lambda a: a.min(0).values),
    "max": (dist.ReduceOp.MAX, lambda a: a.max(0).values),
    "product": (dist.ReduceOp.PRODUCT, lambda a: a.prod(0)),
    "premul_sum": (dist._make_nccl_premul_sum(0.5), lambda a: 0.5 * a.sum(0)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", sorted(OPS))
def test_all_reduce(world, op, dtype):
    rank, size = world
    t = fill(rank, dtype=dtype)
    dist.all_reduce(t, op=OPS[op][0])
    assert torch.allclose(t.double(), OPS[op][1](per_rank(size)))


def test_all_reduce_int_and_non_contiguous(world):
    rank, size = world
    t = fill(rank, dtype=torch.int32)
    dist.all_reduce(t)
    assert torch.equal(t, per_rank(size).sum(0).int())
    m = fill(rank, 12).view(3, 4).t()  # not contiguous
    dist.all_reduce(m)
    assert torch.equal(m, per_rank(size, 12).sum(0).float().view(3, 4).t())


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast(world, root):
    rank, size = world
    root = root % size
    t = fill(rank)
    dist.broadcast(t, src=root)
    assert torch.equal(t, fill(root))


def test_all_gather_and_into_tensor(world):
    rank, size = world
    out = [torch.empty(2, 3) for _ in range(size)]
    dist.all_gather(out, fill(rank, 6).view(2, 3))
    for r in range(size):
        assert torch.equal(out[r], fill(r, 6).view(2, 3))
    flat = torch.empty(size * 4)
    dist.all_gather_into_tensor(flat, fill(rank, 4))
    assert torch.equal(flat, torch.cat([fill(r, 4) for r in range(size)]))


def test_reduce_scatter_and_tensor(world):
    rank, size = world
    out = torch.empty(N)
    dist.reduce_scatter(out, [fill(rank + i) for i in range(size)])
    assert torch.equal(out.double(), sum(fill(r + rank, dtype=torch.float64) for r in range(size)))
    x = torch.cat([fill(rank + i, 3) for i in range(size)])
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.MAX)
    assert torch.equal(out, fill(size - 1 + rank, 3))


def test_reduce_leaves_other_ranks_untouched(world):
    rank, size = world
    t = fill(rank)
    dist.reduce(t, dst=size - 1)
    want = per_rank(size).sum(0).float() if rank == size - 1 else fill(rank)
    assert torch.equal(t, want)


def test_gather_and_scatter(world):
    rank, size = world
    out = [torch.empty(N) for _ in range(size)] if rank == 0 else None
    dist.gather(fill(rank), out, dst=0)
    if rank == 0:
        assert all(torch.equal(out[r], fill(r)) for r in range(size))
    got = torch.empty(N)
    dist.scatter(got, [fill(10 + r) for r in range(size)] if rank == size - 1 else None,
                 src=size - 1)
    assert torch.equal(got, fill(10 + rank))


def test_all_to_all(world):
    rank, size = world
    # Rank r sends p + 1 elements of value 100 r + p to rank p.
    outs = [torch.empty(rank + 1) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((p + 1,), 100.0 * rank + p) for p in range(size)])
    for r in range(size):
        assert torch.equal(outs[r], torch.full((rank + 1,), 100.0 * r + rank))


def test_all_to_all_single_even_and_with_splits(world):
    rank, size = world
    out = torch.empty(size * 2)
    dist.all_to_all_single(out, torch.arange(size * 2.0) + 100 * rank)
    want = torch.cat([torch.arange(2.0 * rank, 2.0 * rank + 2) + 100 * r for r in range(size)])
    assert torch.equal(out, want)
    # Rank r sends r + p rows of width 2 to rank p.
    in_splits = [rank + p for p in range(size)]
    out_splits = [r + rank for r in range(size)]
    x = torch.full((sum(in_splits), 2), float(rank))
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, x, out_splits, in_splits)
    assert torch.equal(out, torch.cat([torch.full((r + rank, 2), float(r)) for r in range(size)]))


def test_barrier_and_object_collectives(world):
    rank, size = world
    dist.barrier()
    objs = [{"from": rank}, "two"] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [{"from": 0}, "two"]
    gathered = [None] * size
    dist.all_gather_object(gathered, ("rank", rank))
    assert gathered == [("rank", r) for r in range(size)]


def test_async_future_completed_by_gyre_without_wait(world):
    rank, size = world
    t = fill(rank, 1 << 16)
    done = threading.Event()
    threads = []

    def on_done(fut):
        threads.append(threading.get_ident())
        done.set()
        return fut.value()

    # Rank 0 attaches its callback before the other ranks issue the
    # allreduce (they wait for rank 0's signal, an operation of gyre's own
    # name), so there the future cannot be complete yet.
    if rank != 0:
        gyre.allreduce(torch.ones(1), name="test.future_attached")
    work = dist.all_reduce(t, async_op=True)
    work.get_future().then(on_done)
    if rank == 0:
        gyre.allreduce(torch.ones(1), name="test.future_attached")
    assert done.wait(30), "the future was not completed"
    if rank == 0 and size > 1:
        # Completed on gyre's callback thread, not by a thread of this test.
        assert threads[0] != threading.get_ident()
    assert work.is_completed()
    assert torch.equal(t.double(), per_rank(size, 1 << 16).sum(0))
    assert work.wait()


def poll_until_completed(work, seconds=30.0):
    """work.is_completed() polled, neither wait() nor get_future() called;
    whether it became true within `seconds`."""
    deadline = time.monotonic() + seconds
    while not work.is_completed():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_is_completed_completes_the_work_without_wait(world):
    # wait() completes a Work on the calling thread, and gyre's callback
    # thread only once get_future() (or a callback) asked for it: polling
    # is_completed() alone must still complete the Work, results included.
    # A column of a matrix is not contiguous: its result reaches the
    # caller's tensor only through the Work's completion (a copy).
    rank, size = world
    m = torch.stack([fill(rank, 1 << 12), fill(rank, 1 << 12)], dim=1)
    col = m[:, 1]
    assert not col.is_contiguous()
    work = dist.all_reduce(col, async_op=True)
    assert poll_until_completed(work), "is_completed() never became true"
    assert work.is_success() and work.exception() is None
    assert torch.equal(m[:, 1].double(), per_rank(size, 1 << 12).sum(0))
    assert torch.equal(m[:, 0], fill(rank, 1 << 12))
    assert work.wait()


def test_dropped_work_still_delivers_its_result(world):
    # An async_op Work dropped at once, never waited for: its results still
    # reach the caller's tensors (the Work arms gyre's callbacks when it is
    # collected), in place and through the copy a non-contiguous tensor needs.
    rank, size = world
    t = fill(rank, 1 << 14)
    m = torch.stack([fill(rank, 1 << 12), fill(rank, 1 << 12)], dim=1)
    dist.all_reduce(t, async_op=True)
    dist.all_reduce(m[:, 1], async_op=True)
    dist.barrier()
    want_t = per_rank(size, 1 << 14).sum(0)
    want_col = per_rank(size, 1 << 12).sum(0)
    deadline = time.monotonic() + 30
    while not (torch.equal(t.double(), want_t) and torch.equal(m[:, 1].double(), want_col)):
        assert time.monotonic() < deadline, "a dropped Work's result never arrived"
        time.sleep(0.001)


def test_failed_work_seen_by_is_completed_without_wait(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs two ranks")
    work = dist.all_reduce(torch.ones(3 + rank), async_op=True)
    assert poll_until_completed(work), "is_completed() never became true"
    assert not work.is_success()
    assert isinstance(work.exception(), gyre.MismatchError)
    with pytest.raises(gyre.MismatchError):
        work.wait()


def test_future_asked_for_after_completion_holds_the_outcome(world):
    # A Work makes its torch future only when asked for (a synchronous
    # collective never needs one): a future asked for after wait() completed
    # the Work is done already, with the result or the error, and a callback
    # chained to it runs at once.
    rank, size = world
    t = fill(rank)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait()
    fut = work.get_future()
    assert fut.done()
    assert torch.equal(fut.value()[0].double(), per_rank(size).sum(0))
    seen = []
    work.get_future().then(lambda f: seen.append(f.value()[0].double().sum().item()))
    assert seen == [per_rank(size).sum().item()]
    if size > 1:
        bad = dist.all_reduce(torch.ones(3 + rank), async_op=True)
        with pytest.raises(gyre.MismatchError):
            bad.wait()
        failed = bad.get_future()
        assert failed.done()
        with pytest.raises(gyre.MismatchError, match="ranks disagree on shape"):
            failed.wait()


def test_two_threads_waiting_for_one_work(world):
    # Both return once the collective completes: one completes the Work, the
    # other waits for it (through the future it then makes).
    rank, size = world
    t = fill(rank, 1 << 14)
    # The other ranks issue the allreduce only after rank 0's two threads
    # are waiting for it (they wait for rank 0's signal, an operation of
    # gyre's own name).
    if rank != 0:
        gyre.allreduce(torch.ones(1), name="test.two_waiters")
    work = dist.all_reduce(t, async_op=True)
    results = []
    threads = [threading.Thread(target=lambda: results.append(work.wait())) for _ in range(2)]
    for th in threads:
        th.start()
    if rank == 0:
        gyre.allreduce(torch.ones(1), name="test.two_waiters")
    for th in threads:
        th.join(30)
    assert results == [True, True]
    assert work.is_completed() and work.is_success()
    assert torch.equal(t.double(), per_rank(size, 1 << 14).sum(0))


def test_repeated_calls_are_cache_hits_in_log_depth_rounds(world):
    """The group's calls are named by their number ("torch.<group>.<k>"),
    never twice alike; the runtime's response cache takes a call as the
    next of its group's numbered names, so a call that repeats an earlier
    one's signature travels as one bit, and when every rank's does, the
    round is decided in log depth. Calls of several signatures in turn hit
    too; the results stay right; a mismatch after hits is still named on
    every rank."""
    rank, size = world
    a, b = fill(rank, 5), fill(rank, 9, torch.float64)
    dist.all_reduce(a.clone())  # each signature once, in full
    dist.all_reduce(b.clone())
    dist.broadcast(a.clone(), src=0)
    dist.broadcast(b.clone(), src=0)
    before = gyre.runtime_stats()
    calls = 24
    for i in range(calls):
        x = (a if i % 3 != 2 else b).clone()
        if i % 4 == 3:
            dist.broadcast(x, src=0)
            assert torch.equal(x, fill(0, x.numel(), x.dtype))
        else:
            dist.all_reduce(x)
            assert torch.equal(x, per_rank(size, x.numel()).sum(0).to(x.dtype))
    after = gyre.runtime_stats()
    hits = after["cache_hits_sent"] - before["cache_hits_sent"]
    full = after["requests_sent"] - before["requests_sent"]
    assert hits == calls and full == 0, (hits, full)
    if size > 1:
        log_depth = after["log_depth_rounds"] - before["log_depth_rounds"]
        assert log_depth >= calls, (log_depth, calls)
        # One rank's call differs in shape from the cached one: a MismatchError on every rank.
        with pytest.raises(gyre.MismatchError, match="torch"):
            dist.all_reduce(fill(rank, 5 if rank else 6))
    dist.barrier()  # the group is still usable


def test_shape_mismatch_raises_on_every_rank(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs two ranks")
    work = dist.all_reduce(torch.ones(3 + rank), async_op=True)
    with pytest.raises(gyre.MismatchError):
        work.wait()
    assert not work.is_success()


def test_different_collectives_raise_on_every_rank(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs two ranks")
    with pytest.raises(gyre.MismatchError, match="disagree on collective"):
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.broadcast(torch.ones(4), src=0)


def test_refusal_on_one_rank_raises_on_every_rank(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs two ranks")
    # Rank 0 passes too short an output list: torch lets it through, gyre
    # refuses it there and announces the refusal to the other ranks.
    out = [torch.empty(N) for _ in range(size - (1 if rank == 0 else 0))]
    with pytest.raises(gyre.InvalidArgumentError, match="output list"):
        dist.all_gather(out, fill(rank))
    dist.barrier()  # the group is still usable


def test_unsupported_op_is_refused(world):
    with pytest.raises(gyre.InvalidArgumentError, match="BAND"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)


def test_rank_or_world_size_that_disagree_with_mpirun(world):
    rank, size = world
    with pytest.raises(ValueError, match="world_size=.* the job has"):
        _launch.check_launch(world_size=size + 1)
    if size > 1:
        with pytest.raises(ValueError, match="rank=.* this process is rank"):
            _launch.check_launch(rank=(rank + 1) % size)


def test_gyre_rendezvous_checks_given_rank_and_world_size(world):
    rank, size = world
    # What init_process_group("gyre", rank=..., world_size=...) runs first.
    with pytest.raises(ValueError, match=f"world_size={size + 2} was given"):
        next(dist.rendezvous("gyre://", rank=rank, world_size=size + 2))


@pytest.mark.skipif(gyre.bootstrap.starts_from_pmi(),
                    reason="this build (MPICH) starts under torchrun: scripts/launch.sh tests that")
def test_started_by_torchrun_gets_one_clear_error():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "PMIX_", "MPI_", "HYDRA"))}
    env.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    script = ("import torch.distributed as dist, gyre.torch.distributed\n"
              "dist.init_process_group('gyre')\n")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "not started by an MPI launcher" in p.stderr and "mpirun -np" in p.stderr
