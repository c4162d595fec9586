"""Elastic local SGD / DiLoCo with gyre.torch.elastic under an MPI with ULFM
and `mpirun --with-ft ulfm -np 3` (run by run_elastic.sh): 3 ranks train a
small model with LocalSGD (period 4, DiLoCo's outer optimizer, inner SGD with
momentum) held by a TorchState, committed after every outer round. One rank
(GYRE_TEST_KILL_RANK, default 1) SIGKILLs itself at local step 6, between
the first round (step 4) and the second (step 8); with
GYRE_TEST_KILL_IN_SEND=1 (tests/elastic/kill_in_send.cc preloaded) it dies
instead inside the second round's allreduce, after half of its data sends.

Either way the survivors must get the failure as an error in the second
round (not a hang), rebuild, come back to the last commit (the parameters
right after the first round: bit for bit what each held then, identical on
every survivor, with the synchronised parameters, the outer momentum and the
step counters of that commit), train on to 5 rounds on 2 ranks, hold
identical parameters after every round (allgather of a checksum) and end
equal to a reference computed here in one process without gyre.

With GYRE_TEST_STREAMING=1: streaming, 2 fragments with a sync delay of 1
(fragment 0's rounds start at local steps 2, 6, 10, ..., fragment 1's at 4,
8, ...; each completes, with its outer step and a commit, a step later). The
rank dies before local step 7, fragment 0's round of step 6 started: a
survivor that completes it commits at step 7, and the recovery goes back to
step 5 or 7 (the rebuild's root: the survivor with the earlier commit). A
commit falls while the other fragment's round is in flight, and holds the
state from before that round. The survivors must come back to their own
commit (parameters, θ_synced, the outer momentum), then hold the root's
after the sync, and end (after sync(): the round in flight, then one more
round of every fragment) identical and equal to a one-process reference
with the same recovery (local_sgd_task.reference_streaming).

Prints "elastic: rank N PASS ..." per survivor."""
import copy
import os
import signal
import sys
import time

import torch

import gyre.torch as hvd
import local_sgd_task
from local_sgd_task import checksum, flat, loss_of
import kill_in_send

PERIOD, ROUNDS, KILL_STEP = 4, 5, 6
STEPS = PERIOD * ROUNDS
KILL_RANK = int(os.environ.get("GYRE_TEST_KILL_RANK", "1"))
KILL_IN_SEND = kill_in_send.ENABLED
HIDDEN, LR = 16, 0.05
if KILL_IN_SEND:
    # ~40 KiB of pseudo-gradients in the round's fused allreduce, its ring
    # chunks far above the negotiation's messages (GYRE_ALLREDUCE_SMALL_BYTES=0).
    HIDDEN, LR = 1024, 0.002
STREAMING = os.environ.get("GYRE_TEST_STREAMING", "") == "1"
FRAGMENTS, DELAY = (2, 1) if STREAMING else (1, 0)
if STREAMING and KILL_IN_SEND:
    raise SystemExit("GYRE_TEST_STREAMING=1 is tested without GYRE_TEST_KILL_IN_SEND")
torch.set_num_threads(1)


def merges_at(step):
    return local_sgd_task.merges_at(step, PERIOD, FRAGMENTS, DELAY)


def rounds_by(step):
    return local_sgd_task.rounds_by(step, PERIOD, FRAGMENTS, DELAY)


def new_model():
    return local_sgd_task.new_model(HIDDEN)


def new_inner(params):
    return local_sgd_task.new_inner(params, LR)


