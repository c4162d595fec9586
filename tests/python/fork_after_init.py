"""fork() after init(): the child is a process in which gyre is not
initialised (is_initialized() is False, calls raise StateError naming the
fork, init() is refused), and its ordinary exit (interpreter shutdown, C
atexit handlers) neither joins the parent's background thread nor finalises
the parent's MPI. The parent goes on: an allreduce after the child's exit,
then a clean end of the job.

    mpirun -np 2 python tests/python/fork_after_init.py

Exits non-zero (naming what went wrong) on any failure; the child gets
20 s to exit before the parent kills it and fails.
"""

import os
import signal
import sys
import time

import torch

import gyre


def child():
    problems = []
    if gyre.is_initialized():
        problems.append("is_initialized() is True in the child")
    try:
        gyre.rank()
        problems.append("rank() did not raise in the child")
    except gyre.StateError as e:
        if "fork" not in str(e):
            problems.append(f"rank() raised without naming the fork: {e}")
    try:
        gyre.allreduce(torch.ones(1))
        problems.append("allreduce() did not raise in the child")
    except gyre.StateError:
        pass
    try:
        gyre.init()
        problems.append("init() did not raise in the child")
    except gyre.StateError as e:
        if "fork" not in str(e):
            problems.append(f"init() raised without naming the fork: {e}")
    for p in problems:
        print(f"child of rank {rank}: {p}", file=sys.stderr)
    sys.stderr.flush()
    # An ordinary exit: Python's atexit (gyre.shutdown), then the C atexit
    # handlers (gyre's: stop the runtime, finalise MPI).
    sys.exit(3 if problems else 0)


gyre.init()
rank, size = gyre.rank(), gyre.size()
assert gyre.allreduce(torch.ones(2), op=gyre.Sum, name="before").tolist() == [size] * 2

pid = os.fork()
if pid == 0:
    child()

deadline = time.monotonic() + 20
status = None
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.02)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print(f"rank {rank}: the forked child did not exit within 20 s (hung in its exit?)",
          file=sys.stderr)
    sys.exit(1)
if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
    print(f"rank {rank}: the forked child ended with status {status:#x}", file=sys.stderr)
    sys.exit(1)

# The parent's runtime is untouched by the child's life and death.
assert gyre.is_initialized()
out = gyre.allreduce(torch.full((3,), float(rank)), op=gyre.Sum, name="after")
assert out.tolist() == [size * (size - 1) / 2] * 3, out
gyre.barrier()
print(f"rank {rank}: fork after init: child exited cleanly, parent went on")
