"""gyre.ps.ParameterStore under mpirun -np 2 and -np 3: the optimistic-update
scenario on torch and numpy tensors, no lost update with retries of the
rejected shards only, the staleness policies, async handles, a process set,
and refusals on the calling rank only."""

import numpy as np
import pytest
import torch

import gyre
import gyre.ps


def _sum_over_ranks(x):
    return int(gyre.allreduce(np.array([x], dtype=np.int64), op=gyre.Sum)[0])


def test_one_of_concurrent_pushes_on_one_version_is_applied(rank, size):
    with gyre.ps.ParameterStore() as store:
        w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        store.register("w", w if rank == 0 else torch.zeros(2, 3))
        value, version = store.pull("w")
        assert torch.equal(value, w) and version == (0,)
        gyre.barrier()  # every rank has read version 0
        delta = torch.full((2, 3), float(rank + 1))
        ok, now = store.push("w", delta, version)
        assert _sum_over_ranks(int(ok)) == 1
        while not ok:
            assert now.rejected == (0,) and now[0] >= 1
            _, version = store.pull("w")
            ok, now = store.push("w", delta, version)
        gyre.barrier()
        value, version = store.pull("w")
        assert version == (size,)
        assert torch.equal(value, w + size * (size + 1) / 2)


def test_no_lost_update_on_a_split_tensor(rank, size):
    store = gyre.ps.ParameterStore(split_bytes=64)
    store.register("p", np.zeros(999, dtype=np.float64))
    assert store.shard_owners("p") == list(range(size))
    rounds, rejected = 20, 0
    ones = np.ones(999)
    for k in range(rounds):
        _, version = store.pull("p")
        if k == 0:
            gyre.barrier()
        ok, now = store.push("p", ones, version)
        while not ok:
            rejected += len(now.rejected)
            _, version = store.pull("p")
            ok, now = store.push("p", ones, version, shards=now.rejected)
    assert _sum_over_ranks(rejected) > 0
    assert store.stats()["pushes_rejected"] == rejected
    gyre.barrier()
    value, version = store.pull("p")
    assert np.array_equal(value, np.full(999, float(size * rounds)))
    assert version == tuple([size * rounds] * size)
    store.close()


def test_staleness_policies(rank, size):
    with gyre.ps.ParameterStore() as store:
        store.register("s", torch.zeros(4, dtype=torch.float64))
        if rank == 0:
            _, v0 = store.pull("s")
            d = torch.full((4,), 6.0, dtype=torch.float64)
            assert store.push("s", d, v0)[0]                       # version 1
            ok, v = store.push("s", d, v0)                          # lag 1 > 0
            assert not ok and v == (1,)
            ok, v = store.push("s", d, v0, staleness=1, policy="scale")  # + 3
            assert ok and v == (2,)
            ok, v = store.push("s", d, v0, staleness=None, policy="apply")  # + 6
            assert ok and v == (3,)
            value, _ = store.pull("s")
            assert torch.equal(value, torch.full((4,), 15.0, dtype=torch.float64))
            assert store.stats()["pushes_scaled"] == 1
            assert store.stats()["max_lag_seen"] == 2
        gyre.barrier()


def test_async_handles(rank, size):
    with gyre.ps.ParameterStore() as store:
        store.register("a", torch.zeros(8))
        store.register("b", torch.zeros(8, dtype=torch.int32))
        h = store.pull_async("a")
        value, version = h.wait()
        assert torch.equal(value, torch.zeros(8)) and version == (0,)
        gyre.barrier()
        pushes = [store.push_async("b", torch.ones(8, dtype=torch.int32), version,
                                   staleness=None, policy="apply") for _ in range(3)]
        assert all(p.wait()[0] for p in pushes)
        gyre.barrier()
        value, version = store.pull("b")
        assert torch.equal(value, torch.full((8,), 3 * size, dtype=torch.int32))
        assert version == (3 * size,)


