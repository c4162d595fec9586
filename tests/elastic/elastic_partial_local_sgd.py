"""Elastic PartialLocalSGD with gyre.torch.elastic under an MPI with ULFM and
`mpirun --with-ft ulfm -np 3` (run by run_elastic.sh): 3 ranks train a small
model with PartialLocalSGD (period 4, plain averaging, inner SGD with
momentum) held by a TorchState, committed after every round adopted. One
rank (GYRE_TEST_KILL_RANK, default 1; 0 is the aggregator's rank) SIGKILLs
itself at local step 6, between the first round (step 4) and the second
(step 8). Rounds wait for every rank (late_after_s is far above the steps'
time), so the second round cannot close without the dead rank.

The survivors must get the failure as an error from the store (not a hang),
rebuild, come back to the last commit (the model right after the first
round, identical on every survivor, local step 4), open a new store with a
new aggregator on the new first rank, train on to 5 rounds on 2 ranks,
hold identical parameters after every round (allgather of a checksum), and
end, after close(), equal to a reference computed here in one process
without gyre.

With GYRE_ELASTIC_RESPAWN=1 (run_respawn.sh) the rebuild starts a
replacement, this script again: its PartialLocalSGD opens its store in its
TorchState's first sync, as the survivors open theirs in the recovery's, and
the three finish on 3 ranks, equal to the reference on 3 ranks from the
commit; the replacement's first step must be the one after that commit.

With GYRE_TEST_STREAMING=1 (no respawn): streaming, 2 fragments with a sync
delay of 1, so that rounds are posted at local steps 2, 4, 6, ... (fragment
0 at 2 mod 4, fragment 1 at 0 mod 4) and merged a step later, and the
commits (steps 3, 5, 7, ...) fall while the other fragment's next post is
due. The rank dies before local step 7 with its contribution of step 6
posted; that round may close (a survivor that merges it at step 7 commits
there) or not, so the recovery goes back to step 5 or 7, from whichever
survivor the rebuild chose as its root. The survivors differ between rounds
(each keeps its own steps on top of a merged round), so they are compared
after the sync and after close(); the result must equal a one-process
reference with the same recovery (the root's model and inner state on every
survivor, the rounds in flight dropped).

Prints "elastic: rank N PASS ..." per survivor (and for the replacement)."""
import copy
import os
import signal
import sys
import time

import torch

import gyre.torch as hvd
import local_sgd_task
from local_sgd_task import checksum, flat, loss_of

PERIOD, ROUNDS, KILL_STEP = 4, 5, 6
STEPS = PERIOD * ROUNDS
KILL_RANK = int(os.environ.get("GYRE_TEST_KILL_RANK", "1"))
# GYRE_ELASTIC_RESPAWN=1 (run by run_respawn.sh): the survivors' rebuild
# starts a replacement (this script again), which joins as rank 2; the
# training goes on on 3 ranks from the commit.
# (A replacement, started by MPI_Comm_spawn, need not see the variable:
# being one says so; RESPAWN and AFTER are set after init() below.)
RESPAWN = os.environ.get("GYRE_ELASTIC_RESPAWN", "") == "1"
HIDDEN, LR = 16, 0.05
STREAMING = os.environ.get("GYRE_TEST_STREAMING", "") == "1"
FRAGMENTS, DELAY = (2, 1) if STREAMING else (1, 0)


def merges_at(step):
    return local_sgd_task.merges_at(step, PERIOD, FRAGMENTS, DELAY)


def rounds_by(step):
    return local_sgd_task.rounds_by(step, PERIOD, FRAGMENTS, DELAY)


torch.set_num_threads(1)


def new_model():
    return local_sgd_task.new_model(HIDDEN)


def new_inner(params):
    return local_sgd_task.new_inner(params, LR)


