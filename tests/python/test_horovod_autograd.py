"""Gradients of gyre.torch's collectives, as horovod/torch/mpi_ops.py (0.28)
defines them. Rank s weights its output by w_s = s + 1, so every expected
gradient is a closed form of the ranks' weights."""

import pytest
import torch

import gyre.torch as hvd


def weights(size):
    return [s + 1 for s in range(size)]


def test_allreduce_gradient_is_the_same_allreduce(size, rank):
    w = weights(size)
    x = torch.full((3,), float(rank), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    (y * w[rank]).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), float(sum(w))))
    x = torch.full((3,), float(rank), requires_grad=True)
    (hvd.allreduce(x, average=True) * w[rank]).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), sum(w) / size))


def test_grouped_allreduce_gradient(size, rank):
    w = weights(size)
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    assert ya.requires_grad and yb.requires_grad
    (ya.sum() * w[rank] + yb.sum() * 2 * w[rank]).backward()
    torch.testing.assert_close(a.grad, torch.full((2,), float(sum(w))))
    torch.testing.assert_close(b.grad, torch.full((3,), 2.0 * sum(w), dtype=torch.float64))


def test_allgather_gradient_averages_then_takes_own_rows(size, rank):
    w = weights(size)
    x = torch.ones(rank + 1, 2, requires_grad=True)
    (hvd.allgather(x) * w[rank]).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((rank + 1, 2), sum(w) / size))
    a, b = torch.ones(1, requires_grad=True), torch.ones(rank + 2, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    (ga.sum() * w[rank] + gb.sum() * 3 * w[rank]).backward()
    torch.testing.assert_close(a.grad, torch.full((1,), sum(w) / size))
    torch.testing.assert_close(b.grad, torch.full((rank + 2,), 3 * sum(w) / size))


def test_broadcast_gradient_reaches_the_root_only(size, rank):
    w = weights(size)
    root = size - 1
    x = torch.full((2,), float(rank), requires_grad=True)
    y = hvd.broadcast(x, root)
    assert y.tolist() == [float(root)] * 2
    (y * w[rank]).sum().backward()
    expected = sum(w) / size if rank == root else 0.0
    torch.testing.assert_close(x.grad, torch.full((2,), expected))


def test_alltoall_gradient_travels_back(size, rank):
    splits = [p + 1 for p in range(size)]  # rank p receives p + 1 rows from everyone
    x = torch.arange(float(sum(splits))).repeat_interleave(2).reshape(-1, 2).requires_grad_()
    out, received = hvd.alltoall(x, splits=splits)
    assert not received.requires_grad
    # Row j of out came from rank j // (rank + 1); weight it by that rank + 1.
    source = torch.arange(out.shape[0]) // (rank + 1)
    (out * (source + 1).unsqueeze(1)).sum().backward()
    # Rows this rank sent to rank p get the weight of this rank (as source) there.
    torch.testing.assert_close(x.grad, torch.full_like(x, float(rank + 1)))


def test_reducescatter_gradient_is_an_allgather(size, rank):
    w = weights(size)
    x = torch.ones(2 * size, requires_grad=True)
    y = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=3.0)
    (y * w[rank]).sum().backward()
    # Horovod's scale: x size for Sum, x 1 for Average (times prescale * postscale).
    expected = torch.tensor([3.0 * size * w[r] for r in range(size) for _ in range(2)])
    torch.testing.assert_close(x.grad, expected)
    x = torch.ones(2 * size, requires_grad=True)
    (hvd.reducescatter(x) * w[rank]).sum().backward()  # Average
    torch.testing.assert_close(x.grad, expected / 3.0 / size)
    a = torch.ones(size, 2, requires_grad=True)
    (ya,) = hvd.grouped_reducescatter([a], op=hvd.Sum)
    (ya * w[rank]).sum().backward()
    torch.testing.assert_close(a.grad, torch.tensor([[float(size * w[r])] * 2
                                                     for r in range(size)]))
    b = torch.ones(size, 2, requires_grad=True)
    (yb,) = hvd.grouped_reducescatter([b])  # Average
    yb.backward(torch.ones_like(yb))
    torch.testing.assert_close(b.grad, torch.ones(size, 2))


def test_gradients_flow_through_compression(size, rank):
    x = torch.ones(4, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16) * (rank + 1)).sum().backward()
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, torch.full((4,), float(sum(weights(size)))))


def test_min_max_product_backward_raises(rank):
    for op in (hvd.Min, hvd.Max, hvd.Product):
        y = hvd.allreduce(torch.ones(2, requires_grad=True), op=op)
        with pytest.raises(ValueError, match="not differentiable"):
            y.sum().backward()
    y = hvd.reducescatter(torch.ones(4, requires_grad=True), op=hvd.Max)
    with pytest.raises(ValueError, match="not differentiable"):
        y.sum().backward()


def test_no_grad_and_in_place_forms_do_not_track(size):
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        assert not hvd.allreduce(x).requires_grad
    assert not hvd.synchronize(hvd.allreduce_async(x)).requires_grad
