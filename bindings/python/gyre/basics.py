"""Lifecycle, topology and build information with Horovod's names, and
Horovod's process sets.

Horovod scripts call ``init()`` several times, ask what the build supports
(``nccl_built()``, ``mpi_threads_supported()``, ...) and pass
``process_set=`` to collectives. The answers here describe this build
truthfully: gyre always runs on MPI, never on Gloo, DDL, oneCCL or ROCm, and
takes CUDA tensors when it was built with NCCL.
"""

import os
import sys
import threading
from typing import Any, Iterable, List, Optional

from . import _gyre, bootstrap
from .exceptions import InvalidArgumentError, InvalidTypeError, StateError
from .handles import forget_all, forget_names_of, restart_names

class ProcessSet:
    """Horovod's ProcessSet: a set of ranks that run collectives among
    themselves, concurrently with other sets (each set has its own
    negotiation, fusion and background thread in the runtime).

    Made from a list of ranks (sorted here) or an mpi4py communicator (its
    ranks in MPI_COMM_WORLD), then registered by ``init(process_sets=[...])``
    or ``add_process_set()``, which give it its ``process_set_id``. Roots
    (``broadcast``) stay world ranks, as in Horovod; ``rank()`` is this
    rank's index in the set (what orders ``allgather`` results)."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Any) -> None:
        if hasattr(ranks_or_comm, "Get_group") and hasattr(ranks_or_comm, "Get_size"):
            self.mpi_comm = ranks_or_comm
            self.ranks = _ranks_of(ranks_or_comm, "ProcessSet")
        else:
            self.ranks = _ranks_of(ranks_or_comm, "ProcessSet")

    def invalidate(self) -> None:
        """Forgets the registration (remove_process_set calls it)."""
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set; None while not registered."""
        if self.process_set_id is None:
            return None
        return _gyre.process_set_size(self.process_set_id)

    def rank(self) -> Optional[int]:
        """This rank's index in the set (-1 outside it); None while not
        registered. Collectives still take world ranks as roots."""
        if self.process_set_id is None:
            return None
        return _gyre.process_set_rank(self.process_set_id)

    def included(self) -> Optional[bool]:
        """Whether this rank is in the set; None while not registered."""
        if self.process_set_id is None:
            return None
        return bool(_gyre.process_set_included(self.process_set_id))

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


def check_process_set(process_set: Any, what: str) -> int:
    """The runtime id of `process_set` (None counts as the global set).
    InvalidTypeError for anything but a ProcessSet; InvalidArgumentError
    (a ValueError) for a set that is not registered. Whether this rank is
    in the set is the runtime's to check (InvalidArgumentError at the call)."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise InvalidTypeError(
            f"{what}: process_set must be a gyre ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise InvalidArgumentError(
            f"{what}: {process_set} is not registered: pass it to init(process_sets=[...]) or "
            f"add_process_set() on every rank first")
    return int(process_set.process_set_id)


def _sync_global_ranks() -> None:
    global_process_set.ranks = list(range(_gyre.size()))


def add_process_set(process_set: Any, members_only: bool = False,
                    timeout: Optional[float] = None) -> ProcessSet:
    """Registers a set (a ProcessSet or a list of ranks) and returns it with
    its id. Collective over every rank: all ranks add the same sets in the
    same order (checked: InvalidArgumentError on every rank otherwise).
    Unlike Horovod, gyre needs no ``init(process_sets="dynamic")`` first.

    ``members_only=True``: made by the set's members alone, ranks outside
    never call it (torch's ``new_group`` on a subgroup's members). A member
    that does not call it within ``timeout`` seconds (default 300), or calls
    it for other ranks, makes it fail on every member that did
    (TimeoutError / InvalidArgumentError naming them). Only the members know
    such a set, and only they remove it."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None and ps.process_set_id in _gyre.process_set_ids():
        raise InvalidArgumentError(f"add_process_set: {ps} is already registered")
    # (An id no longer registered is one a rebuild dropped: the set may be
    # added again, under a new id.)
    if members_only:
        ps.process_set_id = int(_gyre.add_process_set_of_members(
            list(ps.ranks), float(timeout) if timeout is not None else 0.0))
    else:
        ps.process_set_id = int(_gyre.add_process_set(list(ps.ranks)))
    _registered.setdefault(ps.process_set_id, []).append(ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered set (collective over every rank, like
    add_process_set); its pending operations fail. Returns False for the
    global set, which cannot be removed (Horovod's answer), True otherwise;
    every ProcessSet object of the removed set is invalidated."""
    sid = check_process_set(process_set, "remove_process_set")
    if sid == 0:
        return False
    _gyre.remove_process_set(sid)
    for ps in _registered.pop(sid, []):
        ps.invalidate()
    forget_names_of(sid)
    return True


def _forget_process_sets() -> None:
    """After shutdown: the runtime's sets are gone; so are their ids."""
    for sid in [k for k in _registered if k != 0]:
        for ps in _registered.pop(sid):
            ps.invalidate()
        forget_names_of(sid)


def _ranks_of(comm: Any, what: str) -> List[int]:
    """Ranks of a list of ranks or of an mpi4py communicator, in world ranks."""
    if hasattr(comm, "Get_group") and hasattr(comm, "Get_size"):
        from mpi4py import MPI  # only reachable with an mpi4py communicator in hand
        return list(MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                              MPI.COMM_WORLD.Get_group()))
    try:
        ranks = [int(r) for r in comm]
    except (TypeError, ValueError):
        raise InvalidTypeError(
            f"{what}: expected a list of ranks or an mpi4py communicator, got {comm!r}") from None
    if len(set(ranks)) != len(ranks):
        raise InvalidArgumentError(f"{what}: duplicate ranks in {ranks}")
    return sorted(ranks)


def _ranks_in_order(comm: Any, what: str) -> List[int]:
    """init(comm): ranks of MPI_COMM_WORLD in the order given (a list), or an
    mpi4py communicator's members in its own rank order."""
    if hasattr(comm, "Get_group") and hasattr(comm, "Get_size"):
        from mpi4py import MPI  # only reachable with an mpi4py communicator in hand
        if comm == MPI.COMM_NULL:
            raise InvalidArgumentError(
                f"{what}: MPI.COMM_NULL: this process is not in the communicator; gyre runs on "
                f"its members alone, and only they call init() with it")
        group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world))
        finally:
            group.Free()
            world.Free()
    try:
        ranks = [int(r) for r in comm]
    except (TypeError, ValueError):
        raise InvalidTypeError(
            f"{what}: expected a list of ranks or an mpi4py communicator, got {comm!r}") from None
    if not ranks:
        raise InvalidArgumentError(f"{what}: an empty list of ranks")
    return ranks


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# id -> the ProcessSet objects registered under it (Horovod keeps the same
# table: several objects may name one set; removal invalidates them all).
_registered = {0: [global_process_set]}