def reference(root_old_rank):
    """The expected parameters, in one process: 3 simulated ranks until the
    commit of the first round (step PERIOD), then AFTER (2, or 3 with the
    replacement) from that commit on, whose inner momentum is the sync
    root's at the commit; every round the mean of the ranks' parameters
    (PartialLocalSGD's plain averaging with every rank on time). Right
    after a round every rank's model is the same, so the ranks after the
    commit start from any of them."""
    models = [new_model() for _ in range(3)]
    inners = [new_inner(m.parameters()) for m in models]
    for step in range(STEPS):
        if step == PERIOD:
            keep = inners[root_old_rank].state_dict()
            models, inners = models[:AFTER], inners[:AFTER]
            for inner in inners:
                inner.load_state_dict(copy.deepcopy(keep))
        size = len(models)
        for r, (m, inner) in enumerate(zip(models, inners)):
            inner.zero_grad()
            loss_of(m, r, size, step).backward()
            inner.step()
        if (step + 1) % PERIOD == 0:
            with torch.no_grad():
                for ps in zip(*[list(m.parameters()) for m in models]):
                    avg = torch.stack([p.detach() for p in ps]).mean(dim=0)
                    for p in ps:
                        p.copy_(avg)
    return flat(models[0].parameters())


def reference_streaming(root_old, recovered):
    """The streaming run in one process (local_sgd_task.reference_streaming,
    plain averaging): the parameters after close() and the rounds adopted."""
    models = [new_model() for _ in range(3)]
    inners = [new_inner(m.parameters()) for m in models]
    return local_sgd_task.reference_streaming(models, inners, loss_of, KILL_RANK, KILL_STEP,
                                              recovered, root_old, PERIOD, STEPS, FRAGMENTS,
                                              DELAY)


