"""Run on every rank of a job spread over several (simulated) hosts: checks
gyre's rank, size, local_rank, local_size, cross_rank and cross_size against
what the host names say, and that collectives across hosts are right.
Exits non-zero on any rank whose view is wrong; prints one line on rank 0."""
import socket
import sys

import torch

import gyre.torch as hvd


def main():
    hvd.init()
    hosts = hvd.allgather_object(socket.gethostname())
    me = hvd.rank()
    assert hvd.size() == len(hosts), (hvd.size(), hosts)
    same_host = [r for r, h in enumerate(hosts) if h == hosts[me]]
    local_rank = same_host.index(me)
    # Each rank's local rank, from the host names alone.
    locals_ = [[r for r, h in enumerate(hosts) if h == hosts[q]].index(q) for q in range(len(hosts))]
    same_local = [r for r in range(len(hosts)) if locals_[r] == local_rank]
    want = {
        "local_rank": local_rank,
        "local_size": len(same_host),
        "cross_rank": same_local.index(me),
        "cross_size": len(same_local),
    }
    got = {k: getattr(hvd, k)() for k in want}
    ok = got == want
    if not ok:
        print(f"rank {me} on {hosts[me]}: got {got}, want {want}", file=sys.stderr)
    # Collectives across the hosts.
    total = hvd.allreduce(torch.full((1000,), float(me)), op=hvd.Sum)
    ok &= bool(torch.all(total == sum(range(hvd.size()))))
    gathered = hvd.allgather(torch.full((me + 1, 2), me, dtype=torch.int32))
    ok &= gathered.shape[0] == sum(r + 1 for r in range(hvd.size()))
    oks = hvd.allgather_object(ok)
    if me == 0:
        print(f"topology over {len(set(hosts))} hosts, {len(hosts)} ranks: "
              f"{'all ranks right' if all(oks) else 'WRONG on ranks ' + str([r for r, o in enumerate(oks) if not o])}")
    hvd.shutdown()
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
