"""horovod.torch's training helpers on gyre: DistributedOptimizer's full
signature, sparse gradients, broadcast_optimizer_state for every torch
optimizer, and SyncBatchNorm against one process on the union batch."""

import time

import pytest
import torch

import gyre.torch as hvd


def small_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_distributed_optimizer_takes_horovods_full_signature(size, rank):
    model = small_model(1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression=hvd.Compression.none, backward_passes_per_step=1, op=hvd.Average,
        gradient_predivide_factor=1.0, num_groups=0, groups=2, sparse_as_dense=False,
        process_set=hvd.global_process_set)
    x = torch.full((2, 4), float(rank))
    model(x).sum().backward()
    opt.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:  # averaged: the same on every rank
        torch.testing.assert_close(hvd.allreduce(g, op=hvd.Max), g)
    with opt.skip_synchronize():
        opt.step()


def test_distributed_optimizer_argument_errors_are_horovods(multi_rank):
    model = small_model(2)
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="must be unique"):
        hvd.DistributedOptimizer(base, named_parameters=named + named[:1])
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(base, named_parameters=named[:1])
    with pytest.raises(ValueError, match="sequence of tuples"):
        hvd.DistributedOptimizer(base, named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(base, groups="all")
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(base, groups=[[torch.ones(1)]])
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(base, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="not registered"):
        hvd.DistributedOptimizer(base, process_set=hvd.ProcessSet([0]))
    opt = hvd.DistributedOptimizer(base, groups=[[p for _, p in named[:2]], [named[2][1]]])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        opt.set_backward_passes_per_step(0)


def test_set_backward_passes_per_step_accumulates(size, rank):
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    opt.set_backward_passes_per_step(2)
    for _ in range(2):
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
    opt.step()
    # Gradient per pass: rank + 1 per weight; two passes summed, averaged over ranks.
    expected = -2.0 * sum(range(1, size + 1)) / size
    torch.testing.assert_close(model.weight.detach(), torch.full((1, 2), expected))


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients(size, rank, sparse_as_dense):
    torch.manual_seed(3)
    emb = torch.nn.Embedding(6, 2, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    before = emb.weight.detach().clone()
    emb(torch.tensor([rank % 6, 5])).sum().backward()
    opt.step()
    dense = torch.zeros(6, 2)
    for r in range(size):
        dense[r % 6] += 1.0
        dense[5] += 1.0
    torch.testing.assert_close(emb.weight.detach(), before - dense / size)


def test_sparse_gradient_unused_on_a_rank(size, rank, multi_rank):
    """An embedding (sparse gradients, kept sparse) used by every rank in the
    first step, then by rank 0 alone: the others send an empty sparse
    gradient, so every step completes with the right values. Used by rank 0
    alone from the start: every rank fails at once (MismatchError: rank 0
    gathers it sparse, the others reduce a dense zero), not at the stall
    timeout."""
    torch.manual_seed(3)
    emb = torch.nn.Embedding(6, 3, sparse=True)
    lin = torch.nn.Linear(3, 1)
    named = [("unused_emb.weight", emb.weight)] + list(lin.named_parameters(prefix="unused_lin"))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=1.0),
                                   named_parameters=named)
    for step in range(3):
        opt.zero_grad()
        before = emb.weight.detach().clone()
        w = lin.weight.detach()[0].clone()  # the same on every rank
        used = rank == 0 or step == 0
        x = emb(torch.tensor([1, 4])) if used else torch.ones(2, 3)
        lin(x).sum().backward()
        opt.step()
        assert emb.weight.grad.is_sparse
        # Rows 1 and 4 got w from each rank that used the embedding, averaged
        # over every rank (lr 1); the other rows are untouched.
        users = size if step == 0 else 1
        expected = before.clone()
        expected[[1, 4]] -= w * users / size
        torch.testing.assert_close(emb.weight.detach(), expected)
    emb2 = torch.nn.Embedding(6, 3, sparse=True)
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(emb2.parameters(), lr=1.0),
                                    named_parameters=[("unused_emb2.weight", emb2.weight)])
    if rank == 0:
        emb2(torch.tensor([2])).sum().backward()
    start = time.monotonic()
    with pytest.raises(hvd.MismatchError, match="unused_emb2.weight.*allgather"):
        opt2.step()
    assert time.monotonic() - start < 30


def test_sparse_allreduce_async(size, rank):
    t = torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([1.0]), (size,),
                                check_invariants=True)
    wait = hvd.sparse_allreduce_async(t, name="sparse.direct", op=hvd.Sum)
    assert hvd.synchronize(wait).to_dense().tolist() == [1.0] * size
    with pytest.raises(TypeError):
        hvd.sparse_allreduce_async(torch.ones(2), name="dense", op=hvd.Sum)


