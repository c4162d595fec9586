"""The lower bound of an elastic job from Python (no torch: numpy arrays),
under an MPI with ULFM and `mpirun --with-ft ulfm -np 3 -x GYRE_ELASTIC_MIN_NP=3`
(run by run_respawn.sh): rank GYRE_TEST_KILL_RANK (default 1) SIGKILLs itself
at step 3; each survivor sees RankFailedError, and gyre.rebuild() (what
gyre.torch.elastic.run calls) must raise StateError naming the ranks left
and the bound. Prints "elastic: rank N ENDED: <message>" and exits with 3."""
import os
import signal
import sys

import numpy as np

import gyre

KILL_STEP = 3


def fail(msg):
    print(f"elastic: rank {start_rank} FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


gyre.init()
start_rank = gyre.rank()
kill_rank = int(os.environ.get("GYRE_TEST_KILL_RANK", "1"))
if not gyre.elastic_enabled():
    fail("needs a ULFM build run with mpirun --with-ft ulfm")
for step in range(10):
    if start_rank == kill_rank and step == KILL_STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        total = gyre.allreduce(np.full(1 << 16, start_rank + 1.0), op=gyre.Sum, name="x")
        if total[0] != 6.0:
            fail(f"step {step}: sum {total[0]}, expected 6")
        gyre.commit_step()
    except gyre.RankFailedError:
        try:
            info = gyre.rebuild()
        except gyre.StateError as e:
            print(f"elastic: rank {start_rank} ENDED: {e}", flush=True)
            sys.exit(3)
        fail(f"rebuild() went on with {info['size']} ranks below GYRE_ELASTIC_MIN_NP")
fail("no failure was seen")
