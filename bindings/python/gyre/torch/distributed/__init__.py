"""The "gyre" backend for torch.distributed: importing this module registers it.

A DDP script switches from gloo by changing one string, plus this import::

    import torch.distributed as dist
    import gyre.torch.distributed  # noqa: F401 (registers the backend)

    dist.init_process_group("gyre")  # was "gloo"
    model = torch.nn.parallel.DistributedDataParallel(model)

Run it with mpirun (``mpirun -np 4 python train.py``): rank and world size
come from the MPI job, no MASTER_ADDR, store or rank arguments are needed
(given ones must agree). docs/torch-distributed.md lists every
torch.distributed call and how it runs here.

Importing also makes ``dist.init_process_group`` default ``init_method`` to
"gyre://" for the gyre backend (torch would otherwise use "env://", which
needs MASTER_ADDR); import this module before binding init_process_group to
another name (``from torch.distributed import init_process_group``), or pass
``init_method="gyre://"``.
"""

from datetime import timedelta
from typing import Any, List

import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d

import gyre
from gyre.torch.consistency import check_consistency

from . import _launch
from ._process_group import GyreProcessGroup
from ._work import GyreWork

_groups_created = 0


def _create_process_group(store: Any, rank: int, size: int, timeout: timedelta) -> GyreProcessGroup:
    """torch's creator for the gyre backend (the default group and new_group)."""
    global _groups_created
    del store, timeout  # gyre's own negotiation and stall timeout take their place
    _launch.check_launch()
    why = _launch.default_world(rank, size)
    if why is not None:
        raise ValueError(why)
    # Groups are created in the same order on every rank (new_group is
    # collective), so the counter names a group alike everywhere.
    tag = f"g{_groups_created}"
    _groups_created += 1
    return GyreProcessGroup(rank, size, tag)


def _register() -> None:
    if "GYRE" not in dist.Backend._plugins:
        dist.Backend.register_backend("gyre", _create_process_group, devices=["cpu"])
    _launch.register_rendezvous()
    wrapped = _launch.wrap_init_process_group(_c10d.init_process_group)
    _c10d.init_process_group = wrapped
    dist.init_process_group = wrapped


_register()

__all__: List[str] = ["GyreProcessGroup", "GyreWork", "check_consistency"]
