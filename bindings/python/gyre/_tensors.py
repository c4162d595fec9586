"""Framework glue without importing any framework.

gyre takes torch tensors, numpy arrays and any other DLPack producer. Results
gyre allocates come back in the caller's framework: a torch tensor for a torch
input, a numpy array otherwise. torch is only touched if the caller already
imported it (a torch tensor cannot exist otherwise).
"""

import sys

import numpy as np

from .exceptions import InvalidArgumentError


def torch_module():
    """torch if it has been imported by someone, else None."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def prepare(x):
    """What the extension will export: a torch tensor is detached (same
    storage, so in-place results land in it; gradients are never tracked).
    The DLPack capsule holds the tensor it was taken from, and torch frees a
    storage when its last tensor lets go: exporting an alias of gyre's own
    keeps the storage alive until the operation completes even if the
    caller's tensor is given another one (set_(), .data =) meanwhile.
    Other objects are exported unchanged."""
    if is_torch(x):
        return x.detach()
    return x


def as_framework_array(x):
    """x itself for torch tensors and numpy arrays; any other DLPack producer
    becomes a numpy view of the same memory (so outputs can be allocated
    like it)."""
    if is_torch(x) or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        check_cpu_device(x)
        if _dlpack_device_type(x) == 2:
            raise InvalidArgumentError(
                f"{type(x).__name__} is a CUDA tensor; gyre takes CUDA tensors from torch only")
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError) as e:
            raise InvalidArgumentError(f"cannot import {type(x).__name__} through DLPack: {e}") from e
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        raise InvalidArgumentError(
            f"expected a tensor (torch, numpy or a DLPack producer), got {type(x).__name__}"
        ) from None


def check_cpu_device(x):
    """Refuses a DLPack producer on a GPU before anything is exported (the
    extension does the same for tensors it takes directly)."""
    try:
        device_type = int(x.__dlpack_device__()[0])
    except (AttributeError, TypeError, ValueError, IndexError):
        return
    with_nccl = _built_with_nccl()
    if device_type == 2 and with_nccl:  # CUDA: the runtime takes it
        return
    if device_type in (2, 10, 13):  # CUDA, ROCm, CUDA managed
        why = ("that is not CUDA; gyre takes CPU and CUDA tensors" if with_nccl else
               "but this build of gyre has no NCCL support; move it to the CPU")
        raise InvalidArgumentError(
            f"{type(x).__name__} is on a GPU (DLPack device type {device_type}), {why}")
    if device_type not in (1, 3):  # CPU, CUDA host (pinned) memory
        raise InvalidArgumentError(
            f"{type(x).__name__} is on DLPack device type {device_type}; gyre takes CPU tensors only")


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


def _dlpack_device_type(x):
    try:
        return int(x.__dlpack_device__()[0])
    except (AttributeError, TypeError, ValueError, IndexError):
        return None


def _built_with_nccl():
    from . import _gyre
    return bool(getattr(_gyre, "built_with_nccl", False))


def from_output(out, like):
    """The extension's OutputTensor as the framework of `like`, without a copy
    (outputs of CUDA inputs arrive in host memory: one copy to like's device)."""
    if is_torch(like):
        t = torch_module().from_dlpack(out)
        return t.to(like.device) if like.is_cuda else t
    return np.asarray(out)


def int_list(values, what):
    """A list of Python ints from a list, numpy array or torch tensor."""
    if values is None:
        return None
    if is_torch(values) or isinstance(values, np.ndarray):
        values = values.tolist()
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a sequence of integers, got {values!r}") from None


def like_ints(values, like):
    """A 1-D int64 tensor of values in the framework of `like`."""
    arr = np.asarray(values, dtype=np.int64)
    if is_torch(like):
        return torch_module().from_numpy(arr)
    return arr


class InFlightGuard:
    """Remembers where a torch tensor's memory was when its operation was
    enqueued. torch's resize_() may reallocate the storage under an exported
    tensor; that cannot be prevented from outside, but it is detected when the
    operation is synchronized, rather than returning a silently wrong result.
    numpy refuses to resize an array that is exported, so needs no guard."""

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
