"""Lifecycle, topology and build information with Horovod's names, and the
process-set arguments Horovod's calls take (only the global set, for now).

Horovod scripts call ``init()`` several times, ask what the build supports
(``nccl_built()``, ``mpi_threads_supported()``, ...) and pass
``process_set=`` to collectives. The answers here describe this build
truthfully: gyre always runs on MPI, never on Gloo, DDL, oneCCL or ROCm, and
takes CUDA tensors when it was built with NCCL.
"""

from typing import Any, Iterable, List, Optional

from . import _gyre
from .exceptions import InvalidArgumentError, InvalidTypeError, NotSupportedError, StateError

_PROCESS_SETS_NOT_YET = (
    "process sets other than the global one are not implemented in gyre yet (the runtime "
    "negotiates over all ranks); run the job on the ranks you need instead")


class ProcessSet:
    """Horovod's ProcessSet: a group of ranks. gyre accepts only the global
    set (every rank) for now; ``ProcessSet(ranks)`` naming every rank is the
    global set, any other is refused where it is used."""

    def __init__(self, ranks_or_comm: Any = None) -> None:
        self._ranks = None if ranks_or_comm is None else _ranks_of(ranks_or_comm, "ProcessSet")
        self.process_set_id = 0 if self._ranks is None else None

    def _is_global(self) -> bool:
        return self._ranks is None or self._ranks == list(range(_gyre.size()))

    @property
    def ranks(self) -> List[int]:
        return list(range(_gyre.size())) if self._ranks is None else list(self._ranks)

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This rank's index in the set (Horovod: its rank within the set)."""
        r = _gyre.rank()
        ranks = self.ranks
        return ranks.index(r) if r in ranks else -1

    def included(self) -> bool:
        return _gyre.rank() in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self._ranks is None else f"ProcessSet({self._ranks})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks))


global_process_set = ProcessSet()


def check_process_set(process_set: Any, what: str) -> None:
    """Raises unless `process_set` is the global set (None counts as global)."""
    if process_set is None or process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise InvalidTypeError(
            f"{what}: process_set must be a gyre ProcessSet, got {type(process_set).__name__}")
    if not process_set._is_global():
        raise NotSupportedError(f"{what}: {process_set!r}: {_PROCESS_SETS_NOT_YET}")


def add_process_set(process_set: Any) -> ProcessSet:
    """Horovod's add_process_set: only a set of every rank (the global set) is
    accepted for now, and returned as the global set."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    check_process_set(ps, "add_process_set")
    return global_process_set


def remove_process_set(process_set: Any) -> bool:
    """Horovod's remove_process_set: the global set cannot be removed (Horovod
    returns False then); other sets do not exist yet."""
    check_process_set(process_set, "remove_process_set")
    return False


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


def init(comm: Any = None, process_sets: Optional[Iterable[Any]] = None) -> None:
    """Initialises MPI (if needed) and starts gyre's background thread.

    As in Horovod, init() may be called any number of times (while gyre runs,
    later calls do nothing) and again after shutdown(), which starts a new
    runtime on the same MPI (a new version vector; generated names go on).
    `comm` (a list of ranks or an mpi4py communicator) and `process_sets`
    are Horovod's; gyre runs on every rank of the launch for now, so both
    must describe all ranks (anything else raises NotSupportedError)."""
    was_running = _gyre.is_initialized()
    _gyre.init()
    try:
        if comm is not None:
            ranks = _ranks_of(comm, "init(comm=...)")
            if ranks != list(range(_gyre.size())):
                raise NotSupportedError(
                    f"init(comm=...): ranks {ranks} of {_gyre.size()}: running on a subset of "
                    f"the launched ranks is not implemented in gyre yet; launch only those ranks")
        if process_sets is not None:
            if process_sets == "dynamic":
                raise NotSupportedError(f"init(process_sets='dynamic'): {_PROCESS_SETS_NOT_YET}")
            for ps in process_sets:
                check_process_set(ps if isinstance(ps, ProcessSet) else ProcessSet(ps),
                                  "init(process_sets=...)")
    except BaseException:
        # Every rank receives the same arguments and refuses alike; a runtime
        # that this call started is stopped again, a running one is left be.
        if not was_running:
            _gyre.shutdown()
        raise


def shutdown() -> None:
    """Fails pending operations (on every rank) and stops the background
    thread; does nothing if gyre is not running. MPI stays initialised, so
    init() may follow; gyre finalises MPI at process exit if it initialised
    it. Also run at interpreter exit."""
    if _gyre.is_initialized():
        _gyre.shutdown()


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
    return dict(_gyre.rebuild())


__all__ = [
    "elastic_supported", "elastic_enabled", "rebuild",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_built",
    "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "mlsl_built", "sycl_built", "start_timeline", "stop_timeline",
]
