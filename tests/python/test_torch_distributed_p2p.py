"""Point-to-point on the gyre backend, as a torch user writes it: dist.send /
dist.recv, isend / irecv with wait(), batch_isend_irecv ring exchanges,
recv from any source (returning the sender), several dtypes, a size or
dtype mismatch raising on both ranks, and a subgroup made with new_group
(peers given as world ranks, as torch takes them). Runs under mpirun -np 2
and -np 3; the missing-sender case is torch_p2p_deadline.py (it needs a short
GYRE_STALL_SHUTDOWN_S)."""

import pytest
import torch
import torch.distributed as dist

import gyre
import gyre.torch.distributed  # noqa: F401 (registers the backend)


def _value(src, dst, n, dtype):
    """What rank src sends rank dst: a closed form both sides can compute."""
    base = torch.arange(n, dtype=torch.float64) % 7 + 10 * src + dst
    return base.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32,
                                   torch.float16, torch.bfloat16, torch.uint8, torch.bool])
def test_send_recv_pairs(world, dtype):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    n = 33
    # Rank 0 sends to every other rank; each answers with its own tensor.
    if rank == 0:
        for peer in range(1, size):
            dist.send(_value(0, peer, n, dtype), dst=peer)
        for peer in range(1, size):
            got = torch.empty(n, dtype=dtype)
            assert dist.recv(got, src=peer) == peer
            assert torch.equal(got, _value(peer, 0, n, dtype))
    else:
        got = torch.empty(n, dtype=dtype)
        dist.recv(got, src=0)
        assert torch.equal(got, _value(0, rank, n, dtype))
        dist.send(_value(rank, 0, n, dtype), dst=0)


