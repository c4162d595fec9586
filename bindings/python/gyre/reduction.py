"""The reduction of a call: gyre's ReduceOp (Horovod's Sum, Average, Min, Max,
Product, Adasum) and the conversion of a call's op=, average= and scale
arguments (re-exported by gyre.ops and gyre)."""

import enum
from typing import Any, Optional, Tuple, Union

from . import _tensors as _t
from .exceptions import InvalidArgumentError

Op = Union["ReduceOp", int]


class ReduceOp(enum.IntEnum):
    """Reduction operations; the values are the runtime's gyre::ReduceOp."""

    SUM = 0
    AVERAGE = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4
    # Adaptive summation (Maleki et al., MLSys 2021): runtimes built without
    # it refuse the op ("unknown reduction op 5") on every rank.
    ADASUM = 5


Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM

def _reduce_op(average: Optional[bool], op: Optional[Op]) -> ReduceOp:
    """Horovod's average= and op= as one ReduceOp; raises InvalidArgumentError."""
    if average is not None and op is not None:
        raise InvalidArgumentError("pass either average= or op=, not both")
    if average is not None:
        return Average if average else Sum
    if op is None:
        return Average
    try:
        return ReduceOp(op)
    except ValueError:
        raise InvalidArgumentError(
            f"unknown reduction op {op!r} (expected gyre.Average, Sum, Min, Max, Product or Adasum)"
        ) from None


# Each op's value, keyed by the op (ints equal to a value find it too): the
# common call converts with one lookup instead of an enum construction.
_OP_VALUES = {o: int(o) for o in ReduceOp}
_OP_VALUES[None] = int(Average)  # Horovod's default


def _op(c: _t.Conversion, average: Optional[bool], op: Optional[Op]) -> int:
    """_reduce_op for a call: a failure becomes the call's refusal."""
    if average is None and type(op) is ReduceOp:
        return _OP_VALUES[op]
    try:
        return int(_reduce_op(average, op))
    except InvalidArgumentError as e:
        c.refuse(str(e))
        return int(Average)


def _scales(c: _t.Conversion, prescale_factor: Any, postscale_factor: Any) -> Tuple[float, float]:
    if type(prescale_factor) is float and type(postscale_factor) is float:
        return prescale_factor, postscale_factor
    return c.number(prescale_factor, "prescale_factor"), c.number(postscale_factor,
                                                                  "postscale_factor")
