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
from ._process_group import GyreProcessGroup
from ._work import GyreWork

# Groups created so far on each gyre process set (by id).
_groups_created = {}


def _create_process_group(opts: Any, backend_options: Any = None) -> GyreProcessGroup:
    """torch's creator for the gyre backend (the default group and new_group),
    called on the group's members only (torch's extended API, which gives the
    group's world ranks). A subgroup runs on the gyre process set of its
    ranks, which new_group (wrapped below) registered on every rank first."""
    del backend_options  # gyre negotiates by itself; the timeout comes in opts
    rank, size = opts.group_rank, opts.group_size
    ranks = sorted(int(r) for r in (opts.global_ranks_in_group or []))
    _launch.check_launch(store=getattr(opts, "store", None))
    process_set = gyre.global_process_set
    if ranks and ranks != list(range(gyre.size())):
        process_set = _subgroup_sets.get(tuple(ranks))
        if process_set is None:
            raise ValueError(
                f"the gyre backend: no gyre process set for the group of ranks {ranks}: create "
                f"subgroups with dist.new_group (or new_subgroups) on every rank, after "
                f"`import gyre.torch.distributed`")
        if size != len(ranks) or rank != process_set.rank():
            raise ValueError(
                f"the gyre backend: torch gave this process rank {rank} of {size} in the group "
                f"of ranks {ranks}; gyre has it as rank {process_set.rank()} of {len(ranks)}")
        _live_groups[tuple(ranks)] = _live_groups.get(tuple(ranks), 0) + 1
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
    timeout = getattr(opts, "timeout", None)
    if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
        _gyre.set_operation_timeout(sid, f"torch.{tag}.", timeout.total_seconds())
    return GyreProcessGroup(rank, size, tag, process_set, index=seq)


# World ranks -> the gyre ProcessSet registered for torch subgroups of them
# (one per distinct set of ranks), in the order they were registered: the
# same on every rank.
_subgroup_sets = {}
# World ranks -> how many torch groups of this rank run on that set (members
# only; destroy_process_group(group) counts down).
_live_groups = {}
_sweeps = [0]


def _sweep_released_sets() -> None:
    """Removes the gyre process sets whose torch groups every member has
    destroyed. Collective over every rank (gyre removes a set on every rank,
    while torch's destroy_process_group(group) runs on the group's members
    only): called where torch's API is collective too, new_group and
    destroy_process_group() of everything. One allreduce (MIN) of a flag per
    set agrees on which sets are free everywhere."""
    keys = list(_subgroup_sets)
    if not keys or not gyre.is_initialized():
        return
    import torch  # noqa: PLC0415 - torch is loaded by now (torch.distributed)
    from gyre.ops import ReduceOp  # noqa: PLC0415
    free = torch.tensor([0 if _live_groups.get(k, 0) > 0 else 1 for k in keys],
                        dtype=torch.int32)
    _sweeps[0] += 1
    _gyre.allreduce(f"gyre.torch.distributed.sweep.{_sweeps[0]}", free, None,
                    int(ReduceOp.MIN), 1.0, 1.0, "", process_set=0).wait()
    for key, flag in zip(keys, free.tolist()):
        if flag:
            _remove_set(key)


def _remove_set(key: Any) -> None:
    ps = _subgroup_sets.pop(key)
    _live_groups.pop(key, None)
    if ps.process_set_id is not None and gyre.is_initialized():
        gyre.remove_process_set(ps)


def _wrap_destroy_process_group(destroy: Any) -> Any:
    """dist.destroy_process_group, releasing gyre's process sets:
    destroy_process_group(group) on a member counts the group's set down
    (the set goes at the next new_group or destroy_process_group(), once
    every member has destroyed its groups on it: a non-member's call passes
    NON_GROUP_MEMBER, which names no group); destroy_process_group() of
    everything, collective in torch, removes every set gyre registered for
    torch groups."""
    if getattr(destroy, "_gyre_wrapped", False):
        return destroy

    def wrapped(group: Any = None) -> Any:
        whole = group is None or group is dist.GroupMember.WORLD
        if not whole and isinstance(group, dist.ProcessGroup):  # NON_GROUP_MEMBER: nothing
            try:
                key = tuple(sorted(int(r) for r in dist.get_process_group_ranks(group)))
            except (RuntimeError, ValueError):
                key = None  # not a group torch knows: torch's own call says so
            if key in _subgroup_sets and _live_groups.get(key, 0) > 0:
                _live_groups[key] -= 1
        result = destroy(group)
        if whole:
            for key in list(_subgroup_sets):
                _remove_set(key)
        return result

    wrapped._gyre_wrapped = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = destroy  # type: ignore[attr-defined]
    wrapped.__doc__ = destroy.__doc__
    return wrapped


def _uses_gyre(backend: Any) -> bool:
    if backend is None:
        try:
            return dist.is_initialized() and str(dist.get_backend()).lower() == "gyre"
        except (RuntimeError, ValueError):
            return False
    return str(backend).lower() == "gyre"


def _wrap_new_group(new_group: Any) -> Any:
    """dist.new_group, registering the gyre process set of `ranks` on every
    rank first: torch calls the backend's creator on the members only, while
    registering a process set is collective over every rank (new_group is
    collective in torch too)."""
    if getattr(new_group, "_gyre_wrapped", False):
        return new_group

    def wrapped(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[1] if len(args) > 1 else None)
        if _uses_gyre(backend) and gyre.is_initialized():
            _sweep_released_sets()
        if ranks is not None and _uses_gyre(backend) and gyre.is_initialized():
            key = tuple(sorted(int(r) for r in ranks))
            if key and key != tuple(range(gyre.size())):
                ps = _subgroup_sets.get(key)
                if ps is None or ps.process_set_id is None:
                    _subgroup_sets[key] = gyre.add_process_set(list(key))
        return new_group(ranks, *args, **kwargs)

    wrapped._gyre_wrapped = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = new_group  # type: ignore[attr-defined]
    wrapped.__doc__ = new_group.__doc__
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
    # new_subgroups and friends call the module's new_group: patch it there too.
    _c10d.new_group = _wrap_new_group(_c10d.new_group)
    dist.new_group = _c10d.new_group
    _c10d.destroy_process_group = _wrap_destroy_process_group(_c10d.destroy_process_group)
    dist.destroy_process_group = _c10d.destroy_process_group


_register()

__all__: List[str] = ["GyreProcessGroup", "GyreWork", "check_consistency"]
