"""Gradient compression for allreduce: ``gyre.Compression.none`` and ``.fp16``.

A compressor turns a tensor into what travels (``compress`` -> (tensor, ctx))
and back (``decompress(tensor, ctx)``). Works on torch tensors and numpy
arrays alike.
"""

import numpy as np

from . import _tensors


class Compressor:
    """Interface: subclasses override both static methods."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends float32/float64 tensors as float16 (half the bytes; gyre sums
    float16 in float32 and rounds once). Other dtypes travel unchanged."""

    @staticmethod
    def compress(tensor):
        if _tensors.is_torch(tensor):
            torch = _tensors.torch_module()
            if tensor.dtype in (torch.float32, torch.float64):
                return tensor.detach().to(torch.float16), tensor.dtype
            return tensor, None
        arr = np.asarray(tensor)
        if arr.dtype in (np.float32, np.float64):
            return arr.astype(np.float16), arr.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is None:
            return tensor
        if _tensors.is_torch(tensor):
            return tensor.to(ctx)
        return np.asarray(tensor).astype(ctx)


class Compression:
    """Horovod's names: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
