"""A point-to-point peer that never comes ends in bounded time, with the peer
named: run under mpirun -np 2 (or more) with GYRE_STALL_SHUTDOWN_S=2.

  - rank 0's recv from rank 1, which never sends: TimeoutError naming rank 1;
  - rank 1's send to rank 0, which never receives: TimeoutError naming rank 0;
    when rank 0 posts that recv later, it is told the send was withdrawn
    (an error, never a silent result);
  - a recv from any source that nobody sends to;
  - afterwards the pair still exchanges correctly.
Exits non-zero on any failure. Each case fails within 10 s (the old
behaviour: refused at once; a hang would be far longer)."""

import os
import sys
import time

import torch
import torch.distributed as dist

import gyre
import gyre.torch.distributed  # noqa: F401 (registers the backend)

BOUND_S = 10.0


def expect_timeout(fn, *needles):
    start = time.monotonic()
    try:
        fn()
    except gyre.TimeoutError as e:
        took = time.monotonic() - start
        msg = str(e)
        for n in needles:
            assert n in msg, f"'{n}' not in the error: {msg}"
        assert took < BOUND_S, f"took {took:.1f} s"
        return msg
    raise AssertionError("no TimeoutError")


def main():
    assert float(os.environ.get("GYRE_STALL_SHUTDOWN_S", "0")) <= 3, \
        "run with GYRE_STALL_SHUTDOWN_S=2"
    dist.init_process_group("gyre")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size >= 2
    # Every rank waits out one deadline at the same time, so that none waits
    # in the barrier below longer than the short deadline allows collectives.
    if rank == 0:
        w1 = dist.irecv(torch.empty(3), src=1, tag=1)
        w2 = dist.irecv(torch.empty(3), tag=2)
        expect_timeout(w1.wait, "recv from rank 1", "rank 1 sent no matching message",
                       "GYRE_STALL_SHUTDOWN_S")
        expect_timeout(w2.wait, "recv from any rank", "no rank sent")
    elif rank == 1:
        expect_timeout(lambda: dist.send(torch.ones(3), dst=0, tag=5),
                       "send to rank 0", "no matching recv was posted on rank 0")
    else:
        expect_timeout(lambda: dist.recv(torch.empty(3), src=1, tag=9),
                       "rank 1 sent no matching message")
    dist.barrier()
    if rank == 0:
        # rank 1's send of tag 5 gave up before this recv: told, not paired.
        expect_timeout(lambda: dist.recv(torch.empty(3), src=1, tag=5), "rank 1 withdrew")
    dist.barrier()
    if rank in (0, 1):
        peer = 1 - rank
        s = dist.isend(torch.full((4,), float(rank)), dst=peer, tag=5)
        t = torch.empty(4)
        dist.recv(t, src=peer, tag=5)
        s.wait()
        assert t.tolist() == [float(peer)] * 4, t
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("torch_p2p_deadline: ok")


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001
        print(f"rank {os.environ.get('OMPI_COMM_WORLD_RANK')}: FAILED: {e!r}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
