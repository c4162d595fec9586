"""gyre's exceptions: one per gyre::Error subclass of the C++ runtime.

The extension translates a C++ exception into the class of the same name here,
keeping the runtime's message (which names the tensor, the field and the
ranks). Errors of the background thread are raised by ``synchronize()``.
"""

import builtins


class GyreError(RuntimeError):
    """Base class of every error gyre raises."""


class InvalidArgumentError(GyreError, ValueError):
    """A bad argument (a non-contiguous tensor, an unsupported dtype, a CUDA
    tensor without NCCL, an unknown root rank, ...): raised by the call on the
    rank that passed it, and by ``synchronize()`` on the other ranks, whose
    operation of the same name fails with that rank's reason."""


class MismatchError(GyreError):
    """Ranks disagree on an operation: shape, dtype, op, root or collective."""


class DivergenceError(GyreError):
    """Ranks are at different training steps, or hold different parameter values.

    ``check_consistency`` sets ``mismatches``: {name: {digest: [ranks]}}.
    """

    def __init__(self, message, mismatches=None):
        super().__init__(message)
        self.mismatches = dict(mismatches or {})


class TimeoutError(GyreError, builtins.TimeoutError):  # noqa: A001 (Horovod-style name)
    """An operation made no progress within its deadline."""


class TransportError(GyreError):
    """The transport (MPI, ...) reported a failure."""


class StateError(GyreError):
    """gyre is not initialised, initialised twice, or was shut down while the
    operation was pending."""


_BY_NAME = {
    "GyreError": GyreError,
    "InvalidArgumentError": InvalidArgumentError,
    "MismatchError": MismatchError,
    "DivergenceError": DivergenceError,
    "TimeoutError": TimeoutError,
    "TransportError": TransportError,
    "StateError": StateError,
}