def test_refusals_stay_on_the_calling_rank(rank, size):
    with gyre.ps.ParameterStore() as store:
        store.register("w", torch.zeros(3))
        if rank == size - 1:
            with pytest.raises(gyre.InvalidArgumentError, match="no tensor 'x'"):
                store.pull("x")
            with pytest.raises(gyre.InvalidArgumentError, match="registered as float32"):
                store.push("w", torch.zeros(3, dtype=torch.float64), (0,))
            with pytest.raises(gyre.InvalidArgumentError, match="policy"):
                store.push("w", torch.zeros(3), (0,), policy="sometimes")
        value, version = store.pull("w")
        assert version == (0,)
        with pytest.raises(gyre.InvalidArgumentError, match="already registered"):
            store.register("w", torch.zeros(3))


def test_a_process_set(rank, size):
    import gyre.torch as hvd
    members = [r for r in range(size) if r != 1]
    ps = hvd.add_process_set(members)
    try:
        if rank in members:
            with gyre.ps.ParameterStore(process_set=ps) as store:
                store.register("w", torch.ones(2) * (rank + 1))
                value, version = store.pull("w")
                assert torch.equal(value, torch.ones(2))  # the set's first rank's value
                assert store.shard_owners("w") == [0]
        else:
            with pytest.raises(gyre.InvalidArgumentError, match="not in process set"):
                gyre.ps.ParameterStore(process_set=ps)
    finally:
        hvd.remove_process_set(ps)


def test_runtime_stats_report_versions_and_push_outcomes(rank, size, tmp_path_factory):
    """runtime_stats(): the version vector with each rank's lag behind the
    most advanced rank, and the stores' push outcomes of this process; the
    timeline records the lags as a VERSION_LAG counter when they change."""
    import json
    import os
    import shutil
    import time

    before = gyre.runtime_stats()
    path = f"/tmp/gyre-vv-timeline-{os.getppid()}-{{rank}}.json"
    mine = path.replace("{rank}", str(rank))
    # A directory every rank knows, for a rendezvous below that needs no
    # collective: chosen by rank 0 while the steps are still equal.
    token = gyre.broadcast(torch.randint(0, 2**62, (1,)), root_rank=0, name="vv.token")
    meeting = f"/tmp/gyre-vv-meeting-{int(token.item())}"
    os.makedirs(meeting, exist_ok=True)
    gyre.barrier()
    gyre.start_timeline(path)
    # Rank 0 commits two steps more than the others; the background
    # rounds carry its count to every rank (no collective: at
    # GYRE_MAX_VERSION_LAG 0 one would refuse the difference).
    base = gyre.committed_steps()
    for _ in range(2 if rank == 0 else 0):
        gyre.commit_step()
    deadline = time.monotonic() + 30
    while gyre.version_vector()[0] < base + 2:
        assert time.monotonic() < deadline, gyre.version_vector()
        time.sleep(0.001)
    seen = gyre.runtime_stats()["rounds"]  # two rounds more: one recorded the change
    while gyre.runtime_stats()["rounds"] < seen + 2:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    stats = gyre.runtime_stats()
    assert stats["versions"] == gyre.version_vector()
    top = max(stats["versions"])
    assert stats["behind"] == [top - v for v in stats["versions"]]
    assert stats["behind"][0] == 0 and all(b >= 2 for b in stats["behind"][1:])
    gyre.stop_timeline()
    with open(mine) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(mine)
    lags = [e["args"] for e in events if e.get("name") == "VERSION_LAG" and e.get("ph") == "C"]
    assert lags and lags[-1]["rank 0"] == 0 and lags[-1]["rank 1"] >= 2
    # The others catch up, so that later tests see equal counts; only once
    # every rank has checked the lags above, which a catch-up changes. Not a
    # barrier: the steps differ until then, and a collective is refused.
    open(os.path.join(meeting, str(rank)), "w").close()
    deadline = time.monotonic() + 30
    while len(os.listdir(meeting)) < size:
        assert time.monotonic() < deadline, sorted(os.listdir(meeting))
        time.sleep(0.001)
    for _ in range(0 if rank == 0 else 2):
        gyre.commit_step()
    gyre.barrier()
    if rank == 0:
        shutil.rmtree(meeting)

    # Push outcomes: every rank pushes on version 0 once; one is applied.
    with gyre.ps.ParameterStore() as store:
        store.register("counted", torch.zeros(4))
        _, version = store.pull("counted")
        gyre.barrier()
        ok, _ = store.push("counted", torch.ones(4), version)
        gyre.barrier()
    after = gyre.runtime_stats()
    assert after["store_pushes"] - before["store_pushes"] == 1
    assert after["store_pushes_applied"] - before["store_pushes_applied"] == int(ok)
    assert after["store_pushes_rejected"] - before["store_pushes_rejected"] == int(not ok)
    assert _sum_over_ranks(after["store_pushes_applied"] - before["store_pushes_applied"]) == 1
    assert after["rounds"] > before["rounds"]


