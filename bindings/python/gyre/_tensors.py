"""Framework glue without importing any framework, and the conversion of a
call's arguments for the extension (Conversion).

gyre takes torch tensors, numpy arrays and any other DLPack producer. Results
gyre allocates come back in the caller's framework: a torch tensor for a torch
input, a numpy array otherwise. torch is only touched if the caller already
imported it (a torch tensor cannot exist otherwise).
"""

import operator
import sys
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _gyre
from .exceptions import InvalidArgumentError


def torch_module():
    """torch if it has been imported by someone, else None."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def as_framework_array(x: Any) -> Any:
    """x itself for torch tensors and numpy arrays; any other DLPack producer
    in host memory becomes a numpy view of the same memory (so outputs can be
    allocated like it). Raises InvalidArgumentError for what it cannot
    convert (Conversion.array passes that on to the runtime)."""
    if is_torch(x) or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        # The device first: a GPU tensor must not be exported to numpy.
        device_type = _dlpack_device_type(x)
        if device_type in _GPU_DEVICES:
            raise InvalidArgumentError(
                f"input is on a GPU (DLPack device type {device_type}): a {type(x).__name__} "
                "cannot be converted; gyre takes GPU tensors from torch only")
        if device_type is not None and device_type not in _HOST_DEVICES:
            raise InvalidArgumentError(
                f"input is on DLPack device type {device_type}: a {type(x).__name__} there "
                "cannot be converted; gyre takes CPU tensors")
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError) as e:
            raise InvalidArgumentError(
                f"input could not be converted: {type(x).__name__} through DLPack: {e}") from e
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        raise InvalidArgumentError(
            f"input is not a tensor: expected a tensor (torch, numpy or a DLPack producer), "
            f"got {type(x).__name__}") from None


def empty_like(x):
    """A new contiguous tensor of x's framework, shape and dtype."""
    if is_torch(x):
        torch = torch_module()
        return torch.empty_like(x, memory_format=torch.contiguous_format, requires_grad=False)
    return np.empty_like(x, order="C")


def clone(x):
    if is_torch(x):
        torch = torch_module()
        return x.detach().clone(memory_format=torch.contiguous_format)
    return np.array(x, order="C", copy=True)


def _dlpack_device_type(x: Any) -> Optional[int]:
    try:
        return int(x.__dlpack_device__()[0])
    except (AttributeError, TypeError, ValueError, IndexError):
        return None


# DLPack device types, as the extension (and so dlpack.h) numbers them.
_HOST_DEVICES = frozenset({_gyre.DLPACK_CPU, _gyre.DLPACK_CUDA_HOST})
_GPU_DEVICES = frozenset({_gyre.DLPACK_CUDA, _gyre.DLPACK_CUDA_MANAGED, _gyre.DLPACK_ROCM})


def from_output(out, like):
    """The extension's OutputTensor as the framework of `like`, without a copy
    (outputs of CUDA inputs arrive in host memory: one copy to like's device)."""
    if is_torch(like):
        t = torch_module().from_dlpack(out)
        return t.to(like.device) if like.is_cuda else t
    return np.asarray(out)


_INT64 = (-(2 ** 63), 2 ** 63 - 1)
_INT32 = (-(2 ** 31), 2 ** 31 - 1)