def test_isend_irecv_wait_and_tags(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # Two messages with different tags, received in the opposite order:
    # tags keep them apart.
    a, b = torch.empty(5), torch.empty(1000)
    ra = dist.irecv(a, src=prv, tag=7)
    rb = dist.irecv(b, src=prv, tag=3)
    sb = dist.isend(_value(rank, nxt, 1000, torch.float32), dst=nxt, tag=3)
    sa = dist.isend(_value(rank, nxt, 5, torch.float32), dst=nxt, tag=7)
    for w in (rb, ra, sa, sb):
        w.wait()
        assert w.is_completed()
    assert torch.equal(a, _value(prv, rank, 5, torch.float32))
    assert torch.equal(b, _value(prv, rank, 1000, torch.float32))
    # Same tag, several messages: they arrive in the order they were sent.
    outs = [torch.empty(3) for _ in range(4)]
    rs = [dist.irecv(o, src=prv) for o in outs]
    ss = [dist.isend(torch.full((3,), float(100 * rank + i)), dst=nxt) for i in range(4)]
    for w in rs + ss:
        w.wait()
    assert [o[0].item() for o in outs] == [float(100 * prv + i) for i in range(4)]


def test_batch_isend_irecv_ring(world):
    rank, size = world
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    send = _value(rank, nxt, 4096, torch.float32).reshape(64, 64)
    got = torch.empty(64, 64)
    ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(got, _value(prv, rank, 4096, torch.float32).reshape(64, 64))


def test_recv_into_non_contiguous_tensor(world):
    rank, size = world
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    out = torch.zeros(6, 4).t()  # not contiguous
    s = dist.isend(torch.arange(24, dtype=torch.float32).reshape(4, 6) + rank, dst=nxt)
    dist.recv(out, src=prv)
    s.wait()
    assert torch.equal(out, torch.arange(24, dtype=torch.float32).reshape(4, 6) + prv)


def test_recv_from_any_source_returns_the_sender(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    if rank == 0:
        seen = []
        for _ in range(size - 1):
            t = torch.empty(2, dtype=torch.int64)
            src = dist.recv(t)  # any source
            assert t.tolist() == [src, src * src]
            seen.append(src)
        assert sorted(seen) == list(range(1, size))
    else:
        dist.send(torch.tensor([rank, rank * rank]), dst=0)
    # Only once rank 0 has taken every first message may the next one leave:
    # an any-source recv takes whichever message comes first, and the last
    # rank's second message (another size and dtype) could otherwise come
    # before a slower rank's first.
    dist.barrier()
    if rank == 0:
        # irecv from any source: the Work names the sender.
        t = torch.empty(1)
        w = dist.irecv(t)
        w.wait()
        assert w._source_rank() == size - 1 and t.item() == size - 1
    elif rank == size - 1:
        dist.send(torch.tensor([float(rank)]), dst=0)
    dist.barrier()


def test_size_and_dtype_mismatch_raise_on_both_ranks(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    if rank == 0:
        got = torch.full((3,), -1.0)
        with pytest.raises(gyre.MismatchError, match=r"rank 1 sent 4 x float32.*takes 3 x float32"):
            dist.recv(got, src=1)
        assert got.tolist() == [-1.0] * 3  # nothing written
        with pytest.raises(gyre.MismatchError, match=r"sent 4 x float64.*takes 4 x float32"):
            dist.recv(torch.empty(4), src=1, tag=1)
    elif rank == 1:
        with pytest.raises(gyre.MismatchError, match=r"rank 0's recv takes 3 x float32"):
            dist.send(torch.ones(4), dst=0)
        with pytest.raises(gyre.MismatchError, match=r"recv takes 4 x float32.*sends 4 x float64"):
            dist.send(torch.ones(4, dtype=torch.float64), dst=0, tag=1)
    # The pair still works afterwards: nothing of the refused sends is left over.
    if rank in (0, 1):
        peer = 1 - rank
        s = dist.isend(torch.full((3,), float(rank)), dst=peer)
        t = torch.empty(3)
        dist.recv(t, src=peer)
        s.wait()
        assert t.tolist() == [float(peer)] * 3
    dist.barrier()


def test_bad_peer_is_refused_at_the_call(world):
    rank, size = world
    with pytest.raises(ValueError):  # torch's own check: not a rank of the group
        dist.send(torch.ones(1), dst=size)


def test_p2p_beside_collectives(world):
    """A collective in flight does not pair with point-to-point traffic."""
    rank, size = world
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    coll = torch.full((8,), float(rank))
    w = dist.all_reduce(coll, async_op=True)
    got = torch.empty(8)
    ops = [dist.P2POp(dist.isend, torch.full((8,), float(rank)), nxt),
           dist.P2POp(dist.irecv, got, prv)]
    for x in dist.batch_isend_irecv(ops):
        x.wait()
    w.wait()
    assert coll.tolist() == [float(sum(range(size)))] * 8
    assert got.tolist() == [float(prv)] * 8


def test_p2p_on_a_subgroup(world):
    rank, size = world
    if size < 2:
        pytest.skip("needs 2 ranks")
    ranks = [0, size - 1]  # [0, 1] with 2 ranks, [0, 2] with 3
    group = dist.new_group(ranks)
    if rank in ranks:
        peer = ranks[1] if rank == ranks[0] else ranks[0]  # a world rank, as torch takes it
        s = dist.isend(torch.full((4,), float(rank)), dst=peer, group=group)
        t = torch.empty(4)
        dist.recv(t, src=peer, group=group)
        s.wait()
        assert t.tolist() == [float(peer)] * 4
        # Any source on the group: torch returns the world rank.
        if rank == ranks[0]:
            assert dist.recv(torch.empty(1), group=group) == ranks[1]
        else:
            dist.send(torch.ones(1), dst=ranks[0], group=group)
        # group_dst / group_src: ranks in the group.
        s = dist.isend(torch.full((2,), float(rank)), group=group, group_dst=ranks.index(peer))
        t = torch.empty(2)
        dist.recv(t, group=group, group_src=ranks.index(peer))
        s.wait()
        assert t.tolist() == [float(peer)] * 2
    # Messages on the subgroup and the default group with the same tag stay apart.
    if rank in ranks:
        peer = ranks[1] if rank == ranks[0] else ranks[0]
        a, b = torch.empty(1), torch.empty(1)
        ra = dist.irecv(a, src=peer)                # default group
        rb = dist.irecv(b, src=peer, group=group)   # subgroup
        sb = dist.isend(torch.tensor([2.0]), dst=peer, group=group)
        sa = dist.isend(torch.tensor([1.0]), dst=peer)
        for w in (ra, rb, sa, sb):
            w.wait()
        assert (a.item(), b.item()) == (1.0, 2.0)
    dist.barrier()