def test_pull_many_and_push_many_send_one_request_per_owner(rank, size):
    with gyre.ps.ParameterStore() as store:
        names = [f"t{j}" for j in range(2 * size)]   # two tensors on every rank
        for j, name in enumerate(names):
            store.register(name, torch.arange(3 + j, dtype=torch.float64) + j)
        owners = [store.shard_owners(n)[0] for n in names]
        assert sorted(owners) == sorted(list(range(size)) * 2)
        gyre.barrier()
        before = store.stats()["served_requests"]
        gyre.barrier()
        results = store.push_many(names, [torch.ones(3 + j, dtype=torch.float64)
                                          for j in range(len(names))],
                                  [(0,)] * len(names), staleness=None, policy="apply")
        assert all(ok for ok, _ in results)
        gyre.barrier()
        # Every rank reached each other rank once for both of its tensors.
        assert _sum_over_ranks(store.stats()["served_requests"] - before) == size * (size - 1)
        pulled = store.pull_many(names)
        for j, (value, version) in enumerate(pulled):
            assert version == (size,)
            assert torch.equal(value, torch.arange(3 + j, dtype=torch.float64) + j + size)
        # Into given outputs, numpy and torch alike; the same as single pulls.
        outs = [np.zeros(3 + j) if j % 2 else torch.zeros(3 + j, dtype=torch.float64)
                for j in range(len(names))]
        again = store.pull_many(names, outs)
        for j, (value, version) in enumerate(again):
            assert value is outs[j]
            single, single_version = store.pull(names[j])
            assert np.array_equal(np.asarray(value), single.numpy()) and version == single_version
        gyre.barrier()


def test_push_many_takes_a_staleness_and_policy_per_tensor(rank, size):
    with gyre.ps.ParameterStore() as store:
        store.register("a", torch.zeros(4))
        store.register("b", torch.zeros(4))
        gyre.barrier()
        if rank == 0:
            store.push("a", torch.ones(4), (0,), staleness=None, policy="apply")
            store.push("b", torch.ones(4), (0,), staleness=None, policy="apply")
            # Both at version 1 now; pushed from version 0: "a" rejects, "b" applies.
            (ok_a, va), (ok_b, vb) = store.push_many(
                ["a", "b"], [torch.ones(4), torch.ones(4)], [(0,), (0,)],
                staleness=[0, None], policy=["reject", "apply"])
            assert not ok_a and va.rejected == (0,) and va == (1,)
            assert ok_b and vb == (2,)
            with pytest.raises(gyre.InvalidArgumentError, match="one delta"):
                store.push_many(["a"], [], [(0,)])
            with pytest.raises(gyre.InvalidArgumentError, match="one output per name"):
                store.pull_many(["a"], [torch.zeros(4), torch.zeros(4)])
        gyre.barrier()


def test_discard_stops_the_store_without_a_collective(rank, size):
    store = gyre.ps.ParameterStore()
    store.register("w", torch.ones(4))
    assert torch.equal(store.pull("w")[0], torch.ones(4))
    gyre.barrier()  # nobody is still calling it
    store.discard()
    with pytest.raises(gyre.StateError, match="discarded"):
        store.pull("w")
    with pytest.raises(gyre.StateError, match="discarded"):
        store.push("w", torch.ones(4), (0,))
    # A new store over the same ranks takes the same names again.
    with gyre.ps.ParameterStore() as again:
        again.register("w", torch.full((4,), 2.0))
        assert torch.equal(again.pull("w")[0], torch.full((4,), 2.0))
