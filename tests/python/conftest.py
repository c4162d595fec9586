"""Shared set-up of the Python tests: gyre is initialised once per process
(MPI cannot be initialised again after finalize) and shut down at exit.
Run under mpirun through mpi_pytest.py; a plain `pytest` runs them on one rank.
"""

import numpy as np
import pytest
import torch

import gyre

# Several ranks share two cores: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def gyre_runtime():
    if not gyre.is_initialized():
        gyre.init()
    yield
    # Every rank reaches the end of the session before anyone finalises.
    gyre.barrier()


@pytest.fixture(scope="module")
def world():
    """The default torch.distributed group on the gyre backend: (rank, size)."""
    import torch.distributed as dist

    import gyre.torch.distributed  # noqa: F401 (registers the backend)

    if not dist.is_initialized():
        dist.init_process_group("gyre")
    assert dist.get_backend() == "gyre"
    return dist.get_rank(), dist.get_world_size()


@pytest.fixture
def rank():
    return gyre.rank()


@pytest.fixture
def size():
    return gyre.size()


@pytest.fixture
def multi_rank(size):
    """For tests about disagreement between ranks: meaningless on one rank."""
    if size < 2:
        pytest.skip("needs at least 2 ranks (run under mpirun)")


def rank_data(r, shape, dtype, seed=0):
    """Rank r's deterministic test input: any rank can compute every rank's,
    so references need no communication."""
    rng = np.random.default_rng(1000 * seed + r)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-5, 6, size=shape).astype(dtype) if np.issubdtype(dtype, np.signedinteger) \
            else rng.integers(0, 6, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