class Conversion:
    """The arguments of one call, converted for the extension.

    Nothing here judges a value (a root out of range, splits that do not add
    up, an op a dtype cannot take: the runtime checks those, once). What
    cannot be converted at all is not raised either: the first reason is kept
    in ``refusal`` and passed to the extension, whose runtime refuses the
    call and tells the other ranks, so that their operation of the same name
    fails at once instead of waiting for this rank. The methods return a
    placeholder (0, None, []) after a failure; the extension ignores the
    arguments of a refused call.
    """

    __slots__ = ("refusal",)

    def __init__(self) -> None:
        self.refusal = ""

    def refuse(self, why: str) -> None:
        if not self.refusal:
            self.refusal = why

    def array(self, x: Any) -> Any:
        """as_framework_array(x), or None if x cannot be converted."""
        try:
            return as_framework_array(x)
        except InvalidArgumentError as e:
            self.refuse(str(e))
            return None

    def number(self, value: Any, what: str) -> float:
        try:
            return float(value)
        except (TypeError, ValueError):
            self.refuse(f"{what} must be a number, got {value!r}")
            return 1.0

    def integer(self, value: Any, what: str, bounds: Tuple[int, int] = _INT32) -> int:
        """An integral value (int, numpy or 0-d torch integer) as an int."""
        try:
            v = operator.index(value)
        except TypeError:
            self.refuse(f"{what} must be an integer, got {value!r}")
            return 0
        if not bounds[0] <= v <= bounds[1]:
            self.refuse(f"{what} {v} is out of range")
            return 0
        return v

    def ints(self, values: Any, what: str) -> Optional[List[int]]:
        """A list of int64 values from a sequence, numpy array or torch tensor
        (None stays None)."""
        if values is None:
            return None
        if is_torch(values) or isinstance(values, np.ndarray):
            values = values.tolist()
        try:
            items = list(values)
        except TypeError:
            self.refuse(f"{what} must be a sequence of integers, got {values!r}")
            return []
        return [self.integer(v, f"{what} entry", _INT64) for v in items]


def like_ints(values, like, dtype_of=None):
    """A 1-D integer tensor of values in the framework of `like`: of
    dtype_of's dtype when that is a tensor or array (Horovod returns received
    splits like the splits passed), else int32 (Horovod's default)."""
    dtype = np.int32
    if isinstance(dtype_of, np.ndarray):
        dtype = dtype_of.dtype
    arr = np.asarray(values, dtype=np.int64)
    if is_torch(like):
        torch = torch_module()
        t = torch.from_numpy(arr)
        return t.to(dtype_of.dtype if is_torch(dtype_of) else torch.int32)
    return arr.astype(dtype)


class InFlightGuard:
    """Remembers where a torch tensor's memory was when its operation was
    enqueued, to tell the caller, with the operation's name, that the tensor
    was resized or given other memory before the operation was synchronized.
    The runtime itself never touches freed memory in flight: it works in the
    tensor's memory pinned at the call, or on a copy taken then where the
    pinning module does not serve this torch (tensor_import.h), so the other
    ranks receive the values the memory held then, and an in-place result
    reaches only the tensor's unchanged memory. numpy
    refuses to resize an array that is exported, so needs no guard."""

    __slots__ = ("tensor", "ptr", "shape", "name")

    def __init__(self, tensor, name):
        self.tensor = tensor
        self.ptr = tensor.data_ptr()
        self.shape = tuple(tensor.shape)
        self.name = name

    def check(self):
        if self.tensor.data_ptr() != self.ptr or tuple(self.tensor.shape) != self.shape:
            raise InvalidArgumentError(
                f"tensor '{self.name}' was resized or reallocated while its operation was in flight "
                f"(shape {list(self.shape)} -> {list(self.tensor.shape)}); do not resize a tensor "
                "before synchronize() returns"
            )


def guards_for(name, *tensors):
    return [InFlightGuard(t, name) for t in tensors if is_torch(t)]


def is_torch_or_numpy(x):
    """Whether x needs no conversion for the extension (as_framework_array
    returns it unchanged)."""
    return is_torch(x) or isinstance(x, np.ndarray)


def wait_guarded(pending, name, tensor):
    """Waits for an operation on `tensor` that no Handle carries (the
    blocking calls): raises the operation's error. The extension checks,
    before it writes an in-place result back, that a torch tensor still has
    the memory and shape it had at the call, and raises InvalidArgumentError
    saying so otherwise (tensor_import.h, write_back); this adds the
    operation's name to that message. (Nothing else needs checking here: a
    blocking call returns only after that write-back.)"""
    try:
        pending.wait()
    except InvalidArgumentError as e:
        if _RESIZED_IN_FLIGHT in str(e):
            raise InvalidArgumentError(f"tensor '{name}': {e}") from None
        raise


# The extension's words for a tensor changed in flight (tensor_import.cc).
_RESIZED_IN_FLIGHT = "was resized or given other memory while its operation was in flight"
