"""init() and shutdown() as Horovod defines them: init() may be called any
number of times (later calls do nothing) and again after shutdown(), which
stops gyre but leaves MPI initialised (MPI is finalised at process exit)."""

import os
import subprocess
import sys

import pytest
import torch

import gyre
import gyre.torch as hvd


def test_init_again_does_nothing(size, rank):
    assert gyre.is_initialized()
    steps = gyre.committed_steps()
    gyre.init()
    hvd.init()
    assert gyre.is_initialized() and hvd.is_initialized()
    assert (gyre.rank(), gyre.size()) == (rank, size)
    assert gyre.committed_steps() == steps  # the same runtime, not a new one
    assert gyre.allreduce(torch.ones(2), op=gyre.Sum).tolist() == [size, size]


def test_init_after_shutdown_runs_a_new_runtime(size, rank):
    gyre.commit_step()
    assert gyre.allreduce(torch.full((3,), 1.0 + rank), op=gyre.Sum, name="before").tolist() == \
        [size * (size + 1) / 2] * 3
    hvd.shutdown()
    assert not gyre.is_initialized()
    with pytest.raises(gyre.StateError, match="not initialised"):
        gyre.rank()
    hvd.shutdown()  # shutting down again does nothing, as in Horovod
    hvd.init()
    assert gyre.is_initialized()
    assert (gyre.rank(), gyre.size()) == (rank, size)
    assert gyre.committed_steps() == 0  # a new runtime: a new version vector
    out = gyre.allreduce(torch.full((3,), 10.0 * (rank + 1)), op=gyre.Average, name="after")
    assert out.tolist() == [5.0 * (size + 1)] * 3
    # Generated names start again on every rank alike.
    assert gyre.allgather(torch.full((1,), float(rank))).tolist() == [float(r) for r in range(size)]


def test_lifecycle_in_a_process_of_its_own():
    """A single-rank job of its own (MPI singleton): is_initialized before and
    after each call, init twice, init after shutdown, and a clean exit that
    finalises MPI."""
    code = (
        "import torch, gyre.torch as hvd\n"
        "log = [hvd.is_initialized()]\n"
        "hvd.init(); hvd.init()\n"
        "log.append(hvd.is_initialized())\n"
        "log.append(hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist())\n"
        "hvd.shutdown()\n"
        "log.append(hvd.is_initialized())\n"
        "hvd.init()\n"
        "log.append(hvd.is_initialized())\n"
        "log.append(hvd.allreduce(torch.full((2,), 3.0)).tolist())\n"
        "hvd.shutdown()\n"
        "hvd.init()\n"  # left initialised: stopped at exit
        "print(log)\n"
    )
    # Without the launcher's variables the child is an MPI singleton rather
    # than a second process claiming this rank's place in the job.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "HYDRA_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == \
        "[False, True, [1.0, 1.0], False, True, [3.0, 3.0]]", out.stdout + out.stderr
