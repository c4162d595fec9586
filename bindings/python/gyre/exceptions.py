"""gyre's exceptions: one per gyre::Error subclass of the C++ runtime, each
also catchable by the class Horovod raises in the same situation.

The extension translates a C++ exception into the class of the same name here,
keeping the runtime's message (which names the tensor, the field and the
ranks). Errors of the background thread are raised by ``synchronize()``.

Horovod raises ``HorovodInternalError`` (a ``RuntimeError``) for a collective
that failed, ``ValueError`` for bad arguments and for calls before ``init()``,
``NotImplementedError`` for what it does not support. The hierarchy::

    RuntimeError
      GyreError
        InvalidArgumentError (also ValueError)
          InvalidTypeError (also TypeError)
        NotSupportedError (also NotImplementedError)
        HorovodInternalError
          MismatchError, DivergenceError, TransportError,
          TimeoutError (also builtins.TimeoutError),
          StateError (also ValueError: Horovod's "not initialized")
          TransportError
            RankFailedError (a rank died; elastic training recovers)
      HostsUpdatedInterrupt (Horovod's elastic membership signal)
"""

import builtins


class GyreError(RuntimeError):
    """Base class of every error gyre raises."""


class InvalidArgumentError(GyreError, ValueError):
    """A bad argument (a non-contiguous tensor, an unsupported dtype, a CUDA
    tensor without NCCL, an unknown root rank, ...): raised by the call on the
    rank that passed it, and by ``synchronize()`` on the other ranks, whose
    operation of the same name fails with that rank's reason."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type, where Horovod raises TypeError."""


class NotSupportedError(GyreError, NotImplementedError):
    """Part of Horovod's API that gyre does not implement yet (process sets
    other than the global one, ...). The message says what and why."""


class HorovodInternalError(GyreError):
    """A collective failed (Horovod's name: scripts, and elastic training,
    catch this class). Every error of an operation that ranks agreed to run
    is one."""


class MismatchError(HorovodInternalError):
    """Ranks disagree on an operation: shape, dtype, op, root or collective."""


class DivergenceError(HorovodInternalError):
    """Ranks are at different training steps, or hold different parameter values.

    ``check_consistency`` sets ``mismatches``: {name: {digest: [ranks]}}.
    """

    def __init__(self, message, mismatches=None):
        super().__init__(message)
        self.mismatches = dict(mismatches or {})


class TimeoutError(HorovodInternalError, builtins.TimeoutError):  # noqa: A001 (Horovod-style name)
    """An operation made no progress within its deadline."""


class TransportError(HorovodInternalError):
    """The transport (MPI, ...) reported a failure."""


class RankFailedError(TransportError):
    """A rank of the job died while this rank's operations needed it (an MPI
    with ULFM, run with ``mpirun --with-ft ulfm``): every pending operation
    on every surviving rank fails with it. ``gyre.torch.elastic.run`` catches
    it (as Horovod's elastic mode catches ``HorovodInternalError``), rebuilds
    the world from the survivors and restores the last commit. See
    docs/elastic.md."""


class HostsUpdatedInterrupt(GyreError):
    """Horovod's signal that the set of hosts changed while training.
    ``gyre.torch.elastic.run`` handles it like Horovod (reset, then go on);
    gyre raises it only from ``State.check_host_updates()`` when a rank was
    lost since the last check, as its membership changes only by failure."""

    def __init__(self, skip_sync=False):
        super().__init__("the set of ranks changed")
        self.skip_sync = skip_sync


class StateError(HorovodInternalError, ValueError):
    """gyre is not initialised (Horovod raises ValueError there), initialised
    twice, or was shut down while the operation was pending (Horovod raises
    HorovodInternalError there)."""


# The runtime's generic gyre::Error is a failed operation: Horovod's class.
_BY_NAME = {
    "GyreError": HorovodInternalError,
    "InvalidArgumentError": InvalidArgumentError,
    "MismatchError": MismatchError,
    "DivergenceError": DivergenceError,
    "TimeoutError": TimeoutError,
    "TransportError": TransportError,
    "RankFailedError": RankFailedError,
    "StateError": StateError,
}
