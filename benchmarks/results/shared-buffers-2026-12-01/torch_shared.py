"""gyre.torch.allreduce_ in place of a private tensor against one from
gyre.torch.empty_shared, alternating, 2 ranks; median ms of 20 calls per
block, 5 blocks each, slowest rank. Run with GYRE_SHM_POOL_BYTES=128M:
    GYRE_SHM_POOL_BYTES=128M mpirun -np 2 -x GYRE_SHM_POOL_BYTES python3 torch_shared.py
"""
import statistics
import time

import torch

import gyre.torch as gt

gt.init()
results = {}
for mib in (1, 4, 16, 64):
    n = mib * (1 << 20) // 4
    bufs = {"private": torch.ones(n), "shared": gt.empty_shared(n).fill_(1)}
    times = {k: [] for k in bufs}
    for block in range(6):
        for kind, t in bufs.items():
            gt.allreduce_(torch.zeros(1), name="sync")
            t0 = time.perf_counter()
            for _ in range(20):
                gt.allreduce_(t, op=gt.Average, name=f"{kind}.{mib}")
            dt = (time.perf_counter() - t0) / 20
            worst = gt.allreduce(torch.tensor([dt]), op=gt.Max, name="max").item()
            if block > 0:
                times[kind].append(worst)
    for kind in bufs:
        assert torch.all(bufs[kind] == 1), kind  # averages of ones
    del t, bufs  # the shared tensor's memory back to the pool
    if gt.rank() == 0:
        p, s = statistics.median(times["private"]), statistics.median(times["shared"])
        print(f"{mib:3d} MiB  private {p * 1e3:8.3f} ms  shared {s * 1e3:8.3f} ms  "
              f"private/shared {p / s:5.2f}  busbw shared {mib * 1.048576e-3 / s:6.2f} GB/s", flush=True)
if gt.rank() == 0:
    print("pool_allreduces", gt.runtime_stats()["pool_allreduces"])
