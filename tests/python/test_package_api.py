"""What the installed package declares: type hints on the public API (with the
py.typed marker that tells type checkers to read them), and DLPack device
numbers taken from the extension rather than written twice."""

import inspect
import pathlib

import numpy as np
import torch

import gyre


def test_py_typed_marker_is_installed():
    assert (pathlib.Path(gyre.__file__).parent / "py.typed").is_file()


def test_public_functions_are_annotated():
    unannotated = []
    for name in gyre.__all__:
        obj = getattr(gyre, name)
        if not inspect.isfunction(obj):
            continue
        sig = inspect.signature(obj)
        missing = [p for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
        if missing or sig.return_annotation is inspect.Signature.empty:
            unannotated.append(name)
    # objects.py (broadcast_object, allgather_object) is annotated separately.
    unannotated = [n for n in unannotated if n not in ("broadcast_object", "allgather_object")]
    assert unannotated == []


def test_dlpack_device_numbers_match_producers():
    assert torch.ones(1).__dlpack_device__()[0] == gyre._gyre.DLPACK_CPU
    assert np.ones(1).__dlpack_device__()[0] == gyre._gyre.DLPACK_CPU
    assert len({gyre._gyre.DLPACK_CPU, gyre._gyre.DLPACK_CUDA, gyre._gyre.DLPACK_CUDA_HOST,
                gyre._gyre.DLPACK_CUDA_MANAGED, gyre._gyre.DLPACK_ROCM}) == 5
