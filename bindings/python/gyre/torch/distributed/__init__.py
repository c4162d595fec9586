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
from gyre import _gyre
from gyre.torch.consistency import check_consistency

from . import _launch
from ._ddp_hooks import BucketNames, allreduce_hook
from ._process_group import GyreProcessGroup
from ._work import GyreWork

# Groups created so far on each gyre process set (by id).
_groups_created = {}


def _create_process_group(opts: Any, backend_options: Any = None) -> GyreProcessGroup:
    """torch's creator for the gyre backend (the default group and new_group),
    called on the group's members only (torch's extended API, which gives the
    group's world ranks). A subgroup runs on a gyre process set of its ranks
    made by its members alone (torch calls new_group on a parent group's
    members only, e.g. new_subgroups(group=...)), shared by the torch groups
    of the same ranks while they live."""
    del backend_options  # gyre negotiates by itself; the timeout comes in opts
    rank, size = opts.group_rank, opts.group_size
    ranks = sorted(int(r) for r in (opts.global_ranks_in_group or []))
    _launch.check_launch(store=getattr(opts, "store", None))
    timeout = getattr(opts, "timeout", None)
    process_set = gyre.global_process_set
    if ranks and ranks != list(range(gyre.size())):
        key = tuple(ranks)
        process_set = _subgroup_sets.get(key)
        if process_set is None or process_set.process_set_id is None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
            process_set = gyre.add_process_set(list(ranks), members_only=True,
                                               timeout=seconds if seconds and seconds > 0 else None)
            _subgroup_sets[key] = process_set
        if size != len(ranks) or rank != process_set.rank():
            raise ValueError(
                f"the gyre backend: torch gave this process rank {rank} of {size} in the group "
                f"of ranks {ranks}; gyre has it as rank {process_set.rank()} of {len(ranks)}")
        _live_groups[key] = _live_groups.get(key, 0) + 1
    else:
        why = _launch.default_world(rank, size)
        if why is not None:
            raise ValueError(why)
    # Groups are created in the same order on every rank (new_group is
    # collective), but torch calls this creator on a group's members only:
    # counting per process set names a group alike on all its members (the
    # runtime scopes names by set).
    sid = int(process_set.process_set_id)
    seq = _groups_created.get(sid, 0)
    _groups_created[sid] = seq + 1
    tag = f"g{seq}"
    # The group's timeout (init_process_group / new_group(timeout=)): an
    # operation of the group that some member never enqueues fails on every
    # member after it, with TimeoutError, decided by the set's rank 0 (a
    # member). Registered on every member; GYRE_STALL_SHUTDOWN_S stays the
    # upper bound.
    if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
        _gyre.set_operation_timeout(sid, f"torch.{tag}.", timeout.total_seconds())
    return GyreProcessGroup(rank, size, tag, process_set, index=seq)


# World ranks -> the gyre ProcessSet (of its members) that torch subgroups
# of those ranks run on, on their members.
_subgroup_sets = {}
# World ranks -> how many torch groups of this rank run on that set
# (destroy_process_group(group) counts down; at zero the set goes).
_live_groups = {}


def _remove_set(key: Any) -> None:
    """Removes the set of a torch group's ranks, on its members alone."""
    ps = _subgroup_sets.pop(key)
    _live_groups.pop(key, None)
    if ps.process_set_id is not None and gyre.is_initialized():
        gyre.remove_process_set(ps)


def _wrap_destroy_process_group(destroy: Any) -> Any:
    """dist.destroy_process_group, releasing gyre's process sets:
    destroy_process_group(group) on a member counts the group's set down and
    removes it when no torch group of this rank runs on it (the set is its
    members' alone, so they remove it alone: its runtime stops on every
    member); destroy_process_group() of everything removes every set made
    for torch groups."""
    if getattr(destroy, "_gyre_wrapped", False):
        return destroy

    def wrapped(group: Any = None) -> Any:
        whole = group is None or group is dist.GroupMember.WORLD
        key = None
        if not whole and isinstance(group, dist.ProcessGroup):  # NON_GROUP_MEMBER: nothing
            try:
                key = tuple(sorted(int(r) for r in dist.get_process_group_ranks(group)))
            except (RuntimeError, ValueError):
                key = None  # not a group torch knows: torch's own call says so
        result = destroy(group)
        if key in _subgroup_sets and _live_groups.get(key, 0) > 0:
            _live_groups[key] -= 1
            if _live_groups[key] == 0:
                _remove_set(key)
        if whole:
            for k in list(_subgroup_sets):
                _remove_set(k)
        return result

    wrapped._gyre_wrapped = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = destroy  # type: ignore[attr-defined]
    wrapped.__doc__ = destroy.__doc__
    return wrapped


def backend_devices() -> List[str]:
    """The devices the backend takes: CUDA tensors too where gyre is built
    with NCCL (they go through gyre's NCCL path, one GPU per rank)."""
    return ["cpu", "cuda"] if gyre.nccl_built() else ["cpu"]


def _register() -> None:
    if "GYRE" not in dist.Backend._plugins:
        dist.Backend.register_backend("gyre", _create_process_group, extended_api=True,
                                      devices=backend_devices())
    _launch.register_rendezvous()
    wrapped = _launch.wrap_init_process_group(_c10d.init_process_group)
    _c10d.init_process_group = wrapped
    dist.init_process_group = wrapped
    _c10d.destroy_process_group = _wrap_destroy_process_group(_c10d.destroy_process_group)
    dist.destroy_process_group = _c10d.destroy_process_group


_register()

__all__: List[str] = ["BucketNames", "GyreProcessGroup", "GyreWork", "allreduce_hook",
                      "check_consistency"]
