"""One short torch.distributed job on the gyre backend, for the exit tests
(test_exit.py, scripts/exit_soak.sh): three all_reduce calls, an optional
destroy_process_group(), then interpreter exit. Under mpirun -np 2 it must
exit 0 on every rank: no abort while the interpreter finalises.

    mpirun -np 2 python3 tests/python/exit_job.py [--destroy] [--busy-callback]
                                                  [--partial-local-sgd]

--busy-callback chains a torch future callback that runs Python code on
gyre's callback thread while the main thread goes on to exit (what a DDP
communication hook does): the callback thread is then most likely to be
running Python when the interpreter finalises.

--partial-local-sgd trains a few steps under gyre.torch.PartialLocalSGD and
exits without its close() (what an exception in a training loop does): its
aggregator thread, in store calls, must stop before MPI is finalised.
"""

import sys

import torch
import torch.distributed as dist

import gyre.torch.distributed  # noqa: F401 (registers the backend)


def busy(fut):
    # Pure Python on the callback thread, long enough to outlast the main
    # thread's last steps before exit.
    total = 0
    for i in range(200000):
        total += i
    return fut.value()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gyre")
    rank, size = dist.get_rank(), dist.get_world_size()
    for i in range(3):
        t = torch.full((4,), float(rank + i))
        if "--busy-callback" in sys.argv and i == 2:
            work = dist.all_reduce(t, async_op=True)
            work.get_future().then(busy)
            work.wait()
        else:
            dist.all_reduce(t)
        expected = float(sum(r + i for r in range(size)))
        if t.tolist() != [expected] * 4:
            print(f"rank {rank}: all_reduce {i} gave {t.tolist()}, expected {expected}",
                  file=sys.stderr)
            sys.exit(3)
    if "--partial-local-sgd" in sys.argv:
        import gyre.torch as hvd
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 2)
        opt = hvd.PartialLocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, period=2,
                                  late_after_s=5.0, fragments=2, sync_delay=1)
        for step in range(5):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        dist.barrier()  # every rank's rounds are done; no close()
    if "--destroy" in sys.argv:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
