"""Gradient compression for allreduce: ``gyre.Compression.none``, ``.fp16`` and ``.bf16``.

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


class _CastCompressor(Compressor):
    """Sends float32/float64 tensors as a narrower float type; other dtypes
    travel unchanged. Subclasses name the types."""

    torch_dtype_name = ""
    numpy_dtype = None

    @classmethod
    def compress(cls, tensor):
        if _tensors.is_torch(tensor):
            torch = _tensors.torch_module()
            if tensor.dtype in (torch.float32, torch.float64):
                # A differentiable cast, as in Horovod: gradients flow through.
                return tensor.to(getattr(torch, cls.torch_dtype_name)), tensor.dtype
            return tensor, None
        arr = np.asarray(tensor)
        if cls.numpy_dtype is not None and arr.dtype in (np.float32, np.float64):
            return arr.astype(cls.numpy_dtype), arr.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is None:
            return tensor
        if _tensors.is_torch(tensor):
            return tensor.to(ctx)
        return np.asarray(tensor).astype(ctx)


class FP16Compressor(_CastCompressor):
    """float32/float64 travel as float16 (half the bytes; gyre sums float16 in
    float32 and rounds once)."""

    torch_dtype_name = "float16"
    numpy_dtype = np.float16


class BF16Compressor(_CastCompressor):
    """float32/float64 travel as bfloat16 (half the bytes, float32's range,
    8 bits of mantissa). numpy has no bfloat16: numpy arrays travel unchanged."""

    torch_dtype_name = "bfloat16"


class Compression:
    """Horovod's names: ``Compression.none`` and ``Compression.fp16``; and
    ``Compression.bf16``. Any Compressor subclass (or object with compress
    and decompress) may be passed where these are."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