def reference(root_old_rank):
    """The expected parameters, in one process: ROUNDS rounds of 3 simulated
    ranks until the commit of the first round (step PERIOD), then from that
    commit on 2 ranks, whose inner momentum is the sync root's at the commit."""
    models = [new_model() for _ in range(3)]
    inners = [new_inner(m.parameters()) for m in models]
    synced = [torch.nn.Parameter(p.detach().clone()) for p in models[0].parameters()]
    outer = hvd.LocalSGD.diloco_outer(synced)
    for step in range(STEPS):
        if step == PERIOD:  # the commit the survivors go back to
            keep = inners[root_old_rank].state_dict()
            models, inners = models[:2], inners[:2]
            for inner in inners:
                # (load_state_dict may keep the tensors it is given: a copy each)
                inner.load_state_dict(copy.deepcopy(keep))
        size = len(models)
        for r, (m, inner) in enumerate(zip(models, inners)):
            inner.zero_grad()
            loss_of(m, r, size, step).backward()
            inner.step()
        if (step + 1) % PERIOD == 0:
            with torch.no_grad():
                for i, s in enumerate(synced):
                    locals_ = [list(m.parameters())[i] for m in models]
                    s.grad = torch.stack([s.detach() - p.detach() for p in locals_]).mean(dim=0)
                outer.step()
                for m in models:
                    for p, s in zip(m.parameters(), synced):
                        p.copy_(s)
    return flat(models[0].parameters())


def reference_streaming(root_old, recovered):
    """The streaming run in one process (local_sgd_task.reference_streaming,
    DiLoCo's outer step): the parameters after sync() and the rounds."""
    models = [new_model() for _ in range(3)]
    inners = [new_inner(m.parameters()) for m in models]
    return local_sgd_task.reference_streaming(models, inners, loss_of, KILL_RANK, KILL_STEP,
                                              recovered, root_old, PERIOD, STEPS, FRAGMENTS,
                                              DELAY, outer=hvd.LocalSGD.diloco_outer)


