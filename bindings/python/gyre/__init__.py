"""gyre: ring-allreduce collectives for data-parallel training.

``import gyre`` gives Horovod's collective API on numpy arrays, torch tensors
and any DLPack producer; ``import gyre.torch`` adds DistributedOptimizer,
parameter broadcast and divergence checks for PyTorch. The public API carries
type hints (the package ships ``py.typed``). Run under mpirun::

    import gyre
    gyre.init()
    total = gyre.allreduce(numpy.ones(4), op=gyre.Sum)
"""

import atexit

from . import exceptions
from .exceptions import (DivergenceError, GyreError, HorovodInternalError, HostsUpdatedInterrupt,
                         InvalidArgumentError, InvalidTypeError, MismatchError, NotSupportedError,
                         RankFailedError, StateError, TimeoutError, TransportError)

try:
    from . import _gyre
except ImportError as e:  # pragma: no cover - an installation problem
    raise ImportError(
        f"gyre's extension module failed to load ({e}); install gyre with `pip install .` "
        "from the repository root"
    ) from e

_gyre._set_exception_classes(exceptions._BY_NAME)

from .compression import Compression, Compressor  # noqa: E402
from .objects import allgather_object, broadcast_object  # noqa: E402
from . import ps  # noqa: E402  (gyre.ps.ParameterStore)
from .ops import *  # noqa: E402,F401,F403
from .ops import __all__ as _ops_all  # noqa: E402

__version__: str = "0.1.0"


def _shutdown_at_exit() -> None:
    # The background thread must stop before the interpreter tears down (it
    # may still complete operations whose tensors are Python objects). MPI,
    # if gyre initialised it, is finalised later, by the C++ library's own
    # exit handler: shutdown() leaves it initialised so that init() may follow.
    if _gyre.is_initialized():
        _gyre.shutdown()


atexit.register(_shutdown_at_exit)

__all__ = list(_ops_all) + [
    "Compression", "Compressor", "broadcast_object", "allgather_object", "GyreError",
    "InvalidArgumentError", "InvalidTypeError", "NotSupportedError", "HorovodInternalError",
    "MismatchError", "DivergenceError", "TimeoutError", "TransportError", "StateError",
    "RankFailedError", "HostsUpdatedInterrupt",
]
