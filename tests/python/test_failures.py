"""Failures that must reach every rank at once, and waits that must end:
init() failing on one rank fails it on every rank with that rank's number
and reason; Ctrl-C interrupts init(), barrier(), join(), fingerprint_check()
and resync() as it does synchronize(); an operation one rank never calls ends
at the stall deadline; the timeline file's safety and size limit; a
rank-local fact (overlapping buffers) refused at enqueue on every rank.

Each test that changes options or leaves an operation in flight shuts gyre
down and starts it again on every rank, so the next test starts afresh
(internal names, pending operations). Ranks that must wait for rank 0
without taking part in its operation wait for a file it writes (they share
the host's /tmp), polled with a deadline.
"""

import contextlib
import json
import os
import signal
import stat
import threading
import time

import pytest
import torch

import gyre


def _marker(name):
    # Names unique to the job: its ranks on this host share their parent
    # (the launcher daemon), and no other job does.
    return f"/tmp/gyre-test-failures-{os.getppid()}-{name}"


_written = []  # markers this rank wrote, removed once every rank is past them


def _signal_done(name):
    with open(_marker(name), "w") as f:
        f.write("done")
    _written.append(_marker(name))


def _wait_done(name, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(_marker(name)):
        assert time.monotonic() < deadline, f"rank 0 did not finish '{name}' in {timeout} s"
        time.sleep(0.01)


@contextlib.contextmanager
def _restarted(env=None, on_ranks=None):
    """Shuts gyre down, sets `env` on `on_ranks` (all when None), yields, then
    restores the environment and leaves gyre running with the default
    options again."""
    rank, size = gyre.rank(), gyre.size()
    # Every rank has finished the tests before: a shutdown stops every
    # rank's runtime, also under a rank still in a test of its own.
    gyre.barrier()
    gyre.shutdown()
    env = env or {}
    saved = {k: os.environ.get(k) for k in env}
    if on_ranks is None or rank in on_ranks:
        os.environ.update(env)
    try:
        yield rank, size
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if gyre.is_initialized():
            gyre.shutdown()
        gyre.init()
        # init() is collective: every rank has stopped waiting for the markers.
        while _written:
            os.remove(_written.pop())


def _init_fails_everywhere(match, cls=gyre.InvalidArgumentError):
    t0 = time.monotonic()
    with pytest.raises(cls, match=match):
        gyre.init()
    elapsed = time.monotonic() - t0
    assert not gyre.is_initialized()
    # Before, the other ranks waited for the start-up deadline (60 s) or
    # forever; the agreement takes one exchange.
    assert elapsed < 15, f"init() took {elapsed:.1f} s to fail"


def test_bad_variable_on_one_rank_fails_init_on_every_rank(multi_rank):
    last = gyre.size() - 1
    with _restarted({"GYRE_CYCLE_TIME_MS": "fast"}, on_ranks=[last]):
        _init_fails_everywhere(rf"init\(\) failed on rank {last}: GYRE_CYCLE_TIME_MS='fast' is "
                               r"not a number")
    assert gyre.allreduce(torch.ones(2), op=gyre.Sum, name="after_bad_variable").tolist() == \
        [gyre.size()] * 2


def test_timeline_that_cannot_be_created_fails_init_on_every_rank(multi_rank):
    last = gyre.size() - 1
    with _restarted({"GYRE_TIMELINE": "/nonexistent-gyre-dir/t{rank}.json"}, on_ranks=[last]):
        _init_fails_everywhere(rf"init\(\) failed on rank {last}: GYRE_TIMELINE: cannot create "
                               rf"the timeline file '/nonexistent-gyre-dir/t{last}.json'")
    assert gyre.allreduce(torch.ones(1), op=gyre.Sum, name="after_bad_timeline").item() == \
        gyre.size()


def test_failures_on_several_ranks_are_all_named(multi_rank):
    with _restarted({"GYRE_SPIN_WAIT_US": "-1"}, on_ranks=[0, 1]):
        _init_fails_everywhere(r"init\(\) failed on ranks 0, 1: rank 0: GYRE_SPIN_WAIT_US='-1' .*; "
                               r"rank 1: GYRE_SPIN_WAIT_US='-1'")


# --- Ctrl-C and deadlines of the blocking calls -----------------------------

def _raw_call(what):
    """The binding's blocking call itself (no Python-level wrapper)."""
    from gyre import _gyre
    t = torch.ones(4)
    if what == "barrier":
        _gyre.barrier()
    elif what == "join":
        _gyre.join()
    elif what == "fingerprint_check":
        _gyre.fingerprint_check([("w", t)])
    else:
        _gyre.resync([("w", t)], "newest")


@pytest.mark.parametrize("what", ["barrier", "join", "fingerprint_check", "resync"])
def test_ctrl_c_interrupts_a_blocking_call(multi_rank, what):
    """Rank 0 calls `what`, which the other ranks never call; SIGINT after
    0.3 s raises KeyboardInterrupt at once (the wait is sliced as
    synchronize()'s), the call's operation staying in flight."""
    with _restarted() as (rank, size):
        gyre.init()
        if rank == 0:
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    _raw_call(what)
                late = time.monotonic() - t0 - 0.3
            finally:
                timer.join()
            _signal_done(f"ctrl_c_{what}")
            # ~50 ms by design; generous for a loaded machine.
            assert late < 2.0, f"KeyboardInterrupt came {late:.2f} s after SIGINT"
        else:
            _wait_done(f"ctrl_c_{what}")


def test_ctrl_c_interrupts_init_waiting_for_the_other_ranks(multi_rank):
    """Rank 0 calls init() while the other ranks do not (yet): SIGINT raises
    KeyboardInterrupt at once. What init() left pending is resumed by rank
    0's next init(), which pairs with the others' when they call it."""
    with _restarted() as (rank, size):
        if rank == 0:
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    gyre.init()
                late = time.monotonic() - t0 - 0.3
            finally:
                timer.join()
            assert not gyre.is_initialized()
            _signal_done("ctrl_c_init")
            assert late < 2.0, f"KeyboardInterrupt came {late:.2f} s after SIGINT"
        else:
            _wait_done("ctrl_c_init")
    # _restarted's init() on every rank: the ranks pair up again.
    assert gyre.allreduce(torch.ones(1), op=gyre.Sum, name="after_ctrl_c_init").item() == \
        gyre.size()


@pytest.mark.parametrize("what", ["barrier", "fingerprint_check", "resync"])
def test_operation_one_rank_never_calls_ends_at_the_stall_deadline(multi_rank, what):
    with _restarted({"GYRE_STALL_SHUTDOWN_S": "1"}) as (rank, size):
        gyre.init()
        if rank == 0:
            t0 = time.monotonic()
            with pytest.raises(gyre.TimeoutError, match="never"):
                _raw_call(what)
            elapsed = time.monotonic() - t0
            _signal_done(f"stall_{what}")
            assert elapsed < 15, f"{what} took {elapsed:.1f} s to time out"
        else:
            _wait_done(f"stall_{what}")


# --- the timeline file ------------------------------------------------------

def test_timeline_refuses_a_symlink_at_its_path(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    link = tmp_path / f"timeline{gyre.rank()}.json"
    link.symlink_to(target)
    with pytest.raises(gyre.InvalidArgumentError, match=f"'{link}'.*symbolic link"):
        gyre.start_timeline(str(tmp_path / "timeline{rank}.json"))
    assert target.read_text() == "keep me"


def test_symlink_at_the_timeline_path_fails_init_on_every_rank(multi_rank, tmp_path):
    last = gyre.size() - 1
    rank = gyre.rank()
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    link = tmp_path / f"t{rank}.json"
    link.symlink_to(target)
    with _restarted({"GYRE_TIMELINE": str(tmp_path / "t{rank}.json")}, on_ranks=[last]):
        _init_fails_everywhere(rf"init\(\) failed on rank {last}: .*symbolic link")
    assert target.read_text() == "keep me"


def test_timeline_file_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        gyre.start_timeline(str(tmp_path / "umask{rank}.json"))
        gyre.stop_timeline()
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(tmp_path / f"umask{gyre.rank()}.json").st_mode)
    assert mode == 0o640, oct(mode)


def test_timeline_stops_at_its_size_limit(capfd, tmp_path):
    limit = 4096
    with _restarted({"GYRE_TIMELINE_MAX_BYTES": str(limit)}) as (rank, size):
        gyre.init()
        path = tmp_path / f"limited{rank}.json"
        gyre.start_timeline(str(tmp_path / "limited{rank}.json"))
        for i in range(60):
            gyre.allreduce(torch.ones(3), op=gyre.Sum, name=f"timeline_limit_{i}")
        gyre.stop_timeline()
        data = path.read_bytes()
        assert len(data) <= limit
        events = json.loads(data)["traceEvents"]
        # Far fewer than the ~5 events per allreduce the recording would hold.
        assert 0 < len(events) < 60
        err = capfd.readouterr().err
        assert err.count("GYRE_TIMELINE_MAX_BYTES") == 1, err
        assert "recording stopped" in err


# --- rank-local facts checked at enqueue ------------------------------------

def test_partly_overlapping_buffers_are_refused_on_every_rank(multi_rank):
    """Where the buffers lie is known on one rank only: refused at enqueue
    (and announced), not inside the collective on that rank alone while the
    others wait in it."""
    from gyre import _gyre
    sum_op = 0  # ReduceOp::kSum
    if gyre.rank() == 0:
        buf = torch.arange(8, dtype=torch.float32)
        with pytest.raises(gyre.InvalidArgumentError, match="input and output overlap"):
            _gyre.allreduce("partly_overlapping", buf[0:4], buf[2:6], sum_op, 1.0, 1.0)
    else:
        t0 = time.monotonic()
        op = _gyre.allreduce("partly_overlapping", torch.ones(4), None, sum_op, 1.0, 1.0)
        with pytest.raises(gyre.InvalidArgumentError,
                           match="failed on rank 0: .*input and output overlap"):
            op.wait()
        assert time.monotonic() - t0 < 10
    # The ranks are still in step.
    assert gyre.allreduce(torch.ones(1), op=gyre.Sum, name="after_overlap").item() == gyre.size()
