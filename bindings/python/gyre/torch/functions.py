"""Broadcasting a model's parameters and an optimizer's state from one rank."""

import math

import torch

from gyre import ops
from gyre.basics import check_process_set, global_process_set
from gyre.exceptions import InvalidArgumentError, InvalidTypeError
from gyre.objects import broadcast_object

# dtypes gyre does not move, and the dtype of the same width they travel as.
_STAGED_DTYPES = {torch.bool: torch.uint8, torch.int16: torch.int32, torch.uint16: torch.int32}


class Staged:
    """A tensor as gyre can take it: itself when it is contiguous and of a
    supported dtype, else a contiguous copy in a supported dtype that
    ``write_back()`` copies into the original after an in-place operation."""

    __slots__ = ("original", "tensor")

    def __init__(self, tensor):
        self.original = tensor
        t = tensor.detach()
        staged_dtype = _STAGED_DTYPES.get(t.dtype)
        if staged_dtype is not None:
            t = t.to(staged_dtype)
        if not t.is_contiguous():
            t = t.contiguous()
        self.tensor = t

    def write_back(self):
        if self.tensor.data_ptr() != self.original.data_ptr() or self.tensor.dtype != self.original.dtype:
            with torch.no_grad():
                self.original.copy_(self.tensor.to(self.original.dtype))


def named_tensors(params, what):
    """[(name, tensor)] from a state_dict, a dict, or an iterable of (name, tensor)."""
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: kv[0])
    else:
        try:
            items = list(params)
        except TypeError:
            raise InvalidTypeError(f"{what}: invalid params of type {type(params).__name__}: "
                                   "expected a dict or (name, tensor) pairs") from None
    checked = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise InvalidArgumentError(
                f"{what}: expected a dict or (name, tensor) pairs, got an element {item!r}")
        name, t = item
        if t is None:  # Horovod skips entries without a tensor
            continue
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{what}: '{name}' is a {type(t).__name__}, not a tensor")
        checked.append((name, t))
    names = [n for n, _ in checked]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InvalidArgumentError(f"{what}: duplicate names {dup}")
    return checked


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies root_rank's tensors into every rank's, in place. `params` is a
    state_dict (``model.state_dict()``), any dict of tensors, or
    ``model.named_parameters()``; None entries are skipped. All broadcasts
    are enqueued, then awaited."""
    check_process_set(process_set, "broadcast_parameters")
    staged = [(name, Staged(t)) for name, t in named_tensors(params, "broadcast_parameters")]
    handles = [ops.broadcast_async_(s.tensor, root_rank, name=f"broadcast_parameters.{name}",
                                    process_set=process_set)
               for name, s in staged]
    for h in handles:
        ops.synchronize(h)
    for _, s in staged:
        s.write_back()


class _TensorSlot:
    """Stands for the index-th tensor of a state_dict in the pickled skeleton."""

    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype

    def __getstate__(self):
        return (self.index, self.shape, self.dtype)

    def __setstate__(self, state):
        self.index, self.shape, self.dtype = state


def _strip(obj, tensors):
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _slots(obj, found):
    if isinstance(obj, _TensorSlot):
        found.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _slots(v, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _slots(v, found)
    return found


def _fill(obj, tensors):
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Gives every rank root_rank's optimizer state (per-parameter state such
    as momentum buffers, and the hyper-parameters of each group). The
    structure travels pickled; the tensors travel as broadcasts. Works for
    every torch optimizer, LBFGS included (Horovod refuses it), when other
    ranks have no state yet (state created lazily by the first step), with
    None and scalar entries, and with parameters that have no state (no
    gradient yet). `model` is Horovod's (it restores the parameters around
    the dummy step Horovod takes to create lazy state); gyre takes no dummy
    step, so it needs no model and ignores it. As after Horovod's dummy
    step, on a rank whose optimizer has no state yet every parameter that
    requires grad and has no gradient is given a zero gradient (sparse for
    SparseAdam), which scripts written for Horovod read; parameters that do
    not require grad keep None."""
    del model
    check_process_set(process_set, "broadcast_optimizer_state")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidTypeError(
            f"broadcast_optimizer_state: expected a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}")
    if not optimizer.state:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    zero = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    p.grad = zero.to_sparse() if isinstance(optimizer, torch.optim.SparseAdam) \
                        else zero
    is_root = ops.rank() == root_rank
    tensors = []
    skeleton = _strip(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state.skeleton",
                                process_set=process_set)
    slots = sorted(_slots(skeleton, []), key=lambda s: s.index)
    if not is_root:
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    staged = [Staged(t) for t in tensors]
    handles = [ops.broadcast_async_(s.tensor, root_rank, name=f"broadcast_optimizer_state.{i}",
                                    process_set=process_set)
               for i, s in enumerate(staged)]
    for h in handles:
        ops.synchronize(h)
    if not is_root:
        for s in staged:
            s.write_back()
        optimizer.load_state_dict(_fill(skeleton, tensors))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's allreduce of a sparse COO tensor: every rank's non-zeros
    are allgathered in one operation named `name` (each row: the indices,
    then the values' bytes), values divided by the number of ranks for
    Average. Returns a callable (as Horovod does) that waits and returns the
    reduced sparse tensor; ``synchronize()`` takes it too. Duplicate indices
    are left uncoalesced (they add up when used, as in Horovod). One
    operation, so a rank that reduces the same name dense fails with the
    others in one round (MismatchError) rather than leaving a second
    operation waiting."""
    check_process_set(process_set, "sparse_allreduce_async")
    if not (isinstance(tensor, torch.Tensor) and tensor.is_sparse):
        raise InvalidTypeError(f"sparse_allreduce_async: '{name}' is not a sparse torch tensor")
    op = ops._reduce_op(None, op)
    if op not in (ops.Sum, ops.Average):
        raise InvalidArgumentError(
            f"sparse_allreduce_async: '{name}': op {op.name}: only Sum and Average are defined "
            "for sparse tensors (gathered indices and values)")
    # Allgather concatenates along the first dimension: one row per non-zero,
    # its indices (int64) and its values, as bytes.
    sd = tensor.sparse_dim()
    nnz = tensor._nnz()
    dense_shape = tuple(tensor.shape[sd:])
    # (Copied into fresh dense tensors: .contiguous() may keep a size-1
    # dimension's odd stride, which view(torch.uint8) refuses.)
    idx = torch.empty((nnz, sd), dtype=torch.int64).copy_(tensor._indices().t())
    width = math.prod(dense_shape)
    val = torch.empty((nnz, width), dtype=tensor.dtype).copy_(tensor._values().reshape(nnz, width))
    idx_bytes = idx.view(torch.uint8).reshape(nnz, sd * 8)
    val_bytes = val.view(torch.uint8).reshape(nnz, width * val.element_size())
    rows = torch.cat([idx_bytes, val_bytes], dim=1)
    handle = ops.allgather_async(rows, name=name, process_set=process_set)
    dtype = tensor.dtype

    def wait():
        out = ops.synchronize(handle)
        total = out.shape[0]
        idx = out[:, :sd * 8].contiguous().view(torch.int64).reshape(total, sd)
        vals = out[:, sd * 8:].contiguous().view(dtype).reshape(total, *dense_shape)
        if op == ops.Average:
            vals = vals / (ops.size() if process_set is None or process_set is global_process_set
                           else process_set.size())
        return torch.sparse_coo_tensor(idx.t(), vals, tensor.size(), check_invariants=True)

    return wait