def fail(msg):
    print(f"elastic: rank {start_rank} FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


hvd.init()
start_rank = hvd.rank()
if not hvd.elastic_enabled():
    fail("needs a ULFM build run with mpirun --with-ft ulfm")
model = new_model()
opt = hvd.LocalSGD(new_inner(model.parameters()), model, period=PERIOD,
                   outer_optimizer=hvd.LocalSGD.diloco_outer, fragments=FRAGMENTS,
                   sync_delay=DELAY)
state = hvd.elastic.TorchState(model, opt, step=0)
held = {}        # state.step -> (parameters, synced, outer momentum) right after its commit
agreed = []      # per round committed: did every rank's checksum agree
resets = []
step_done_at = []
sends_per_round = [0]


def outer_momentum():
    st = opt.outer_optimizer.state
    return [st[s]["momentum_buffer"].clone() for s in opt._synced if "momentum_buffer" in st[s]]


def check_restored():
    resets.append(hvd.size())
    if STREAMING:
        local_sgd_task.check_streaming_restore(state.step, held, KILL_STEP, opt.local_step,
                                               opt.rounds, rounds_by(state.step), "LocalSGD",
                                               fail)
        check_own_commit()
        check_after_sync.append(True)
        return
    if state.step != PERIOD:
        fail(f"restored to step {state.step}, expected the commit of the first round ({PERIOD})")
    if opt.local_step != PERIOD or opt.rounds != 1:
        fail(f"LocalSGD restored to local step {opt.local_step}, round {opt.rounds}")
    check_own_commit()
    compare_parameters("the survivors")


def check_own_commit():
    params, synced, momentum = held[state.step]
    if not torch.equal(flat(model.parameters()), params):
        fail("the restored parameters differ from what this rank held at the commit")
    if not torch.equal(flat(opt._synced), synced):
        fail("the restored synchronised parameters differ from the commit's")
    now = outer_momentum()
    if len(now) != len(momentum) or not all(torch.equal(a, b) for a, b in zip(now, momentum)):
        fail("the restored outer (DiLoCo) momentum differs from the commit's")


def compare_parameters(who):
    sums = hvd.allgather(checksum(model).unsqueeze(0), name="check.restored")
    if not all(torch.equal(sums[0], sums[i]) for i in range(sums.shape[0])):
        fail(f"the restored parameters differ across {who}: {sums.tolist()}")


check_after_sync = []
recovered = []  # streaming: the step the survivors went on from
state.register_reset_callbacks([check_restored])


@hvd.elastic.run
def train(state):
    if check_after_sync:
        # Every survivor holds the sync root's commit now.
        check_after_sync.clear()
        recovered.append(state.step)
        # Commits this rank made past the root's were rolled back.
        agreed[:] = [a for a in agreed if a[0] <= state.step]
        if opt.local_step != state.step or opt.rounds != rounds_by(state.step):
            fail(f"at step {state.step}, local step {opt.local_step}, round {opt.rounds} after "
                 f"the sync")
        compare_parameters("the survivors after the sync")
    while state.step < STEPS:
        step = state.step
        if start_rank == KILL_RANK and KILL_IN_SEND:
            if step == PERIOD - 1:  # count the first round's data sends
                kill_in_send.count_sends(start_rank)
            elif step == 2 * PERIOD - 1:  # die inside the second round's
                if sends_per_round[0] < 2:
                    fail(f"the first round made {sends_per_round[0]} data sends")
                kill_in_send.die_halfway(sends_per_round[0], start_rank)
        elif start_rank == KILL_RANK and step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss_of(model, hvd.rank(), hvd.size(), step).backward()
        opt.step()
        if start_rank == KILL_RANK and KILL_IN_SEND and step == PERIOD - 1:
            sends_per_round[0] = kill_in_send.sends()
        state.step = step + 1
        if opt.completed_round != merges_at(state.step):
            fail(f"completed_round is {opt.completed_round} after local step {state.step}")
        if opt.completed_round:
            state.commit()
            held[state.step] = (flat(model.parameters()).clone(), flat(opt._synced).clone(),
                                outer_momentum())
            agreed.append(local_sgd_task.round_agreed(model, hvd, state.step, STREAMING))
        step_done_at.append((state.step, time.monotonic()))
    return state.step


steps = train(state)
if resets != [2]:
    fail(f"reset callbacks saw sizes {resets}, expected one reset to 2 ranks")
# The reference: the survivors' inner momentum is the sync root's at the commit.
old_ranks = [int(r) for r in hvd.allgather(torch.tensor([start_rank]), name="check.old_ranks")]
root_old = old_ranks[int(state._last_rebuild["root"])]
back_to, commits, after, expected_after = local_sgd_task.expected_rounds(
    STREAMING, recovered, agreed, PERIOD, STEPS, FRAGMENTS, DELAY, fail)
if STREAMING:
    opt.sync()  # the round in flight, then one more round of every fragment (no commit)
    want, rounds = reference_streaming(root_old, back_to)
    local_sgd_task.check_identical(model, hvd, fail, "after sync()")
else:
    rounds, want = ROUNDS, reference(root_old)
    if opt.fragment_versions() != [ROUNDS]:
        fail(f"fragment versions {opt.fragment_versions()}, expected [{ROUNDS}]")
if steps != STEPS or opt.rounds != rounds:
    fail(f"finished at step {steps} after {opt.rounds} rounds, expected {STEPS} and {rounds}")
# Every round committed after the recovery agreed, on 2 ranks.
if [s for s, _, _ in after] != expected_after or not all(ok and n == 2 for _, n, ok in after):
    fail(f"rounds after the recovery (step, ranks, checksums agree): {after}")
if hvd.committed_steps() != commits:
    fail(f"committed {hvd.committed_steps()} steps, expected {commits}")
mine = flat(model.parameters())
if not torch.allclose(mine, want, rtol=1e-5, atol=1e-6):
    fail(f"the parameters differ from the reference by {(mine - want).abs().max():.3g}")
what = f"{steps} local steps, {opt.rounds} rounds"
if STREAMING:
    what += f" (streaming: 2 fragments, sync delay 1; the sync root was rank {root_old})"
local_sgd_task.survivor_pass(start_rank, what, back_to, state, step_done_at, fail, hvd)
hvd.shutdown()
