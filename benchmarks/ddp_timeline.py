#!/usr/bin/env python3
"""Where a DDP step's communication goes, bucket by bucket:

    mpirun -np 2 python3 benchmarks/ddp_timeline.py [--backend gyre|gloo] [--bucket-view]

A BERT-base-sized nn.TransformerEncoder (12 layers, d_model 768, sequence
32, batch 4, one intra-op thread per rank, as benchmarks/ddp_step.py's
"bert") under DistributedDataParallel, with a communication hook that does
what DDP's default one does (an allreduce of the bucket, then a division by
the world size) and records, for every bucket, when DDP handed it over and
when its reduction completed (the future's callback), in ms from the start
of the step; beside them the end of the forward pass and of backward()
(which returns once DDP has waited for every bucket and copied the results
into the gradients). --bucket-view passes gradient_as_bucket_view=True: the
gradients are views into the buckets, so DDP copies nothing in or out.
The last --show steps of --steps are printed, rank 0's times. --local runs
the same steps without DDP and without communication (every rank on its
own, both at once): its backward() is the part of the step no reduction is
in, so that (backward() returns) - (local's) is the communication the step
did not hide.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre.torch.distributed  # noqa: F401  (the "gyre" backend)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gyre", choices=("gyre", "gloo"))
    ap.add_argument("--bucket-view", action="store_true")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--show", type=int, default=2)
    ap.add_argument("--local", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.backend == "gloo":
        # The rendezvous of an mpirun job, without gyre.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    else:
        dist.init_process_group("gyre")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True), 12)
    ddp = model if args.local else DDP(model, gradient_as_bucket_view=args.bucket_view)
    events = []
    start = [0.0]

    def now_ms():
        return (time.perf_counter() - start[0]) * 1e3

    def hook(_state, bucket):
        handed = now_ms()
        index, nbytes = bucket.index(), bucket.buffer().numel() * bucket.buffer().element_size()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(f):
            events.append((index, nbytes, handed, now_ms()))
            return f.value()[0].div_(world)

        return fut.then(done)

    if not args.local:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(4, 32, 768)
    for step in range(args.steps):
        events.clear()
        dist.barrier()
        start[0] = time.perf_counter()
        loss = ddp(x).square().mean()
        forward = now_ms()
        loss.backward()
        backward = now_ms()
        opt.step()
        opt.zero_grad()
        if step >= args.steps - args.show and rank == 0 and args.local:
            print(f"# local (no DDP, no communication), step {step}: forward ends {forward:.1f} ms, "
                  f"backward() returns {backward:.1f} ms")
        elif step >= args.steps - args.show and rank == 0:
            print(f"# {args.backend}, gradient_as_bucket_view={args.bucket_view}, step {step}: "
                  f"forward ends {forward:.1f} ms, backward() returns {backward:.1f} ms")
            print("bucket      MB   handed    done  reduce  (ms)")
            for index, nbytes, handed, done in sorted(events, key=lambda e: e[2]):
                print(f"{index:6d} {nbytes / 1e6:7.1f} {handed:8.1f} {done:7.1f} {done - handed:7.1f}")
            last = max(e[3] for e in events)
            print(f"# backward() returned {backward - last:.1f} ms after the last bucket's reduction")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