def fail(msg):
    print(f"elastic: rank {start_rank} FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


hvd.init()
start_rank = hvd.rank()
replacement = hvd.is_replacement()
RESPAWN = RESPAWN or replacement
AFTER = 3 if RESPAWN else 2  # ranks after the recovery
if not hvd.elastic_enabled():
    fail("needs a ULFM build run with mpirun --with-ft ulfm")
model = new_model()
if STREAMING and RESPAWN:
    fail("GYRE_TEST_STREAMING=1 is tested without respawn")
opt = hvd.PartialLocalSGD(new_inner(model.parameters()), model, period=PERIOD, late_after_s=60.0,
                          max_staleness=1, timeout_s=120.0, fragments=FRAGMENTS,
                          sync_delay=DELAY)
state = hvd.elastic.TorchState(model, opt, step=0)
held = {}        # state.step -> parameters right after its commit
agreed = []      # per round adopted: (step, ranks, did every rank's checksum agree)
resets = []
step_done_at = []


def check_restored():
    resets.append(hvd.size())
    if STREAMING:
        local_sgd_task.check_streaming_restore(state.step, held, KILL_STEP, opt.local_step,
                                               opt.version, rounds_by(state.step),
                                               "PartialLocalSGD", fail)
        if not torch.equal(flat(model.parameters()), held[state.step]):
            fail("the restored parameters differ from what this rank held at the commit")
        check_after_sync.append(True)
        return
    if state.step != PERIOD:
        fail(f"restored to step {state.step}, expected the commit of the first round ({PERIOD})")
    if opt.local_step != PERIOD or opt.version != 1:
        fail(f"PartialLocalSGD restored to local step {opt.local_step}, round {opt.version}")
    if not torch.equal(flat(model.parameters()), held[state.step]):
        fail("the restored parameters differ from what this rank held at the commit")
    if RESPAWN:
        # Reset callbacks run before the sync (Horovod's order), and a
        # replacement's first act is the sync: the ranks compare their
        # parameters after it, at train()'s next start.
        check_after_sync.append(True)
        return
    compare_parameters("the survivors")


def compare_parameters(who):
    sums = hvd.allgather(checksum(model).unsqueeze(0), name="check.restored")
    if not all(torch.equal(sums[0], sums[i]) for i in range(sums.shape[0])):
        fail(f"the parameters at the commit differ across {who}: {sums.tolist()}")


check_after_sync = [True] if replacement else []
recovered = []  # streaming: the step the survivors went on from


state.register_reset_callbacks([check_restored])


@hvd.elastic.run
def train(state):
    if check_after_sync and STREAMING:
        # Every survivor holds the sync root's commit now.
        check_after_sync.clear()
        recovered.append(state.step)
        if opt.local_step != state.step or opt.version != rounds_by(state.step):
            fail(f"at step {state.step}, local step {opt.local_step}, round {opt.version} after "
                 f"the sync")
        compare_parameters("the survivors")
    elif check_after_sync:
        # Respawn: every rank holds the sync root's commit now, the
        # replacement (its first entry) included.
        check_after_sync.clear()
        if state.step != PERIOD or opt.local_step != PERIOD or opt.version != 1:
            fail(f"at step {state.step}, local step {opt.local_step}, round {opt.version} after "
                 f"the sync; expected the first round's commit ({PERIOD}, {PERIOD}, 1)")
        compare_parameters("the survivors and the replacement")
    while state.step < STEPS:
        step = state.step
        if start_rank == KILL_RANK and step == KILL_STEP and not replacement:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss_of(model, hvd.rank(), hvd.size(), step).backward()
        opt.step()
        state.step = step + 1
        if opt.completed_round != merges_at(state.step):
            fail(f"completed_round is {opt.completed_round} after local step {state.step}")
        if opt.completed_round:
            state.commit()
            held[state.step] = flat(model.parameters()).clone()
            agreed.append(local_sgd_task.round_agreed(model, hvd, state.step, STREAMING))
        step_done_at.append((state.step, time.monotonic()))
    return state.step


steps = train(state)
opt.close()
# A replacement's TorchState syncs once, at its start; no reset follows.
if resets != ([] if replacement else [AFTER]):
    fail(f"reset callbacks saw sizes {resets}, expected one reset to {AFTER} ranks")
if hvd.size() != AFTER:
    fail(f"{hvd.size()} ranks at the end, expected {AFTER}")
# The sync root's rank at the start (a replacement's is its own rank now,
# not in the old world: rank 0, a survivor, says which it was).
old_ranks = [int(r) for r in hvd.allgather(torch.tensor([start_rank]), name="check.old_ranks")]
root_old = hvd.broadcast_object(
    None if replacement else old_ranks[int(state._last_rebuild["root"])], root_rank=0,
    name="check.root_old")
back_to, commits, after, expected_after = local_sgd_task.expected_rounds(
    STREAMING, recovered, agreed, PERIOD, STEPS, FRAGMENTS, DELAY, fail)
if STREAMING:  # close() merged the last round in flight, without a commit
    want, rounds = reference_streaming(root_old, back_to)
    local_sgd_task.check_identical(model, hvd, fail, "after close()")
else:
    rounds, want = ROUNDS, reference(root_old)
if steps != STEPS or opt.version != rounds:
    fail(f"finished at step {steps} at round {opt.version}, expected {STEPS} and {rounds}")
if [s for s, _, _ in after] != expected_after or not all(ok and n == AFTER for _, n, ok in after):
    fail(f"rounds after the recovery (step, ranks, checksums agree): {after}")
if hvd.committed_steps() != commits:
    fail(f"committed {hvd.committed_steps()} steps, expected {commits}")
mine = flat(model.parameters())
if not torch.allclose(mine, want, rtol=1e-5, atol=1e-6):
    fail(f"the parameters differ from the reference by {(mine - want).abs().max():.3g}")
if replacement:
    if step_done_at[0][0] != PERIOD + 1:
        fail(f"its first step ended at step {step_done_at[0][0]}, expected {PERIOD + 1}: it did "
             f"not join at the first round's commit")
    print(f"elastic: rank {start_rank} PASS: the replacement joined at step {PERIOD}, "
          f"{steps} local steps, round {opt.version}, rank {hvd.rank()} of {hvd.size()}",
          flush=True)
else:
    what = f"{steps} local steps, round {opt.version}"
    if STREAMING:
        what += f" (streaming: 2 fragments, sync delay 1; the sync root was rank {root_old})"
    local_sgd_task.survivor_pass(start_rank, what, back_to, state, step_done_at, fail, hvd)
hvd.shutdown()
