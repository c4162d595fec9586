#!/usr/bin/env python3
"""Allreduce sweep through gyre.torch beside torch.distributed (gloo), in the
same job:

    mpirun -np 2 python3 benchmarks/torch_allreduce_perf.py -b 1K -e 64M -f 4

One row per size: bytes, elements, gyre.torch time and busbw, #wrong, gloo's
time and busbw, gloo#wrong, and the ratio gyre busbw / gloo busbw. float32 sum
through gyre.torch.allreduce (a new output tensor per call, Horovod's
semantics), or with --in-place through gyre.torch.allreduce_, or with
--backend through torch.distributed.all_reduce on the "gyre" backend (the
default group made by init_process_group("gyre"); gloo is then a
new_group(backend="gloo") on the same store), beside dist.all_reduce on gloo
(always in place); blocks of back-to-back iterations
alternate between the two, the time of a size is the median over blocks of
the slowest rank's mean per iteration.

Under THP_MEM_ALLOC_ENABLE=1 PyTorch's CPU allocator puts tensors of 2 MiB and
more on transparent huge pages; the table header and the JSON record which
pages the run used ("pages": "huge" or "4K").

torch.distributed is initialised with env:// from Open MPI's
OMPI_COMM_WORLD_RANK/SIZE, MASTER_ADDR=127.0.0.1 (or GYRE_BENCH_MASTER_ADDR:
rank 0's address when the ranks are on several hosts, as under
scripts/hosts.sh, where GLOO_SOCKET_IFNAME=eth0 picks the hosts' link) and a
port rank 0 picks (a free one, or GYRE_BENCH_MASTER_PORT) and sends to the
others with gyre.torch.broadcast_object.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

import gyre.torch as gt


def parse_size(text):
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    digits = text.rstrip("KMGB")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in units:
        raise SystemExit(f"not a size: {text!r} (e.g. 8, 1K, 64M)")
    return int(digits) * units[unit]


def master_addr():
    return os.environ.get("GYRE_BENCH_MASTER_ADDR", "127.0.0.1")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((master_addr(), 0))
        return s.getsockname()[1]


def init_torch_distributed():
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", gt.rank()))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", gt.size()))
    if rank != gt.rank() or world != gt.size():
        raise SystemExit(f"Open MPI says rank {rank} of {world}, gyre says {gt.rank()} of {gt.size()}")
    port = None
    if rank == 0:
        port = int(os.environ.get("GYRE_BENCH_MASTER_PORT", "0")) or free_port()
    port = gt.broadcast_object(port, root_rank=0)
    os.environ["MASTER_ADDR"] = master_addr()
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    return rank, world


def expected(count, world):
    i = torch.arange(count, dtype=torch.int64)
    return (world * (i % 7) + world * (world - 1) // 2).to(torch.float32)


def fill(count, rank, world):
    i = torch.arange(count, dtype=torch.int64)
    return ((rank + i) % world + i % 7).to(torch.float32)


def main():
    ap = argparse.ArgumentParser(description="gyre.torch vs torch.distributed gloo allreduce sweep")
    ap.add_argument("-b", "--minbytes", default="1K")
    ap.add_argument("-e", "--maxbytes", default="64M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    ap.add_argument("-n", "--iters", type=int, default=5, help="iterations per timed block")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--in-place", action="store_true",
                    help="time gyre.torch.allreduce_ (in place, like gloo) instead of allreduce")
    ap.add_argument("--backend", action="store_true",
                    help="time torch.distributed.all_reduce on the gyre backend (in place)")
    ap.add_argument("--json", help="rank 0 writes the rows here (for plot_bandwidth.py)")
    a = ap.parse_args()
    huge = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
    if a.stepfactor < 2:
        raise SystemExit("-f must be at least 2")

    gt.init()
    gloo_group = None
    if a.backend:
        import gyre.torch.distributed  # noqa: F401  (registers the backend)
        dist.init_process_group("gyre")
        gloo_group = dist.new_group(backend="gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = init_torch_distributed()
    sizes = []
    b = parse_size(a.minbytes)
    while b <= parse_size(a.maxbytes):
        if b >= 4:
            sizes.append(b)
        b *= a.stepfactor

    # Each returns the tensor holding the result.
    def gyre_op(buf, name):
        if a.backend:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            return buf
        if a.in_place:
            return gt.allreduce_(buf, name=name, op=gt.Sum)
        return gt.allreduce(buf, name=name, op=gt.Sum)

    def gloo_op(buf, name):
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=gloo_group)
        return buf

    def time_block(op, buf, src, name):
        # An in-place sum grows the values by a factor n per call; refill
        # between blocks (untimed) so they stay finite.
        buf.copy_(src)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            op(buf, name)
        return (time.perf_counter() - t0) / a.iters

    def slowest(times):
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def wrong_count(op, buf, src, name, want):
        buf.copy_(src)
        result = op(buf, name)
        w = torch.tensor([int((result != want).sum())], dtype=torch.int64)
        dist.all_reduce(w)
        return int(w.item())

    def busbw(nbytes, t):
        return nbytes / t / 1e9 * 2 * (world - 1) / world

    if rank == 0:
        gyre_call = "gyre.torch.allreduce_ (in place)" if a.in_place else "gyre.torch.allreduce (new output)"
        if a.backend:
            gyre_call = "torch.distributed.all_reduce on the gyre backend (in place)"
        print(f"# torch allreduce sweep: {world} ranks, float32 sum; torch {torch.__version__}")
        print(f"# gyre: {gyre_call}; peer: torch.distributed.all_reduce (in place), gloo backend")
        print(f"# tensors on {'transparent huge pages (THP_MEM_ALLOC_ENABLE=1)' if huge else '4 KiB pages'}")
        print(f"# time: median over {a.blocks} blocks of the mean of {a.iters} back-to-back iterations, "
              f"slowest rank; {a.warmup} warm-up iterations; blocks alternate")
        print(f"# {'size':>10} {'count':>12} {'time':>10} {'busbw':>8} {'#wrong':>7} "
              f"{'gloo-time':>10} {'gloo-bw':>8} {'gloo#wr':>7} {'ratio':>8}")
        print(f"# {'(B)':>10} {'(elements)':>12} {'(us)':>10} {'(GB/s)':>8} {'':>7} "
              f"{'(us)':>10} {'(GB/s)':>8} {'':>7} {'gyre/gloo':>8}", flush=True)

    rows, total_wrong = [], 0
    for nbytes in sizes:
        count = nbytes // 4
        src = fill(count, rank, world)
        want = expected(count, world)
        gbuf, pbuf = src.clone(), src.clone()
        name = f"torch-perf.{nbytes}"
        for _ in range(a.warmup):
            gbuf.copy_(src)
            gyre_op(gbuf, name)
            pbuf.copy_(src)
            gloo_op(pbuf, name)
        tg, tp = [], []
        for blk in range(a.blocks):
            if blk % 2:
                tp.append(time_block(gloo_op, pbuf, src, name))
            tg.append(time_block(gyre_op, gbuf, src, name))
            if not blk % 2:
                tp.append(time_block(gloo_op, pbuf, src, name))
        t_g, t_p = statistics.median(slowest(tg)), statistics.median(slowest(tp))
        w_g = wrong_count(gyre_op, gbuf, src, name, want)
        w_p = wrong_count(gloo_op, pbuf, src, name, want)
        total_wrong += w_g + w_p
        row = {"bytes": nbytes, "count": count, "time_us": t_g * 1e6, "busbw_gbs": busbw(nbytes, t_g),
               "wrong": w_g, "peer_time_us": t_p * 1e6, "peer_busbw_gbs": busbw(nbytes, t_p),
               "peer_wrong": w_p, "ratio": t_p / t_g}
        rows.append(row)
        if rank == 0:
            print(f"  {nbytes:>10} {count:>12} {t_g * 1e6:>10.2f} {row['busbw_gbs']:>8.3f} {w_g:>7} "
                  f"{t_p * 1e6:>10.2f} {row['peer_busbw_gbs']:>8.3f} {w_p:>7} {row['ratio']:>8.2f}",
                  flush=True)

    if rank == 0:
        print(f"# Wrong elements in total: {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"benchmark": "torch-sweep",
                           "system": ("dist.all_reduce (gyre backend)" if a.backend else
                                      "gyre.torch.allreduce_" if a.in_place else "gyre.torch.allreduce"),
                           "peer": "torch.distributed gloo", "ranks": world, "dtype": "float32",
                           "op": "sum", "pages": "huge" if huge else "4K", "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    gt.shutdown()
    return 0 if total_wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