def _optimizers(params):
    return {
        "sgd_momentum": torch.optim.SGD(params(), lr=0.1, momentum=0.9),
        "sgd_plain": torch.optim.SGD(params(), lr=0.1),  # momentum_buffer None
        "adam": torch.optim.Adam(params(), lr=0.01, amsgrad=True),  # lazy state, 0-d step
        "adagrad": torch.optim.Adagrad(params(), lr=0.01),  # state created eagerly
        "rmsprop": torch.optim.RMSprop(params(), lr=0.01, centered=True),
        "lbfgs": torch.optim.LBFGS(params(), lr=0.1, history_size=3),  # nested, None entries
        "adamw_tensor_lr": torch.optim.AdamW(params(), lr=torch.tensor(0.01)),
    }


@pytest.mark.parametrize("kind", list(_optimizers(lambda: [torch.zeros(1, requires_grad=True)])))
def test_broadcast_optimizer_state_for_every_optimizer(size, rank, kind):
    model = small_model(4)
    unused = torch.nn.Parameter(torch.zeros(2))  # never gets a gradient: no state
    opt = _optimizers(lambda: list(model.parameters()) + [unused])[kind]
    if rank == 0:  # only the root has stepped: the others' state does not exist yet
        def closure():
            opt.zero_grad()
            loss = model(torch.ones(3, 4)).pow(2).sum()
            loss.backward()
            return loss
        for _ in range(2):
            opt.step(closure)
        opt.param_groups[0]["weight_decay_custom"] = 0.5  # a scalar added by the root
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    state = opt.state_dict()
    assert state["param_groups"][0].get("weight_decay_custom") == 0.5
    mine = hvd.allgather_object(repr(sorted(state["state"].keys())))
    assert len(set(mine)) == 1
    assert (mine[0] == "[]") == (kind == "sgd_plain")  # plain SGD keeps no state
    for pid, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                torch.testing.assert_close(hvd.broadcast(value, 0, name=f"chk.{kind}.{pid}.{key}"),
                                           value)
    if kind != "adagrad":  # Adagrad creates its state for every parameter at once
        assert unused not in opt.state or not opt.state[unused]


def test_broadcast_parameters_skips_none_and_refuses_other_types(size, rank):
    model = small_model(10 + rank)
    hvd.broadcast_parameters(model.state_dict(), 0, hvd.global_process_set)
    for p in model.parameters():
        torch.testing.assert_close(hvd.broadcast(p.detach(), 0), p.detach())
    hvd.broadcast_parameters([("skip", None)], root_rank=0)
    with pytest.raises(TypeError):
        hvd.broadcast_parameters(42, root_rank=0)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_sync_batch_norm_matches_one_process_on_the_union_batch(size, rank, shape):
    torch.manual_seed(7)
    rows = [2 + r for r in range(size)]  # ranks hold batches of different sizes
    union = torch.randn(sum(rows), *shape[1:], dtype=torch.float64) * 3 + 1
    weight_out = torch.randn(sum(rows), *shape[1:], dtype=torch.float64)
    lo = sum(rows[:rank])
    mine = union[lo:lo + rows[rank]].clone().requires_grad_()

    reference = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[
        len(shape)](shape[1]).double()
    sync = hvd.SyncBatchNorm(shape[1]).double()
    with torch.no_grad():
        for m in (reference, sync):
            m.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
            m.bias.copy_(torch.linspace(-1, 1, shape[1]))
    whole = union.clone().requires_grad_()
    expected = reference(whole)
    (expected * weight_out).sum().backward()

    out = sync(mine)
    torch.testing.assert_close(out, expected[lo:lo + rows[rank]].detach())
    (out * weight_out[lo:lo + rows[rank]]).sum().backward()
    torch.testing.assert_close(mine.grad, whole.grad[lo:lo + rows[rank]])
    # Parameter gradients are local; their sum over ranks is the union's.
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad)
    torch.testing.assert_close(hvd.allreduce(sync.bias.grad, op=hvd.Sum), reference.bias.grad)
    torch.testing.assert_close(sync.running_mean, reference.running_mean)
    torch.testing.assert_close(sync.running_var, reference.running_var)
    sync.eval()
    reference.eval()
    torch.testing.assert_close(sync(mine.detach()), reference(mine.detach()))


def test_sync_batch_norm_refuses_1d_input():
    with pytest.raises(ValueError, match="at least 2D"):
        hvd.SyncBatchNorm(3)(torch.ones(3))
