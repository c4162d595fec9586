"""GyreProcessGroup: torch.distributed's collectives on gyre's runtime.

Each collective becomes one gyre operation (several only for a list of
tensors), enqueued at once; it returns a GyreWork whose future gyre's
completion callback completes. Operations are named "torch.<group>.<seq>":
ranks issue a group's collectives in the same order (torch's own rule), so
the names pair up, and a rank that issues a different collective, shape,
dtype, op or root under the same name gets gyre's MismatchError, on every
rank. An argument this rank cannot accept (a wrong output size, an op gyre
lacks) is a refusal passed to the runtime, which announces it to the other
ranks: every rank's call fails with the same reason instead of hanging.

Collectives are reshaped onto gyre's: allgather, gather and reduce_scatter
flatten each rank's tensor to one row; scatter is an alltoall in which only
the root sends; barrier is a one-element allreduce. send, recv and
recv_anysource are gyre's point-to-point operations (gyre.h: send_async),
which run beside the collectives on a communicator of their own and are
not named: they pair by process set, tag and order, as in torch.
"""

import itertools
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from gyre import _gyre
from gyre.ops import ReduceOp as _GyreOp

from ._arguments import _flat, _reduce_op, _tensor_refusal
from ._sync_and_p2p import _SyncAndPointToPoint
from ._work import GyreWork


