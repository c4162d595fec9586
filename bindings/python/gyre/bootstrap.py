"""How a gyre world comes to exist when no MPI launcher started the job.

Under mpirun/mpiexec (or srun with PMI) MPI knows the job: nothing here
runs. A process started by torchrun, a Kubernetes PyTorchJob, Lightning or
any launcher with torch's environment contract (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, a TCP store) is started through MPI's own
bootstrap protocol instead: rank 0 runs a PMI-1 server on a native thread
(gyre/bootstrap.h), publishes its address through the launcher's store, and
every process sets ``PMI_PORT``, ``PMI_ID`` and ``PMI_SIZE`` before
``MPI_Init``. The result is an ordinary MPI world of ``WORLD_SIZE``
processes (shared memory within a host, the network between hosts), so
every gyre feature works as under mpirun.

This needs gyre built against an MPI with MPICH's PMI-1 client (the
``mpich`` package of the Python package registry: docs/launch.md); Open
MPI starts only from its own launcher, and gyre says so.
"""

import os
import socket
from datetime import timedelta
from typing import Any, Optional, Tuple

from . import _gyre
from .exceptions import StateError

# Variables an MPI launcher sets in every process it starts (Open MPI, MPICH
# and Hydra, PMIx launchers, Slurm's srun with PMI).
MPI_LAUNCH_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")

# The launcher's store must hold this process's references for the life of
# the process (a TCPStore server made here serves its peers until exit).
_kept: list = []


def under_mpi_launcher() -> bool:
    return any(v in os.environ for v in MPI_LAUNCH_VARS)


def launcher_world() -> Optional[Tuple[int, int]]:
    """(rank, world size) from torch's launch contract when a launcher other
    than MPI's started this process as one of several; None otherwise."""
    if under_mpi_launcher():
        return None
    try:
        size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
    except ValueError as e:
        raise StateError(f"gyre: RANK/WORLD_SIZE in the environment are not integers ({e})")
    if size <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    if not 0 <= rank < size:
        raise StateError(f"gyre: RANK={rank} is not within WORLD_SIZE={size}")
    return rank, size


def starts_from_pmi() -> bool:
    """Whether the MPI gyre was built against starts from a PMI-1 server."""
    version = _gyre.mpi_library_version()
    return "MPICH" in version or "Intel(R) MPI" in version


def _store_from_environment(rank: int, size: int, timeout: timedelta) -> Any:
    """A client of the launcher's TCP store (torchrun's agent hosts it), or
    the store itself on rank 0 when the launcher has none (MASTER_ADDR and
    MASTER_PORT set by hand or by Lightning): torch's env:// rendezvous."""
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise StateError(
            f"gyre: started by a launcher other than MPI's (WORLD_SIZE={size}) without "
            f"{' and '.join(missing)}: set them (torchrun does), or launch with mpiexec")
    import torch.distributed as dist  # the launcher's store is torch's
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=size, timeout=timeout))
    return store


def _address_towards(host: str) -> str:
    """This host's address on the interface that reaches `host` (no packet
    is sent: a UDP socket's connect only picks the route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def refuse_if_cannot_start() -> None:
    """Raises StateError, saying how to launch instead, when a launcher other
    than MPI's started this process as one of several and the MPI gyre is
    built against cannot start from a PMI server (Open MPI)."""
    world = launcher_world()
    if world is None or starts_from_pmi():
        return
    size = world[1]
    raise StateError(
        f"gyre.init(): this process was not started by an MPI launcher (none of "
        f"{'/'.join(MPI_LAUNCH_VARS)} is set; torchrun or similar: WORLD_SIZE={size}), and gyre "
        f"is built against {_gyre.mpi_library_version().splitlines()[0].strip()}, which starts "
        f"only from its own launcher. Either launch with mpirun (e.g. `mpirun -np {size} "
        f"python train.py`), or build gyre against MPICH from the package registry "
        f"(`pip install mpich` then `pip install .`: docs/launch.md), which torchrun can start")


def start_from_launcher(store: Any = None, timeout: Optional[timedelta] = None) -> bool:
    """Prepares this process's MPI_Init when a launcher other than MPI's
    started it as one of several (launcher_world()); returns whether it did.
    Once done, PMI_SIZE is set, so launcher_world() and later calls see an
    MPI launch and do nothing.

    `store`: a torch.distributed Store shared by the processes (what
    init_process_group hands a backend); without one, the launcher's, from
    MASTER_ADDR/MASTER_PORT. Call before gyre.init(); gyre.init() and the
    gyre backend of torch.distributed call it themselves."""
    world = launcher_world()
    if world is None or _gyre.is_initialized():
        return False
    rank, size = world
    refuse_if_cannot_start()
    timeout = timeout or timedelta(seconds=float(os.environ.get("GYRE_START_TIMEOUT_S", "300")))
    if store is None:
        store = _store_from_environment(rank, size, timeout)
    _kept.append(store)
    # One key per launch attempt: torchrun's agent store outlives restarts.
    key = "gyre/pmi/{}/{}".format(os.environ.get("TORCHELASTIC_RUN_ID", "-"),
                                  os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0:
        port = _gyre.start_pmi_server(size, "0.0.0.0", 0, timeout.total_seconds())
        host = _address_towards(os.environ.get("MASTER_ADDR", "127.0.0.1"))
        store.set(key, f"{host}:{port}")
    address = store.get(key).decode()
    os.environ.update({"PMI_PORT": address, "PMI_ID": str(rank), "PMI_SIZE": str(size),
                       "PMI_RANK": str(rank)})
    return True