def in_thread(target: Any, args: tuple = (), name: Optional[str] = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Runs ``target(*args)`` in a new started thread and returns the thread
    (Horovod's horovod.runner.util.threads.in_thread, which its test
    utilities use). With `silent`, an exception in `target` ends the thread
    without the traceback being printed."""
    def run() -> None:
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise

    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Initialises MPI (if needed) and starts gyre's background thread.

    As in Horovod, init() may be called any number of times (while gyre runs,
    later calls do nothing) and again after shutdown(), which starts a new
    runtime on the same MPI (a new version vector; generated names and
    process set ids start again).
    `comm`, as Horovod's: a list of ranks of MPI_COMM_WORLD, or an mpi4py
    communicator: gyre runs on those ranks alone, the i-th listed (or the
    communicator's rank i) being rank i; size(), local and cross ranks,
    collectives, process sets, barrier and join are all within them. Only
    those ranks call init() with it, all with the same list (the others may
    do anything else once MPI is initialised there: Open MPI's MPI_Init waits
    for every process, and the refused init() below initialises it); on a
    rank outside it init() raises InvalidArgumentError (a ValueError) at
    once and gyre stays uninitialised there (Horovod warns and falls back to
    MPI_COMM_WORLD there, and then waits for ranks that never join). While
    gyre runs, a `comm` naming other ranks raises InvalidArgumentError
    (shutdown() first). init() without `comm` after shutdown() runs on
    every rank again (all of them call it).
    `process_sets`: a list of ProcessSet (or lists of ranks) registered now,
    in order, on every rank (a collective, as add_process_set), or
    "dynamic" (Horovod's switch for add/remove later; gyre allows those
    anyway).
    In a process that torchrun (or a launcher with its environment: RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) started, MPI starts from those
    (gyre.bootstrap) when gyre is built against MPICH; with Open MPI it
    raises StateError saying how to launch instead."""
    was_running = _gyre.is_initialized()
    if not was_running:
        # torchrun and other launchers with torch's contract: MPI starts from
        # a PMI server (gyre.bootstrap), or the launch is refused with a
        # StateError saying how to start the job.
        bootstrap.start_from_launcher()
    # Replacement ranks (GYRE_ELASTIC_RESPAWN) run this interpreter with its
    # arguments (-m, -u, the script and its arguments), not the C++ default.
    args = sys.orig_argv[1:] if hasattr(sys, "orig_argv") else sys.argv
    _gyre.set_respawn_command([sys.executable] + list(args))
    ranks = None if comm is None else _ranks_in_order(comm, "init(comm=...)")
    if not was_running:
        # Ranks whose earlier runtimes differed (a subset, then all) must
        # generate the same names in the new one.
        restart_names()
    _gyre.init(ranks or [])
    if _gyre.is_replacement():
        # The survivors' GYRE_* variables, received at init().
        os.environ.update(_gyre.gyre_environment())
    _sync_global_ranks()
    try:
        if process_sets is not None and process_sets != "dynamic":
            if isinstance(process_sets, str):
                raise InvalidArgumentError(
                    f"init(process_sets={process_sets!r}): expected a list of ProcessSet or "
                    f"'dynamic'")
            for ps in process_sets:
                ps = ps if isinstance(ps, ProcessSet) else ProcessSet(ps)
                if ps.process_set_id is not None or ps.ranks == global_process_set.ranks:
                    # Already registered (init() again) or the global set.
                    if ps.process_set_id is None:
                        ps.process_set_id = 0
                        _registered[0].append(ps)
                    continue
                add_process_set(ps)
    except BaseException:
        # Every rank receives the same arguments and refuses alike; a runtime
        # that this call started is stopped again, a running one is left be.
        if not was_running:
            _gyre.shutdown()
            _forget_process_sets()
        raise


def shutdown() -> None:
    """Fails pending operations (on every rank) and stops the background
    thread; does nothing if gyre is not running. MPI stays initialised, so
    init() may follow; gyre finalises MPI at process exit if it initialised
    it. Also run at interpreter exit."""
    if _gyre.is_initialized():
        _gyre.shutdown()
    forget_all()
    _forget_process_sets()


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _gyre.is_initialized()


def rank() -> int:
    return _gyre.rank()


def size() -> int:
    return _gyre.size()


def local_rank() -> int:
    return _gyre.local_rank()


def local_size() -> int:
    return _gyre.local_size()


def cross_rank() -> int:
    """This rank's index among the ranks with its local rank (one per host that
    has that many ranks), in rank order."""
    return _gyre.cross_rank()


def cross_size() -> int:
    """How many ranks have this rank's local rank: the number of hosts that
    hold at least local_rank() + 1 ranks."""
    return _gyre.cross_size()


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks, judged from this
    rank's placement (no communication): local_size() * cross_size() ==
    size() holds on every rank exactly then for the ranks of local rank 0."""
    return _gyre.size() == _gyre.local_size() * _gyre.cross_size()


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE. Needs init() (Horovod
    raises ValueError before; so does gyre, a StateError)."""
    if not _gyre.is_initialized():
        raise StateError("mpi_threads_supported(): gyre is not initialised; call init() first")
    return bool(_gyre.mpi_threads_supported())


def mpi_built() -> bool:
    """gyre always runs on MPI."""
    return True


def mpi_enabled() -> bool:
    """True while gyre runs (always on MPI)."""
    return _gyre.is_initialized()


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    """Whether this build takes CUDA tensors (through NCCL). Horovod returns
    an int (the NCCL version); gyre returns a bool, truthful either way."""
    return bool(_gyre.built_with_nccl)


def cuda_built() -> bool:
    """gyre's CUDA support is its NCCL backend."""
    return bool(_gyre.built_with_nccl)


def rocm_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def mlsl_built() -> bool:
    return False


def sycl_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome trace (chrome://tracing, Perfetto) of gyre's
    operations to `file_path` while the job runs, as Horovod's. A path with
    "{rank}" gives each rank a file of its own; otherwise rank 0 writes.
    `mark_cycles` adds an event per negotiation round. Calling it again
    switches files."""
    _gyre.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stops the timeline started by start_timeline() (or GYRE_TIMELINE) and
    closes its file, which stays valid JSON."""
    _gyre.stop_timeline()


def elastic_supported() -> bool:
    """Whether this build can recover from a rank's death (elastic
    training): built against an MPI with ULFM (Open MPI 5). Any time."""
    return bool(_gyre.elastic_supported())


def elastic_enabled() -> bool:
    """elastic_supported(), and the job runs with fault tolerance on
    (``mpirun --with-ft ulfm``). Any time."""
    return bool(_gyre.elastic_enabled())


def rebuild() -> dict:
    """After a RankFailedError, on every surviving rank: a new world of the
    survivors (gyre::rebuild() in C++). Returns ``rank``, ``size``, ``step``
    (the last step every survivor committed: every rank's committed_steps()
    from now on), ``root`` (a rank whose own commit is ``step``: broadcast
    state from it), ``lost`` (old ranks that died), ``previous_ranks``,
    ``attempts`` and ``seconds``. ``gyre.torch.elastic.run`` calls it."""
    info = dict(_gyre.rebuild())
    # The world's ranks are renumbered; process sets from before are dropped
    # (operations on them raise StateError saying so; add them again).
    _sync_global_ranks()
    return info


def is_replacement() -> bool:
    """Whether this process was started by a rebuild (GYRE_ELASTIC_RESPAWN)
    to replace a failed rank; ``gyre.torch.elastic.run`` then takes the
    committed state from the rank the survivors sync from."""
    return bool(_gyre.is_replacement())


def replacement_info() -> dict:
    """On a replacement rank: ``rank``, ``size``, ``step`` (the agreed
    commit), ``root`` (the rank holding it), ``spawned``, ``rebuilds``.
    StateError elsewhere."""
    return dict(_gyre.replacement_info())


__all__ = [
    "elastic_supported", "elastic_enabled", "rebuild", "is_replacement", "replacement_info",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_built",
    "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "mlsl_built", "sycl_built", "start_timeline", "stop_timeline",
]
