"""DistributedOptimizer(op=Adasum), Horovod's Adasum optimizer: each rank runs
the wrapped optimizer's step locally, the parameter deltas are reduced with
Adasum, and every rank ends with old + Adasum(deltas). The references below
are computed in the test with plain torch (no communication) from every
rank's data."""

import pytest
import torch

import gyre.torch as hvd


def power_of_two(n):
    return n & (n - 1) == 0


@pytest.fixture
def two_ranks(size):
    if size != 2:
        pytest.skip("the reference pairs two ranks' deltas (run under mpirun -np 2)")


@pytest.fixture
def adasum_size(size):
    if not power_of_two(size):
        pytest.skip("Adasum needs a power-of-two number of ranks")


def model_for_test(seed=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def batch(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g)


def pairwise_adasum(a, b):
    """a' = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, in float64."""
    a, b = a.double(), b.double()
    ab = torch.dot(a.flatten(), b.flatten())
    aa = torch.dot(a.flatten(), a.flatten())
    bb = torch.dot(b.flatten(), b.flatten())
    ca = 1.0 if aa == 0 else 1.0 - ab / (2 * aa)
    cb = 1.0 if bb == 0 else 1.0 - ab / (2 * bb)
    return ca * a + cb * b


def local_deltas(r, passes):
    """Rank r's delta of one local SGD step, with plain torch."""
    model = model_for_test()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    old = [p.detach().clone() for p in model.parameters()]
    for k in range(passes):
        x, y = batch(r, k)
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return old, [p.detach() - o for p, o in zip(model.parameters(), old)]


@pytest.mark.parametrize("passes", [1, 2])
def test_step_sets_old_plus_adasum_of_the_local_deltas(two_ranks, rank, passes):
    model = model_for_test()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
        named_parameters=model.named_parameters(), op=hvd.Adasum, backward_passes_per_step=passes)
    for k in range(passes):
        x, y = batch(rank, k)
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    old, d0 = local_deltas(0, passes)
    _, d1 = local_deltas(1, passes)
    for p, o, a, b in zip(model.parameters(), old, d0, d1):
        expected = (o.double() + pairwise_adasum(a, b)).float()
        # Not the sum nor the average of the deltas (the test would not tell).
        assert not torch.allclose(expected, o + a + b, atol=1e-6)
        assert not torch.allclose(expected, o + (a + b) / 2, atol=1e-6)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-6)


def test_ranks_stay_identical_and_the_loss_decreases(adasum_size, size, rank):
    model = model_for_test(seed=rank)  # different start: broadcast_parameters aligns them
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    # A common target function; each rank sees its own inputs.
    torch.manual_seed(7)
    w_true = torch.randn(5, 2)

    def loss_on(r, step):
        x, _ = batch(r, step)
        return torch.nn.functional.mse_loss(model(x), torch.tanh(x @ w_true))

    def global_loss():
        with torch.no_grad():
            return sum(float(loss_on(r, 1000)) for r in range(size)) / size

    first = global_loss()
    for step in range(40):
        opt.zero_grad()
        loss_on(rank, step).backward()
        opt.step()
    last = global_loss()
    assert last < 0.5 * first, (first, last)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    for r in range(size):
        torch.testing.assert_close(gathered[r], flat, rtol=0, atol=0)


def test_synchronize_zero_grad_and_skip_synchronize_are_horovods(adasum_size, rank):
    model = model_for_test()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    x, y = batch(rank, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.synchronize()  # does nothing: neither parameters nor gradients change
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)
    with pytest.raises(AssertionError, match="skip_synchronize"):
        with opt.skip_synchronize():
            pass
    opt.zero_grad()  # safe between backward() and step(): nothing is in flight
    assert all(p.grad is None for p in model.parameters())
    opt.step()  # no gradients: the local step changes nothing, nor does the reduction
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)


def test_adasum_optimizer_refusals(adasum_size):
    model = model_for_test()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(base, op=hvd.Adasum, gradient_predivide_factor=2.0)


def test_adasum_optimizer_refuses_a_process_set(multi_rank, adasum_size):
    model = model_for_test()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    ps = hvd.add_process_set([0])
    try:
        with pytest.raises(NotImplementedError, match="global process set"):
            hvd.DistributedOptimizer(base, op=hvd.Adasum, process_set=ps)
    finally:
        hvd.remove_process_set(ps)


def test_adasum_optimizer_refuses_a_rank_count_not_a_power_of_two(size):
    if power_of_two(size):
        pytest.skip("refused only on a rank count that is not a power of two (mpirun -np 3)")
    model = model_for_test()
    with pytest.raises(ValueError, match=f"power-of-two number of ranks.*this job has {size}"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), op=hvd.Adasum)


def test_allreduce_adasum_with_a_joined_rank(adasum_size, size, rank):
    """A joined rank contributes zeros (Horovod's join): the Adasum tree over
    every rank's vector, the joined rank's being zero, computed locally."""
    def vector(r):
        return torch.sin(torch.arange(7, dtype=torch.float64) + 5.0 * r)
    if rank == 0:
        assert hvd.join() != 0  # the others join after their allreduce
        return
    out = hvd.allreduce(vector(rank).float(), op=hvd.Adasum, name="adasum.joined")
    parts = [torch.zeros(7, dtype=torch.float64)] + [vector(r) for r in range(1, size)]
    d = 1
    while d < size:
        for r in range(0, size, 2 * d):
            parts[r] = pairwise_adasum(parts[r], parts[r + d])
        d *= 2
    torch.testing.assert_close(out.double(), parts[0], rtol=1e-5, atol=1e-6)
    hvd.join()
