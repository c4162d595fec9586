"""Collectives on picklable Python objects, built on broadcast_ and allgather
of uint8 arrays. Every rank must call them in the same order (or with the
same explicit name)."""

import pickle

import numpy as np

from . import ops
from .basics import check_process_set, global_process_set


def _to_bytes(obj):
    # A writable copy: broadcast_ writes into it on every rank.
    return np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                         dtype=np.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` on every rank (a copy made by pickling). A bad
    root_rank is refused by the first broadcast_ below, on every rank."""
    name = ops._op_name("broadcast_object", name, process_set)
    check_process_set(process_set, "broadcast_object")
    is_root = ops.rank() == root_rank
    payload = _to_bytes(obj) if is_root else None
    length = np.array([payload.size if is_root else 0], dtype=np.int64)
    ops.broadcast_(length, root_rank, name=f"{name}.size", process_set=process_set)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    ops.broadcast_(payload, root_rank, name=f"{name}.data", process_set=process_set)
    return pickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj` (of `process_set`), in rank order."""
    name = ops._op_name("allgather_object", name, process_set)
    check_process_set(process_set, "allgather_object")
    payload = _to_bytes(obj)
    sizes = ops.allgather(np.array([payload.size], dtype=np.int64), name=f"{name}.size",
                          process_set=process_set)
    data = ops.allgather(payload, name=f"{name}.data", process_set=process_set)
    result, offset = [], 0
    for n in sizes.tolist():
        result.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return result
