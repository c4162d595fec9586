"""horovod.runner.util.threads -> gyre.basics (re-exports only)."""
from gyre.basics import in_thread  # noqa: F401
