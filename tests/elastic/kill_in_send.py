"""The Python side of tests/elastic/kill_in_send.cc, for the elastic scripts
(elastic_train.py, elastic_local_sgd.py). With GYRE_TEST_KILL_IN_SEND=1 that
library is preloaded (LD_PRELOAD) and wraps MPI_Isend: a script counts the
data sends of one collective, then arms the kill to die inside a later one
after half of them, so that no rank ever holds a partial sum."""
import ctypes
import os

ENABLED = os.environ.get("GYRE_TEST_KILL_IN_SEND") == "1"
# Only sends of at least this many bytes count: the collectives' data chunks,
# not the negotiation's messages (the scripts make them far larger).
MIN_BYTES = 2048

_lib = None
if ENABLED:
    _lib = ctypes.CDLL(None)  # the preloaded library's functions
    _lib.gyre_test_arm_kill.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_int]
    _lib.gyre_test_sends.restype = ctypes.c_long


def count_sends(rank):
    """From now on count this rank's data sends (killing nobody)."""
    _lib.gyre_test_arm_kill(0, MIN_BYTES, rank)


def sends():
    """The data sends counted since count_sends()."""
    return _lib.gyre_test_sends()


def die_halfway(counted, rank):
    """Die just before posting data send counted // 2 + 1 from now."""
    _lib.gyre_test_arm_kill(counted // 2 + 1, MIN_BYTES, rank)
