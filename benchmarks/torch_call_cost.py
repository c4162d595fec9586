#!/usr/bin/env python3
"""The cost of one small gyre.torch call from Python, call by call:

    mpirun -np 2 python3 benchmarks/torch_call_cost.py --calls 3000
    mpirun -np 2 python3 benchmarks/torch_call_cost.py --calls 3000 --dist

Times back-to-back calls of gyre.torch.allreduce_ (or, with --out-of-place,
gyre.torch.allreduce) on a float32 CPU tensor of --bytes bytes (default 8),
as a training loop makes them, and prints the median, p10, p90, p99 and mean
per call of every rank; the results are checked. Nothing else runs in the
job (no torch.distributed), so the script also runs under a profiler:

    # instructions per call, by thread (one rank: no peer to wait for);
    # --callgrind instruments only the loop of calls, --no-check leaves out
    # the per-call refill and check (the loop is then the calls alone)
    valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes \\
        python3 benchmarks/torch_call_cost.py --calls 1000 --callgrind --no-check
    py-spy record --native -o profile.svg -- python3 benchmarks/torch_call_cost.py --calls 20000
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import gyre.torch as gt


def percentile(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def instrument(state):
    subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description="per-call time of a small gyre.torch allreduce")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--out-of-place", action="store_true",
                    help="gyre.torch.allreduce (a new output per call) instead of allreduce_")
    ap.add_argument("--dist", action="store_true",
                    help="torch.distributed.all_reduce on the gyre backend (in place; the "
                         "default group of init_process_group(\"gyre\")) instead of gyre.torch")
    ap.add_argument("--no-check", action="store_true",
                    help="neither refill nor check per call (the values then grow): the loop is "
                         "the calls alone, for instruction counts")
    ap.add_argument("--callgrind", action="store_true",
                    help="under valgrind --tool=callgrind --instr-atstart=no: instrument the "
                         "timed calls only (callgrind_control -i on/off)")
    a = ap.parse_args()

    gt.init()
    rank, world = gt.rank(), gt.size()
    count = max(1, a.bytes // 4)
    src = torch.arange(count, dtype=torch.float32) + rank
    want = world * torch.arange(count, dtype=torch.float32) + world * (world - 1) / 2
    buf = src.clone()
    name = "call-cost"
    wrong = 0
    times = []
    if a.dist:
        import torch.distributed as dist
        import gyre.torch.distributed  # noqa: F401  (registers the backend)
        dist.init_process_group("gyre")

        def call(t, name, op):
            dist.all_reduce(t)
            return t
    else:
        call = gt.allreduce if a.out_of_place else gt.allreduce_
    for i in range(a.warmup + a.calls):
        if i == a.warmup and a.callgrind:
            instrument("on")
        if not a.no_check:
            buf.copy_(src)
        t0 = time.perf_counter()
        result = call(buf, name=name, op=gt.Sum)
        t = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(t)
        if not a.no_check:
            wrong += int((result != want).sum())
    if a.callgrind:
        instrument("off")
    # Every rank's figures, printed by rank 0.
    mine = torch.tensor([statistics.median(times), percentile(times, 10), percentile(times, 90),
                         percentile(times, 99), statistics.fmean(times), float(wrong)],
                        dtype=torch.float64).reshape(1, 6)
    every = gt.allgather(mine, name="call-cost.figures")
    if rank == 0:
        call = "gyre.torch.allreduce" if a.out_of_place else "gyre.torch.allreduce_"
        if a.dist:
            call = "torch.distributed.all_reduce (gyre backend)"
        print(f"# {call} of {count * 4} bytes (float32 sum), {world} ranks, torch {torch.__version__}")
        print(f"# {a.calls} back-to-back calls after {a.warmup} warm-up, time per call")
        print(f"# {'rank':>4} {'median':>9} {'p10':>9} {'p90':>9} {'p99':>9} {'mean':>9} {'#wrong':>7}")
        print(f"# {'':>4} {'(us)':>9} {'(us)':>9} {'(us)':>9} {'(us)':>9} {'(us)':>9}")
        for r, row in enumerate(every.tolist()):
            us = [x * 1e6 for x in row[:5]]
            print(f"  {r:>4} " + " ".join(f"{x:>9.2f}" for x in us) + f" {int(row[5]):>7}")
        total = int(every[:, 5].sum())
        if a.no_check:
            print("# results not checked (--no-check)", flush=True)
        else:
            print(f"# Wrong elements in total: {total} {'OK' if total == 0 else 'FAILED'}",
                  flush=True)
    total = int(every[:, 5].sum())
    if a.dist:
        dist.destroy_process_group()
    gt.shutdown()
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
