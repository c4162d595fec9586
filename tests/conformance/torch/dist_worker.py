"""One rank of a job of torch's backend suite (DistributedTest._DistTestBase).

Started by run_suite.py under mpirun, one process per rank. Every rank runs
the same list of test methods in the same order, on one default process
group for the whole job (re-created only when a test destroyed it). It
stands in for torch's stock runner (TestDistBackend in distributed_test.py,
which forks its ranks): the environment the tests read (BACKEND,
WORLD_SIZE, TEMP_DIR with barrier/ and test_dir/ for the file-based
``_barrier``, INIT_METHOD) and the attributes they use (``self.rank``,
``self.world_size``, ``self.file_name``).

After each test every rank writes its outcome to <results>/<index>.<rank>
and waits (on files, not on the backend) for the others' outcomes. Where any
rank failed, the ranks' collective state may be out of step, so every rank
leaves the job (exit 3) and run_suite.py starts a new one with the tests
that remain. A hang is ended by run_suite.py's per-test timeout.

Usage (set by run_suite.py): dist_worker.py BACKEND RESULTS_DIR TEST...
"""

import json
import os
import sys
import time
import traceback
import unittest
from datetime import timedelta

def _rank_and_size():
    for prefix in ("OMPI_COMM_WORLD_", "PMI_", "PMIX_"):
        rank = os.environ.get(prefix + "RANK")
        size = os.environ.get(prefix + "SIZE")
        if rank is not None and size is not None:
            return int(rank), int(size)
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _groups_on(backend, dist):
    """Makes init_process_group and new_group create `backend` groups where
    the suite asks for gloo (by keyword or position)."""
    import torch.distributed.distributed_c10d as c10d  # noqa: PLC0415

    def redirect(fn, position):
        def wrapped(*args, **kwargs):
            if str(kwargs.get("backend", "")).lower() == "gloo":
                kwargs["backend"] = backend
            if len(args) > position and str(args[position]).lower() == "gloo":
                args = args[:position] + (backend,) + args[position + 1:]
            return fn(*args, **kwargs)
        wrapped.__wrapped__ = fn
        return wrapped

    c10d.init_process_group = dist.init_process_group = redirect(c10d.init_process_group, 0)
    c10d.new_group = dist.new_group = redirect(c10d.new_group, 2)


def _wait_for_files(paths, timeout_s):
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)  # polling files: the backend may be the thing that is broken
        delay = min(delay * 2, 0.1)
    return True


def _write_atomic(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    backend, results, tests = sys.argv[1], sys.argv[2], sys.argv[3:]
    rank, size = _rank_and_size()
    base_tmp = os.environ["GYRE_CONFORMANCE_TMP"]
    # The suite is written per backend name: DistTestCases' tables and
    # `BACKEND != "gloo"` gates at import, `if BACKEND == "gloo":` code paths
    # in the test bodies. gyre is a drop-in for gloo, so the suite runs as
    # written for gloo, with every process group it creates for "gloo" made
    # on gyre (_groups_on below): what it checks, it checks on gyre.
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(size), RANK=str(rank))
    os.environ["INIT_METHOD"] = "gyre://" if backend == "gyre" else "env://"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")

    import torch.distributed as dist  # noqa: PLC0415 - after the environment is set
    if backend == "gyre":
        import gyre.torch.distributed  # noqa: F401, PLC0415 - registers the backend
    from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: PLC0415
    from torch.testing._internal.common_utils import TestCase  # noqa: PLC0415
    from torch.testing._internal.distributed import distributed_test as dt  # noqa: PLC0415

    if backend != "gloo":
        _groups_on(backend, dist)
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}

    class Case(dt.DistributedTest._DistTestBase, TestCase):
        @property
        def world_size(self):
            return os.environ["WORLD_SIZE"]

        @property
        def init_method(self):
            return os.environ["INIT_METHOD"]

        @property
        def destroy_pg_upon_exit(self):
            return False

    def init_default_group(names):
        seconds = max([dt.default_pg_timeout] + [dt.CUSTOM_PG_TIMEOUT.get(n, 0) for n in names])
        dist.init_process_group(backend=backend, init_method=os.environ["INIT_METHOD"],
                                world_size=size, rank=rank, timeout=timedelta(seconds=seconds))

    def run_one(index, name):
        """Runs one test method on this rank: (outcome, detail)."""
        temp = os.path.join(base_tmp, f"t{index}")
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(temp, sub), exist_ok=True)
        os.environ["TEMP_DIR"] = temp
        dt.Barrier.barrier_id = 0
        case = Case(name)
        case.rank = rank
        case.file_name = os.path.join(temp, "init_dir", "shared_init_file")
        method = getattr(case, name)
        fn = getattr(method, "__func__", method)
        if getattr(fn, "__unittest_skip__", False):
            return "skip", str(getattr(fn, "__unittest_skip_why__", ""))
        if not dist.is_initialized():
            init_default_group([name])
        try:
            TestCase.setUp(case)
            case._barrier()
            fn(case)
            case._barrier()
        except unittest.SkipTest as e:
            return "skip", str(e)
        except SystemExit as e:
            if e.code in skip_codes:
                return "skip", skip_codes[e.code]
            return "fail", f"SystemExit({e.code})"
        except BaseException:  # noqa: BLE001 - the test's failure is its outcome
            return "fail", traceback.format_exc(limit=6)[-3000:]
        return "pass", ""

    init_default_group(tests)
    for index, name in enumerate(tests):
        start = time.monotonic()
        outcome, detail = run_one(index, name)
        record = {"test": name, "rank": rank, "outcome": outcome, "detail": detail,
                  "seconds": round(time.monotonic() - start, 2)}
        _write_atomic(os.path.join(results, f"{name}.{rank}"), json.dumps(record))
        peers = [os.path.join(results, f"{name}.{r}") for r in range(size)]
        if not _wait_for_files(peers, float(os.environ.get("GYRE_CONFORMANCE_PEER_WAIT_S", 60))):
            os._exit(4)  # a peer is stuck in the test: run_suite.py ends the job
        outcomes = []
        for p in peers:
            with open(p) as f:
                outcomes.append(json.load(f)["outcome"])
        if "fail" in outcomes:
            sys.stdout.flush()
            os._exit(3)  # the ranks' collective state may be out of step: a new job
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