class GyreProcessGroup(_SyncAndPointToPoint, dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on gyre."""

    def __init__(self, rank: int, size: int, tag: str, process_set: Any = None,
                 index: int = 0) -> None:
        super().__init__(rank, size)
        self._tag = tag
        # The group's index among the groups on its process set (the same on
        # every member): point-to-point tags carry it in their high 32 bits,
        # so that groups sharing a process set (new_group() of every rank and
        # the default group) never pair their messages.
        self._p2p_scope = int(index) << 32
        # The gyre process set the group runs on (a subgroup's; the global
        # set for the default group): its id goes with every operation.
        self._ps = 0 if process_set is None else int(process_set.process_set_id)
        self._ranks = None if process_set is None or self._ps == 0 else list(process_set.ranks)
        self._group_name = ""
        self._group_desc = ""
        # The group's operation count: next() of an itertools.count is
        # atomic in CPython (one C call under the GIL), so threads issuing
        # collectives of the group never get the same number.
        self._seq = itertools.count()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "gyre"

    def name(self) -> str:
        return "gyre"

    # torch keeps a group's name and description in the backend, which a
    # Python group replaces (FSDP looks groups up by name).
    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def _world_rank(self, group_rank: int) -> int:
        """torch passes roots as ranks in the group; gyre takes world ranks.
        A rank outside the group stays out of range, for gyre to refuse."""
        if self._ranks is None:
            return group_rank
        if 0 <= group_rank < len(self._ranks):
            return self._ranks[group_rank]
        return -1 - group_rank if group_rank < 0 else 1 << 30

    def _name(self) -> str:
        return f"torch.{self._tag}.{next(self._seq)}"

    # Reductions ----------------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> GyreWork:
        return self._allreduce(tensors, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> GyreWork:
        return self._allreduce(tensors, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

    def _allreduce(self, tensors: List[torch.Tensor], op: Any) -> GyreWork:
        refusal = _tensor_refusal(tensors, "allreduce")  # sparse tensors too: one pass
        if refusal and any(isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo
                           for t in tensors):
            return self._sparse_allreduce(tensors, op)
        name = self._name()
        gop, pre, op_refusal = _reduce_op(op)
        refusal = op_refusal or refusal
        # A contiguous tensor goes as it is (the extension reads its memory
        # through torch's accessors, requires_grad or not); another, as a
        # contiguous copy whose result finish() copies back.
        bufs = ([t if t.is_contiguous() else t.detach().contiguous() for t in tensors]
                if not refusal else [None])
        if len(bufs) == 1:
            # Positional: pybind11 parses a keyword argument for about 1 us.
            pending = _gyre.allreduce(name, bufs[0], None, gop, pre, 1.0, refusal, self._ps)
        else:
            names = [f"{name}.{i}" for i in range(len(bufs))]
            pending = _gyre.grouped_allreduce(names, bufs, None, gop, pre, 1.0, refusal,
                                              process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            for t, b in zip(tensors, bufs):
                if b is not t:  # a contiguous copy of a strided tensor
                    t.copy_(b)
            return list(tensors)

        return GyreWork([pending], finish)

    def _sparse_allreduce(self, tensors: List[torch.Tensor], op: Any) -> GyreWork:
        """A sum of sparse COO tensors, as gloo's: every rank's indices and
        values are gathered (ranks may hold different numbers of nonzeros)
        and coalesced; the result replaces each tensor's contents."""
        gop, pre, refusal = _reduce_op(op)
        if not refusal and (gop != int(_GyreOp.SUM) or pre != 1.0):
            refusal = "allreduce of sparse tensors: only ReduceOp.SUM is supported (as on gloo)"
        if not refusal and any(not isinstance(t, torch.Tensor) or t.layout != torch.sparse_coo
                               for t in tensors):
            refusal = "allreduce: a list mixing sparse and dense tensors"
        pendings, parts = [], []
        for i, t in enumerate(tensors if not refusal else [None]):
            name = self._name()
            c = None if refusal else t.detach().coalesce()
            # Indices as rows of (sparse_dim) and values as rows of their
            # dense shape, so that each rank's nonzeros are its own rows.
            idx = None if refusal else c.indices().t().contiguous()
            val = None if refusal else c.values().reshape(c.values().shape[0], -1).contiguous()
            p_idx = _gyre.allgather(f"{name}.indices", idx, refusal, process_set=self._ps)
            p_val = _gyre.allgather(f"{name}.values", val, refusal, process_set=self._ps)
            pendings += [p_idx, p_val]
            parts.append((t, c, p_idx, p_val))

        def finish() -> List[torch.Tensor]:
            for t, c, p_idx, p_val in parts:
                idx = torch.from_dlpack(p_idx.output()).t()
                val = torch.from_dlpack(p_val.output()).reshape((-1,) + tuple(c.values().shape[1:]))
                total = torch.sparse_coo_tensor(idx, val, c.shape).coalesce()
                t.copy_(total)
            return list(tensors)

        return GyreWork(pendings, finish)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> GyreWork:
        """Only the root's tensor receives the result; the others' are untouched."""
        name = self._name()
        gop, pre, refusal = _reduce_op(opts.reduceOp)
        refusal = refusal or _tensor_refusal(tensors, "reduce")
        if not refusal and len(tensors) != 1:
            refusal = f"reduce takes one tensor per rank, got {len(tensors)}"
        root = opts.rootRank
        buf = None if refusal else tensors[0].detach().contiguous()
        out = None if refusal or self.rank() == root else torch.empty_like(buf)
        pending = _gyre.allreduce(name, buf, out, gop, pre, 1.0, refusal, process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            if out is None and buf.data_ptr() != tensors[0].data_ptr():
                tensors[0].copy_(buf)
            return list(tensors)

        return GyreWork([pending], finish)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any = None) -> GyreWork:
        refusal = ""
        if len(outputs) != 1 or len(input_lists) != 1:
            refusal = "reduce_scatter takes one output tensor and one input list per rank"
        elif len(input_lists[0]) != self.size():
            refusal = (f"reduce_scatter: the input list holds {len(input_lists[0])} tensors, "
                       f"expected one per rank ({self.size()})")
        elif any(t.numel() != outputs[0].numel() for t in input_lists[0]):
            refusal = "reduce_scatter: every input tensor must have the output's number of elements"
        x = None if refusal else torch.cat([_flat(t) for t in input_lists[0]])
        return self._reduce_scatter(x, outputs[0] if outputs else None, opts, refusal)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> GyreWork:
        refusal = ""
        if input.numel() != output.numel() * self.size():
            refusal = (f"reduce_scatter_tensor: the input has {input.numel()} elements, expected "
                       f"the output's {output.numel()} times the world size {self.size()}")
        x = None if refusal else input.detach().contiguous().reshape(self.size(), -1)
        return self._reduce_scatter(x, output, opts, refusal)

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, x: Optional[torch.Tensor], output: Optional[torch.Tensor],
                        opts: Any, refusal: str) -> GyreWork:
        name = self._name()
        gop, pre, op_refusal = _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        pending = _gyre.reducescatter(name, x, gop, pre, 1.0, op_refusal or refusal,
                                      process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            output.copy_(torch.from_dlpack(pending.output()).view(output.shape))
            return [output]

        return GyreWork([pending], finish)

    # Data movement -------------------------------------------------------------

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> GyreWork:
        name = self._name()
        refusal = _tensor_refusal(tensors, "broadcast")
        bufs = [None] if refusal else [t.detach().contiguous() for t in tensors]
        pendings = [
            _gyre.broadcast(name if len(bufs) == 1 else f"{name}.{i}", b,
                            self._world_rank(opts.rootRank), refusal, process_set=self._ps)
            for i, b in enumerate(bufs)
        ]

        def finish() -> List[torch.Tensor]:
            for t, b in zip(tensors, bufs):
                if b.data_ptr() != t.data_ptr():
                    t.copy_(b)
            return list(tensors)

        return GyreWork(pendings, finish)

    def _allgather_rows(self, input: torch.Tensor, refusal: str):  # noqa: A002
        """Starts an allgather of each rank's tensor as one row: (world, numel)."""
        name = self._name()
        x = None if refusal else _flat(input)
        pending = _gyre.allgather(name, x, refusal, process_set=self._ps)
        return pending, lambda: torch.from_dlpack(pending.output())

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                  opts: Any = None) -> GyreWork:
        refusal = _tensor_refusal(inputs, "allgather")
        if not refusal and (len(inputs) != 1 or len(output_lists) != 1):
            refusal = "allgather takes one input tensor and one output list per rank"
        elif not refusal and len(output_lists[0]) != self.size():
            refusal = (f"allgather: the output list holds {len(output_lists[0])} tensors, "
                       f"expected one per rank ({self.size()})")
        elif not refusal and any(o.numel() != inputs[0].numel() or o.dtype != inputs[0].dtype
                                 for o in output_lists[0]):
            refusal = "allgather: every output tensor must have the input's size and dtype"
        pending, rows = self._allgather_rows(inputs[0] if inputs else None, refusal)

        def finish() -> List[List[torch.Tensor]]:
            r = rows()
            for i, o in enumerate(output_lists[0]):
                o.copy_(r[i].view(o.shape))
            return output_lists

        return GyreWork([pending], finish)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> GyreWork:
        refusal = ""
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            refusal = (f"all_gather_into_tensor: the output has {output.numel()} elements of "
                       f"{output.dtype}, expected {input.numel()} x world size {self.size()} "
                       f"of {input.dtype}")
        pending, rows = self._allgather_rows(input, refusal)

        def finish() -> List[torch.Tensor]:
            output.copy_(rows().view(output.shape))
            return [output]

        return GyreWork([pending], finish)

    _allgather_base = all_gather_single

    def gather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
               opts: Any) -> GyreWork:
        root = opts.rootRank
        refusal = _tensor_refusal(inputs, "gather")
        if not refusal and self.rank() == root and (
                len(output_lists) != 1 or len(output_lists[0]) != self.size()):
            refusal = f"gather: the root needs an output list of {self.size()} tensors"
        pending, rows = self._allgather_rows(inputs[0] if inputs else None, refusal)

        def finish() -> List[List[torch.Tensor]]:
            if self.rank() == root:
                r = rows()
                for i, o in enumerate(output_lists[0]):
                    o.copy_(r[i].view(o.shape))
            return output_lists

        return GyreWork([pending], finish)

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                opts: Any) -> GyreWork:
        """An alltoall in which the root sends row r to rank r and the others
        send nothing."""
        name = self._name()
        root, size = opts.rootRank, self.size()
        refusal = _tensor_refusal(outputs, "scatter")
        x, splits = None, [0] * size
        if not refusal and self.rank() == root:
            if len(input_lists) != 1 or len(input_lists[0]) != size:
                refusal = f"scatter: the root needs an input list of {size} tensors"
            elif any(t.numel() != outputs[0].numel() for t in input_lists[0]):
                refusal = "scatter: every input tensor must have the output's number of elements"
            else:
                x = torch.cat([_flat(t) for t in input_lists[0]])
                splits = [1] * size
        elif not refusal:
            x = outputs[0].new_empty((0, outputs[0].numel()))
        pending = _gyre.alltoall(name, x, splits, refusal, process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            outputs[0].copy_(torch.from_dlpack(pending.output()).view(outputs[0].shape))
            return outputs

        return GyreWork([pending], finish)

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                 opts: Any = None) -> GyreWork:
        name = self._name()
        refusal = _tensor_refusal(inputs, "all_to_all") or _tensor_refusal(outputs, "all_to_all")
        if not refusal and (len(inputs) != self.size() or len(outputs) != self.size()):
            refusal = f"all_to_all: the input and output lists need {self.size()} tensors each"
        elif not refusal and len({t.dtype for t in list(inputs) + list(outputs)}) != 1:
            refusal = "all_to_all: every input and output tensor must have one dtype"
        x = None if refusal else torch.cat([t.detach().reshape(-1) for t in inputs])
        splits = [] if refusal else [t.numel() for t in inputs]
        pending = _gyre.alltoall(name, x, splits, refusal, process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            got = list(pending.received_splits())
            want = [o.numel() for o in outputs]
            if got != want:
                raise ValueError(f"all_to_all: received {got} elements from the ranks, but the "
                                 f"output tensors hold {want}")
            for o, piece in zip(outputs, torch.from_dlpack(pending.output()).split(got)):
                o.copy_(piece.view(o.shape))
            return outputs

        return GyreWork([pending], finish)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: List[int], input_split_sizes: List[int],
                          opts: Any = None) -> GyreWork:
        name = self._name()
        size, rows = self.size(), (input.shape[0] if input.dim() else 1)
        refusal = ""
        splits = list(input_split_sizes)
        if not splits:
            if rows % size:
                refusal = (f"all_to_all_single: the input's first dimension ({rows}) does not "
                           f"divide by the world size {size}; pass input_split_sizes")
            splits = [rows // size] * size
        x = None if refusal else input.detach().contiguous().reshape(rows, -1)
        pending = _gyre.alltoall(name, x, splits, refusal, process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            got = list(pending.received_splits())
            if output_split_sizes and got != list(output_split_sizes):
                raise ValueError(f"all_to_all_single: received rows {got} from the ranks, "
                                 f"output_split_sizes says {list(output_split_sizes)}")
            out = torch.from_dlpack(pending.output())
            if out.numel() != output.numel():
                raise ValueError(f"all_to_all_single: received {out.numel()} elements, the "
                                 f"output holds {output.numel()}")
            output.copy_(out.view(output.shape))
            return [output]

        return GyreWork([pending], finish)

    alltoall_base = all_to_all_single

    # Coalesced collectives (torch's _coalescing_manager, FSDP) ----------------------
    # Each collective of the batch is already asynchronous: the batch is
    # their union.

    def _start_coalescing(self, device: Any) -> None:
        del device

    def _end_coalescing(self, device: Any) -> GyreWork:
        del device
        return GyreWork([], lambda: [])

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]],
                            inputs: List[torch.Tensor], opts: Any = None) -> GyreWork:
        """torch's layout: output_lists[rank][i] receives that rank's
        inputs[i]. The inputs travel as one row (their elements end to end)
        in one allgather, cut back into tensors on arrival."""
        size = self.size()
        refusal = _tensor_refusal(inputs, "all_gather_coalesced")
        if not refusal and len(output_lists) != size:
            refusal = (f"all_gather_coalesced: {len(output_lists)} output lists, expected one "
                       f"per rank ({size})")
        elif not refusal and any(len(out) != len(inputs) for out in output_lists):
            refusal = (f"all_gather_coalesced: every output list needs one tensor per input "
                       f"({len(inputs)})")
        elif not refusal and any(o.numel() != i.numel() or o.dtype != i.dtype
                                 for out in output_lists for o, i in zip(out, inputs)):
            refusal = ("all_gather_coalesced: output_lists[rank][i] must have inputs[i]'s "
                       "number of elements and dtype")
        elif not refusal and len({t.dtype for t in inputs}) != 1:
            refusal = "all_gather_coalesced: every input tensor must have one dtype"
        row = None if refusal else torch.cat([t.detach().reshape(-1) for t in inputs])
        pending, rows = self._allgather_rows(row, refusal)
        counts = [] if refusal else [t.numel() for t in inputs]

        def finish() -> List[List[torch.Tensor]]:
            gathered = rows()
            for r, out in enumerate(output_lists):
                for o, piece in zip(out, gathered[r].split(counts)):
                    o.copy_(piece.view(o.shape))
            return output_lists

        return GyreWork([pending], finish)

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor],
                                    inputs: List[torch.Tensor], opts: Any = None) -> GyreWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return GyreWork(works, lambda: outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor],
                                        inputs: List[torch.Tensor], opts: Any = None) -> GyreWork:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return GyreWork(works, lambda: outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
