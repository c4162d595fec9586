"""horovod.torch.elastic -> gyre.torch.elastic (re-exports only)."""
from gyre.torch.elastic import *  # noqa: F401,F403
from gyre.torch.elastic import __all__  # noqa: F401
