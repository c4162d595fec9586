"""horovod.torch.mpi_ops -> gyre.torch (re-exports only)."""
from gyre.torch import *  # noqa: F401,F403
from gyre.torch import __all__  # noqa: F401
