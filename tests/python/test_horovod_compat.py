"""Behaviour that Horovod's own test files (test/parallel/test_torch.py)
check and scripts written for Horovod rely on: the optimizer on a process set
this rank is outside of, sparse gradients that stay sparse, the optimizer's
parameter names, the gradients broadcast_optimizer_state leaves, the text of
the step warning, in_thread, and init() refusing a torchrun launch."""

import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import gyre
import gyre.torch as hvd


def test_optimizer_without_named_parameters_has_horovods_parameter_names(size):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1))
    names = opt._parameter_names
    assert set(names) == set(model.parameters())
    assert len(set(names.values())) == len(names)
    assert all(n == hvd.allgather_object(sorted(names.values()))[0]
               for n in hvd.allgather_object(sorted(names.values())))


def test_broadcast_optimizer_state_leaves_zero_gradients_as_horovod(rank):
    a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    b = torch.nn.Parameter(torch.full((4,), float(rank)))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([a, b], lr=0.1, momentum=0.9),
                                   named_parameters=[("a", a), ("b", b)])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert a.grad is None
    assert b.grad is not None and torch.equal(b.grad, torch.zeros(4))
    assert torch.equal(hvd.broadcast(b.grad, root_rank=0), b.grad)


def test_step_after_synchronize_warns_with_horovods_text(multi_rank):
    model = torch.nn.Linear(1, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 1)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        opt.step()
    assert len(ws) == 1
    assert "optimizer.step() called without optimizer.skip_synchronize()" in str(ws[0].message)


def _embedding_step(rank, sparse_as_dense):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 2, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                   sparse_as_dense=sparse_as_dense,
                                   named_parameters=[(f"emb{int(sparse_as_dense)}", emb.weight)])
    rows = torch.tensor([rank % 6, (rank + 1) % 6])
    opt.zero_grad()
    emb(rows).sum().backward()
    opt.synchronize()
    grad = emb.weight.grad
    with opt.skip_synchronize():
        opt.step()  # SparseAdam refuses dense gradients
    return grad


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_stay_sparse(rank, size, sparse_as_dense):
    grad = _embedding_step(rank, sparse_as_dense)
    assert grad.is_sparse
    expected = torch.zeros(6, 2)
    for r in range(size):
        expected[[r % 6, (r + 1) % 6]] += 1.0 / size
    torch.testing.assert_close(grad.to_dense(), expected)


def test_optimizer_on_a_set_this_rank_is_outside_of_steps_alone(rank, size, multi_rank):
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(size) if r % 2 == 1])
    try:
        w = torch.nn.Parameter(torch.zeros(2))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0),
                                       named_parameters=[("w", w)], process_set=evens)
        (w * float(rank + 1)).sum().backward()
        opt.step()
        even = [r for r in range(size) if r % 2 == 0]
        if rank % 2 == 0:  # averaged over the even ranks
            expected = -sum(r + 1 for r in even) / len(even)
        else:  # its own gradient, as Horovod's optimizer outside its set
            expected = -float(rank + 1)
        torch.testing.assert_close(w.detach(), torch.full((2,), expected))
    finally:
        hvd.remove_process_set(odds)
        hvd.remove_process_set(evens)
    # Once the set is removed no rank steps alone: the reduction refuses.
    opt.zero_grad()
    with pytest.raises(gyre.InvalidArgumentError, match="not registered"):
        (w * float(rank + 1)).sum().backward()
        opt.step()


def test_in_thread_runs_the_target_in_a_started_daemon_thread():
    seen = []
    done = threading.Event()
    t = gyre.basics.in_thread(lambda x: (seen.append(x), done.set()), args=(5,))
    assert t.daemon
    t.join(timeout=30)
    assert done.is_set() and seen == [5]
    quiet = gyre.basics.in_thread(lambda: 1 / 0, silent=True)
    quiet.join(timeout=30)
    assert not quiet.is_alive()


_LAUNCHER_VARS = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCALNRANKS", "HYDRA_", "SLURM_")


@pytest.mark.skipif(gyre.bootstrap.starts_from_pmi(),
                    reason="this build (MPICH) starts under torchrun: scripts/launch.sh tests that")
def test_init_under_torchrun_refuses_instead_of_running_alone(rank):
    if rank != 0:
        return  # one process is enough; the others wait in the session's barrier
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    code = ("import gyre.torch as hvd\n"
            "try:\n"
            "    hvd.init()\n"
            "except hvd.StateError as e:\n"
            "    print('refused:', e)\n"
            "else:\n"
            "    print('ran as rank', hvd.rank(), 'of', hvd.size())\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert "WORLD_SIZE=2" in out.stdout and "mpirun" in out.stdout
