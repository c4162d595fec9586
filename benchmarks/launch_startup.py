"""Start-up time under torchrun (docs/launch.md): the seconds from a
process's start (the interpreter's, as the launcher sees it) to the end of
init_process_group and a first barrier, on each backend:

    torchrun --standalone --nproc_per_node=8 benchmarks/launch_startup.py gyre
    torchrun --standalone --nproc_per_node=8 benchmarks/launch_startup.py gloo

Rank 0 prints one line: backend, ranks, the slowest rank's time to
init_process_group's return, to the first barrier's, and how long the
imports took (which are not the backend's: torch alone). Run both backends
in the same session: the figure that matters is the difference.
"""
import os
import sys
import time



def process_start() -> float:
    """This process's start (seconds since the epoch), from /proc."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


start = process_start()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

backend = sys.argv[1]
if backend == "gyre":
    import gyre.torch.distributed  # noqa: F401,E402
imported = time.time()
dist.init_process_group(backend)
inited = time.time()
dist.barrier()
barriered = time.time()
t = torch.tensor([inited - start, barriered - start, imported - start], dtype=torch.float64)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
if dist.get_rank() == 0:
    print(f"{backend}: {dist.get_world_size()} ranks, init_process_group done at {t[0]:.2f} s, "
          f"first barrier at {t[1]:.2f} s, imports {t[2]:.2f} s (slowest rank)", flush=True)
dist.destroy_process_group()
