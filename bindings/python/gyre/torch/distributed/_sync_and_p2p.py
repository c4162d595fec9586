"""GyreProcessGroup's barriers and point-to-point operations (send, recv,
recv_anysource), a mixin of the group (_process_group.py): a barrier is a
one-element allreduce; send and recv are gyre's point-to-point operations."""

from datetime import timedelta
from typing import Any, List, Optional

import torch

from gyre import _gyre
from gyre import exceptions as gyre_exceptions
from gyre.ops import ReduceOp as _GyreOp

from ._arguments import _tensor_refusal
from ._work import GyreWork


class _SyncAndPointToPoint:
    """Synchronisation and point to point of GyreProcessGroup (which provides
    _name, _ps, _ranks, _p2p_scope and _world_rank)."""

    def barrier(self, opts: Any = None) -> GyreWork:
        """A one-element allreduce. A timeout in the options (positive:
        torch's unset one is negative) bounds this barrier alone."""
        timeout = getattr(opts, "timeout", None)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else -1.0
        return self._barrier(seconds if seconds > 0 else None)

    def _barrier(self, seconds: Optional[float]) -> GyreWork:
        name = self._name()
        if seconds is not None:
            # A deadline of this operation's own (the longest prefix wins),
            # dropped once it completed. The set's rank 0 decides: where it
            # never enters this barrier, the group's timeout bounds it.
            _gyre.set_operation_timeout(self._ps, name, max(seconds, 1e-3))
        token = torch.zeros(1)
        pending = _gyre.allreduce(name, token, None, int(_GyreOp.SUM), 1.0, 1.0, "",
                                  process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            return [token]

        work = GyreWork([pending], finish)
        if seconds is not None:
            work.add_done_callback(lambda: _gyre.set_operation_timeout(self._ps, name, 0))
        return work

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier bounded by `timeout` (else the group's timeout): a rank
        that does not arrive in time makes it fail on every rank that
        entered, naming the missing ranks, with gloo's wording. torch's own
        dist.monitored_barrier refuses every backend but gloo by name before
        it gets here; this is the group's method (group.monitored_barrier)."""
        del wait_all_ranks  # gyre's error names every missing rank anyway
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        try:
            self._barrier(seconds).wait()
        except gyre_exceptions.TimeoutError as e:
            after = f" after {seconds * 1000:.0f} ms" if seconds is not None else ""
            raise RuntimeError(
                f"Rank {self.rank()} timed out in monitoredBarrier{after}: {e}") from e

    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0) -> GyreWork:  # noqa: N803
        return self._p2p(True, tensors, dstRank, tag)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0) -> GyreWork:  # noqa: N803
        return self._p2p(False, tensors, srcRank, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> GyreWork:
        return self._p2p(False, tensors, None, tag)

    def _p2p(self, is_send: bool, tensors: List[torch.Tensor], peer: Optional[int],
             tag: int) -> GyreWork:
        """One gyre send or recv on the group's process set. torch passes the
        peer as a rank of the group; gyre takes world ranks, and returns the
        sender's world rank, which the Work gives back as a group rank."""
        what = "send" if is_send else "recv"
        refusal = _tensor_refusal(tensors, what)
        if not refusal and len(tensors) != 1:
            refusal = f"{what} takes one tensor, got {len(tensors)}"
        if not refusal and peer is not None and not 0 <= peer < self.size():
            refusal = (f"{what}: rank {peer} is not a rank of this group "
                       f"(size {self.size()})")
        if not refusal and not -(1 << 31) <= int(tag) < (1 << 31):
            refusal = f"{what}: tag {tag} does not fit in 32 bits"
        gtag = self._p2p_scope | (int(tag) & 0xFFFFFFFF)
        # A peer outside the group stays outside the set (-2), so that gyre
        # does not announce the refusal to a rank that is not the peer.
        world_peer = _gyre.ANY_SOURCE if peer is None else (
            self._world_rank(peer) if 0 <= peer < self.size() else -2)
        t = tensors[0] if not refusal else None
        # gyre's point-to-point runs on host memory: a CUDA tensor is staged
        # through a host copy (not tested here: no GPU on the test machine).
        if refusal:
            buf = None
        elif t.device.type != "cpu":
            buf = t.detach().to("cpu", copy=True) if is_send else torch.empty(
                t.shape, dtype=t.dtype)
        else:
            buf = t.detach() if t.is_contiguous() else t.detach().contiguous()
        if is_send:
            pending = _gyre.send(buf, world_peer, gtag, refusal, process_set=self._ps)
        else:
            pending = _gyre.recv(buf, world_peer, gtag, refusal, process_set=self._ps)

        def finish() -> List[torch.Tensor]:
            if not is_send and (buf.device != t.device or buf.data_ptr() != t.data_ptr()):
                t.copy_(buf)
            return [t]

        def source() -> int:
            src = pending.source_rank()
            return src if self._ranks is None else self._ranks.index(src)

        return GyreWork([pending], finish, source_rank=source)
