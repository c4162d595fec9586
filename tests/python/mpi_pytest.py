"""Runs pytest on one rank of an mpirun job:

    mpirun -np 2 python tests/python/mpi_pytest.py tests/python

Every rank runs the same tests in the same order (the collectives need it).
Rank 0 reports as usual; other ranks write their report to a log and print it
only if they fail, so the output shows one closing line ("N passed") plus
the report of any rank that failed. The exit status is pytest's, except that
"no tests collected" (pytest's 5) is a failure; mpirun then fails if any rank
failed.
"""

import io
import os
import sys

import pytest


def _rank():
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def main():
    rank = _rank()
    args = sys.argv[1:]
    real_stdout = sys.stdout
    log = None
    if rank != 0:
        # pytest's terminal reporter writes to sys.stdout as it is when the
        # session starts; runtime logs and timeout stack dumps still go to
        # the real stderr.
        log = io.StringIO()
        sys.stdout = log
    try:
        status = pytest.main(args)
    finally:
        sys.stdout = real_stdout
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"rank {rank}: pytest collected no tests; failing the run", file=sys.stderr)
        status = 1
    if log is not None and status != 0:
        print(f"===== pytest report of rank {rank} (exit status {int(status)}) =====")
        print(log.getvalue())
    sys.stdout.flush()
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
