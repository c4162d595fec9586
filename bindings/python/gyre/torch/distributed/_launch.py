"""How a torch.distributed job finds gyre's world: the launch check, the
"gyre://" rendezvous, and init_process_group's default for the gyre backend.

gyre's world is the MPI job: started by mpirun, or by torchrun (or any
launcher with its environment) through gyre.bootstrap. torch still wants a store (its process-group bookkeeping, and gloo or other
groups created later with new_group), so the "gyre://" rendezvous makes a real
one: rank 0 opens a TCPStore on a free port and gyre broadcasts its address,
so no MASTER_ADDR or MASTER_PORT is needed, on one host or many.
"""

import functools
import inspect
import os
import socket
from datetime import timedelta
from typing import Any, Iterator, Optional, Tuple
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

import gyre
from gyre import bootstrap
from gyre.objects import broadcast_object

def check_launch(world_size: int = -1, rank: int = -1, store: Any = None) -> None:
    """Starts gyre if needed and checks the caller's rank and world size (-1:
    not given) against gyre's. Under torchrun (or any launcher with its
    environment) MPI starts through `store` (gyre.bootstrap); with an MPI
    that cannot, StateError (a RuntimeError) says how to launch. ValueError
    on a disagreement."""
    bootstrap.start_from_launcher(store)
    gyre.init()
    if world_size not in (-1, gyre.size()):
        raise ValueError(f"the gyre backend: world_size={world_size} was given, but the job "
                         f"has {gyre.size()} processes; omit world_size or make them agree")
    if rank not in (-1, gyre.rank()):
        raise ValueError(f"the gyre backend: rank={rank} was given, but this process is rank "
                         f"{gyre.rank()} of the job; omit rank or make them agree")


def _store_host() -> str:
    # MASTER_ADDR, when the job sets one, names the interface to use.
    return os.environ.get("MASTER_ADDR") or socket.gethostname()


def _gyre_rendezvous(url: str, timeout: timedelta = dist.constants.default_pg_timeout,
                     **kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
    query = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    check_launch(int(query.get("world_size", -1)), int(query.get("rank", -1)))
    rank, size = gyre.rank(), gyre.size()
    if rank == 0:
        store = dist.TCPStore(_store_host(), 0, size, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        address = (_store_host(), store.port)
        broadcast_object(address, root_rank=0, name="torch.distributed.rendezvous")
    else:
        address = broadcast_object(None, root_rank=0, name="torch.distributed.rendezvous")
        store = dist.TCPStore(address[0], address[1], size, is_master=False, timeout=timeout)
    yield store, rank, size
    raise RuntimeError("the gyre:// rendezvous cannot be restarted; restart the MPI job")


def register_rendezvous() -> None:
    try:
        register_rendezvous_handler("gyre", _gyre_rendezvous)
    except RuntimeError:  # already registered: this module was imported before
        pass


def is_gyre_backend(backend: Any) -> bool:
    """True for "gyre" and for device maps that use it ("cpu:gyre,cuda:nccl")."""
    if backend is None:
        return False
    parts = str(backend).lower().replace(",", ":").split(":")
    return "gyre" in parts


def wrap_init_process_group(original: Any) -> Any:
    """init_process_group, defaulting init_method to "gyre://" for the gyre
    backend when neither a store nor an init_method is given."""
    if getattr(original, "_gyre_wrapped", False):
        return original
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        a = bound.arguments
        # Under torchrun (or a launcher with its environment) torch's own
        # env:// rendezvous gives the store gyre starts MPI through.
        if is_gyre_backend(a.get("backend")):
            # Before torch's rendezvous, which would wait for peers first.
            bootstrap.refuse_if_cannot_start()
            if a.get("store") is None and a.get("init_method") is None \
                    and bootstrap.launcher_world() is None:
                a["init_method"] = "gyre://"
        return original(*bound.args, **bound.kwargs)

    init_process_group._gyre_wrapped = True  # type: ignore[attr-defined]
    return init_process_group


def default_world(rank: int, size: int) -> Optional[str]:
    """Why a group with this rank and size cannot run on gyre, or None."""
    if size != gyre.size():
        return (f"the gyre backend runs groups of all {gyre.size()} ranks only (this group has "
                f"{size}): subsets need gyre process sets; create the subgroup with "
                "dist.new_group(ranks, backend='gloo')")
    if rank != gyre.rank():
        return (f"the gyre backend: torch assigned rank {rank} to this process, which is rank "
                f"{gyre.rank()} of the job; rank and world size must come from the launcher")
    return None
