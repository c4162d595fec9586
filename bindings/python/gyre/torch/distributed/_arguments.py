"""The arguments of GyreProcessGroup's collectives: torch's reduction ops as
gyre's, and the checks and reshapes of the tensors passed in."""

from typing import Any, Sequence, Tuple

import torch
import torch.distributed as dist

from gyre.ops import ReduceOp as _GyreOp

_RedOpType = dist.ReduceOp.RedOpType
# torch's ops as gyre's op numbers (what the extension takes).
_OPS = {
    _RedOpType.SUM: int(_GyreOp.SUM),
    _RedOpType.AVG: int(_GyreOp.AVERAGE),
    _RedOpType.MIN: int(_GyreOp.MIN),
    _RedOpType.MAX: int(_GyreOp.MAX),
    _RedOpType.PRODUCT: int(_GyreOp.PRODUCT),
}
# The same by the ops' integer values: an enum's .value and an int lookup
# cost a fifth of hashing and comparing the pybind11 enum itself.
_OPS_BY_VALUE = {k.value: v for k, v in _OPS.items()}


def _reduce_op(op: Any) -> Tuple[int, float, str]:
    """torch's ReduceOp as (gyre op, prescale factor, refusal). torch passes
    a ReduceOp (options) or a bare RedOpType (``group.allreduce([t])``: no
    options), which isinstance also takes for a ReduceOp."""
    kind = getattr(op, "op", op)
    gop = _OPS_BY_VALUE.get(getattr(kind, "value", None))
    if gop is not None:  # the usual case first: one dict lookup
        return gop, 1.0, ""
    if kind == _RedOpType.PREMUL_SUM:
        factor = op.__getstate__()[1]
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return int(_GyreOp.SUM), float(factor), ""
    return int(_GyreOp.SUM), 1.0, f"reduce op {kind} is not supported by the gyre backend " \
        "(supported: SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM)"


def _tensor_refusal(tensors: Sequence[Any], what: str) -> str:
    if len(tensors) == 0:
        return f"{what}: an empty tensor list"
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return f"{what}: expected torch tensors, got {type(t).__name__}"
        if t.layout != torch.strided:
            return f"{what}: {t.layout} tensors are not supported by the gyre backend"
    return ""


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t as one contiguous row (a view when t is contiguous)."""
    return t.detach().reshape(1, -1).contiguous()
