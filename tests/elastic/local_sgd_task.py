"""The small task of the elastic local-SGD tests (elastic_local_sgd.py,
elastic_partial_local_sgd.py): a 2-layer model, its inner optimizer, each
rank's deterministic batches, the checks' flat views and checksums, and the
one-process reference of a streaming run with a death."""
import copy

import torch

BS = 8


def new_model(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 1))


def new_inner(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def batch(rank, size, step):
    """Rank `rank` of `size`'s batch at local step `step`."""
    g = torch.Generator().manual_seed(10000 * size + 100 * rank + step)
    x = torch.randn(BS, 8, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def loss_of(model, rank, size, step):
    x, y = batch(rank, size, step)
    return torch.nn.functional.mse_loss(model(x), y)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def checksum(model):
    """Two float64 sums of the parameters: plain and weighted by position."""
    v = flat(model.parameters()).double()
    return torch.stack([v.sum(), (v * torch.arange(1, v.numel() + 1, dtype=torch.float64)).sum()])


def survivor_pass(start_rank, done, back_to, state, step_done_at, fail, hvd):
    """Prints a survivor's PASS line: `done` (what it finished), now rank r
    of n, back to step `back_to`, the rebuild's time and the recovery's
    (from the failure this rank saw, elastic.run's record, to the first
    step completed after it); fails if no failure was seen or no step
    completed after it."""
    failed_at = getattr(state, "_failure_seen_at", None)
    later = [t for _, t in step_done_at if failed_at is not None and t > failed_at]
    if not later:
        fail("no failure was seen, or no step completed after it")
    print(f"elastic: rank {start_rank} PASS: {done}, now rank {hvd.rank()} of {hvd.size()}, "
          f"back to step {back_to} after the failure, rebuild "
          f"{state._last_rebuild['seconds']:.3f} s, recovery {later[0] - failed_at:.3f} s",
          flush=True)


def offsets(period, fragments):
    """The step (mod ``period``) at which each fragment's rounds start."""
    return [((f + 1) * period // fragments) % period for f in range(fragments)]


def merges_at(step, period, fragments, delay):
    """Whether local step ``step`` merges a fragment's round (started
    ``delay`` steps before; at once without a delay)."""
    return any(step - delay >= 1 and (step - delay) % period == o
               for o in offsets(period, fragments))


def rounds_by(step, period, fragments, delay):
    """The fragment rounds merged by local step ``step``."""
    return sum(merges_at(s, period, fragments, delay) for s in range(1, step + 1))


def check_streaming_restore(step, held, kill_step, local_step, rounds, want_rounds, who, fail):
    """Streaming: a survivor's restore is its own last commit (the sync that
    follows may take an earlier one from the root; the ranks differ until
    then), of step ``kill_step`` - 1 or + 1, with ``who``'s local step and
    round count (``rounds``) those of that commit (``want_rounds``)."""
    if step not in (kill_step - 1, kill_step + 1) or step not in held:
        fail(f"restored to step {step}, expected a commit of step {kill_step - 1} or "
             f"{kill_step + 1}")
    if local_step != step or rounds != want_rounds:
        fail(f"{who} restored to local step {local_step}, round {rounds}")


def round_agreed(model, hvd, step, streaming):
    """(step, ranks, whether every rank holds the same parameters) for a
    round committed at ``step``; streaming, the ranks' own steps are on top
    of the rounds, so they are not compared (True)."""
    if streaming:
        return (step, hvd.size(), True)
    sums = hvd.allgather(checksum(model).unsqueeze(0), name=f"check.round.{step}")
    return (step, hvd.size(), all(torch.equal(sums[0], sums[i]) for i in range(sums.shape[0])))

def expected_rounds(streaming, recovered, agreed, period, steps, fragments, delay, fail):
    """What the end of a run with one recovery must show: the step the
    survivors went back to (streaming: the one ``recovered`` holds; else the
    first round's commit), the commits made, the rounds committed after the
    recovery (``agreed``'s (step, ranks, checksums agreed) past that step)
    and the steps they must have been at."""
    if streaming:
        if len(recovered) != 1:
            fail(f"the survivors went on from steps {recovered}, expected one recovery")
        back_to = recovered[0]
        # One commit per step that merged a round (the rolled-back ones undone).
        commits = rounds_by(steps, period, fragments, delay)
        expected = [s for s in range(back_to + 1, steps + 1)
                    if merges_at(s, period, fragments, delay)]
    else:
        back_to, commits = period, steps // period
        expected = list(range(2 * period, steps + 1, period))
    return back_to, commits, [a for a in agreed if a[0] > back_to], expected


def check_identical(model, hvd, fail, when):
    """Fails unless every rank holds the same parameters (their checksums)."""
    if len(set(hvd.allgather_object(tuple(checksum(model).tolist())))) != 1:
        fail(f"the survivors' parameters differ {when}")


def reference_streaming(models, inners, loss, kill_rank, kill_step, recovered, root_old,
                        period, steps, fragments, delay, outer=None):
    """A streaming run (``fragments`` fragments, sync delay ``delay``) with
    a death, in one process: ``models``/``inners`` the 3 ranks' (changed in
    place), ``loss(model, rank, size, step)`` each inner step's loss. All 3
    ranks to step ``kill_step``, the survivors (old ranks and size) to step
    ``recovered`` if it is later, whose commit (``root_old``'s model and
    inner state, the rounds in flight dropped) every survivor takes; then
    the survivors as ranks 0 and 1 of 2. Fragment f's rounds start at the
    steps ``t % period == (f + 1) * period // fragments % period`` and merge
    ``delay`` steps later: the round's model plus each rank's steps since
    its start.

    ``outer`` None: PartialLocalSGD's plain averaging (the round's model is
    the mean of the posted parameters); the recovery opens new stores, each
    fragment's model the root's parameters; at the end (close()) the rounds
    in flight merge, then every fragment takes its model. ``outer`` a
    factory of the outer optimizer over a list of tensors: LocalSGD (the
    model is θ_synced after the outer step on the mean pseudo-gradient
    θ_synced − θ_local; θ_synced and the outer state of the commit kept at
    the recovery, the same on every rank); at the end (sync()) the rounds in
    flight merge, then one more round of every fragment.

    Returns the first survivor's parameters and the fragment rounds merged."""
    from gyre.torch.local_sgd import _fragment_bounds
    plist = [list(m.parameters()) for m in models]
    cuts = _fragment_bounds([p.numel() for p in plist[0]], fragments)
    starts = offsets(period, fragments)
    survivors = [r for r in range(len(models)) if r != kill_rank]

    def get(r, f):
        return flat(plist[r][cuts[f]:cuts[f + 1]]).clone()

    def put(r, f, v):
        at = 0
        with torch.no_grad():
            for p in plist[r][cuts[f]:cuts[f + 1]]:
                p.copy_(v[at:at + p.numel()].view_as(p))
                at += p.numel()

    synced = [torch.nn.Parameter(get(0, f)) for f in range(fragments)]
    outers = [outer([s]) for s in synced] if outer is not None else None  # per fragment
    pending = [None] * fragments  # (due, the round's model, {rank: parameters at the start})
    adopted = 0

    def start(f, ranks, t):
        at_post = {r: get(r, f) for r in ranks}
        pending[f] = (t + delay, torch.stack(list(at_post.values())).mean(dim=0), at_post)

    def merge(f, ranks):
        nonlocal adopted
        _, mean, at_post = pending[f]
        if outer is None:
            model = synced[f] = mean
        else:  # the outer step on the mean pseudo-gradient, when the round completes
            with torch.no_grad():
                synced[f].grad = synced[f].detach() - mean
                outers[f].step()
                synced[f].grad = None
            model = synced[f].detach().clone()
        for r in ranks:
            put(r, f, model + (get(r, f) - at_post[r]))
        pending[f] = None
        adopted += 1

    for t in range(1, steps + 1):
        if t > recovered:
            ranks = [(r, i, len(survivors)) for i, r in enumerate(survivors)]
        elif t <= kill_step:
            ranks = [(r, r, len(models)) for r in range(len(models))]
        else:  # before the failure was seen, in the old world
            ranks = [(r, r, len(models)) for r in survivors]
        alive = [r for r, _, _ in ranks]
        for r, data_rank, size in ranks:
            inners[r].zero_grad()
            loss(models[r], data_rank, size, t - 1).backward()
            inners[r].step()
        for f in range(fragments):
            if pending[f] is not None and pending[f][0] <= t:
                merge(f, alive)
        if t == recovered:
            keep_model = copy.deepcopy(models[root_old].state_dict())
            keep_inner = copy.deepcopy(inners[root_old].state_dict())
            for r in survivors:
                models[r].load_state_dict(keep_model)
                inners[r].load_state_dict(copy.deepcopy(keep_inner))
            if outer is None:
                synced = [get(root_old, f) for f in range(fragments)]
            pending = [None] * fragments
            continue
        for f in range(fragments):
            if t % period == starts[f]:
                start(f, alive, t)
    for f in range(fragments):
        if pending[f] is not None:
            merge(f, survivors)
        if outer is None:
            for r in survivors:
                put(r, f, synced[f])
        else:
            start(f, survivors, 0)
            merge(f, survivors)
    return flat(models[survivors[0]].parameters()), adopted
