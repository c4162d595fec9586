"""Elastic training with gyre.torch.elastic under an MPI with ULFM and
`mpirun --with-ft ulfm -np 3` (run by run_elastic.sh): 3 ranks train a small
model with a DistributedOptimizer (SGD with momentum) on an ElasticSampler,
committing every step; one rank (GYRE_TEST_KILL_RANK, default 1) SIGKILLs
itself at step 7, before its step's allreduces. The survivors must finish
the epoch with identical parameters, equal to a reference computed here in
one process without gyre: 7 steps on 3 ranks' batches, then the rest of the
epoch from that commit on 2 ranks' batches of the same sampler.

Prints "elastic: rank N PASS ..." per survivor, with the recovery time (the
failure caught to the first step completed after it)."""
import os
import signal
import sys
import time

import torch

import gyre
import gyre.torch as hvd
import kill_in_send
from gyre.torch.elastic import ElasticSampler

N, BS, KILL_STEP = 132, 4, 7
KILL_RANK = int(os.environ.get("GYRE_TEST_KILL_RANK", "1"))
# GYRE_TEST_KILL_IN_SEND=1, with tests/elastic/kill_in_send.cc preloaded
# (LD_PRELOAD): the rank dies inside the transfer of its step's gradients,
# which the DistributedOptimizer's allreduces fuse into one bucket: at step
# 0 it counts the bucket's data sends, at the kill step it dies just before
# posting the first send of the second half of them. The survivors must
# still finish equal to the reference: no partial sum is ever committed.
KILL_IN_SEND = kill_in_send.ENABLED
HIDDEN, LR = 16, 0.05
if KILL_IN_SEND:
    # 40 KiB of gradients: ring chunks (~13 KiB, which the MPI transport sends
    # as pieces of ~3.3 KiB, each under the shared-memory eager limit) far
    # above negotiation messages (run with GYRE_ALLREDUCE_SMALL_BYTES=0); a
    # smaller rate for the wider layer.
    HIDDEN, LR = 1024, 0.002


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 8, generator=g), torch.randn(N, 1, generator=g)


def new_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 1))


def new_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


X, Y = data()


def reference():
    """The expected parameters: the same steps computed in one process."""
    model = new_model()
    opt = new_optimizer(model)

    def step(batches):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(X[b]), Y[b]) for b in batches)
        (loss / len(batches)).backward()
        opt.step()

    samplers = [ElasticSampler(range(N), seed=3, num_replicas=3, rank=r) for r in range(3)]
    for b in range(KILL_STEP):
        step([s.get_indices(b, BS) for s in samplers])
        for s in samplers:
            s.record_batch(b, BS)
    committed = samplers[0].state_dict()
    samplers = [ElasticSampler(range(N), seed=3, num_replicas=2, rank=r) for r in range(2)]
    for s in samplers:
        s.load_state_dict(committed)
    steps = KILL_STEP
    for b in range(len(samplers[0]) // BS):
        step([s.get_indices(b, BS) for s in samplers])
        steps += 1
    return model, steps


def fail(msg):
    print(f"elastic: rank {start_rank} FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


hvd.init()
start_rank = hvd.rank()
if not hvd.elastic_enabled():
    fail("needs a ULFM build run with mpirun --with-ft ulfm")
model = new_model()
opt = hvd.DistributedOptimizer(new_optimizer(model), named_parameters=model.named_parameters())
sampler = ElasticSampler(range(N), seed=3)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, step=0)
# A process set made before the failure: the rebuild drops it.
old_set = hvd.add_process_set([0, 2])
if start_rank in (0, 2):
    hvd.allreduce(torch.ones(1), name="set.before", op=hvd.Sum, process_set=old_set)
resets = []
# What this rank held after each of its commits (its own copies): after the
# recovery the state must be, bit for bit, the commit of the agreed step,
# whether or not commit()'s background copy was done when the failure came.
held = {}


def held_now():
    return ([p.detach().clone() for p in model.parameters()],
            [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()
             if "momentum_buffer" in opt.state[p]])


def check_restored():
    resets.append(hvd.size())
    if state.step not in held:
        fail(f"restored to step {state.step}, which this rank never committed")
    params, momentum = held_now()
    want_params, want_momentum = held[state.step]
    if len(momentum) != len(want_momentum) or not all(
            torch.equal(a, b) for a, b in zip(params + momentum, want_params + want_momentum)):
        fail(f"the restored state differs from the commit of step {state.step}")


state.register_reset_callbacks([check_restored])
step_done_at = []
sends_per_step = [0]


@hvd.elastic.run
def train(state):
    indices = list(state.sampler)
    for b in range(len(indices) // BS):
        if start_rank == KILL_RANK and KILL_IN_SEND and state.step in (0, KILL_STEP):
            if state.step == KILL_STEP and sends_per_step[0] < 2:
                fail(f"step 0 made {sends_per_step[0]} data sends of its gradients' bucket")
            if state.step == KILL_STEP:
                kill_in_send.die_halfway(sends_per_step[0], start_rank)
            else:
                kill_in_send.count_sends(start_rank)
        elif start_rank == KILL_RANK and state.step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        batch = indices[b * BS:(b + 1) * BS]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[batch]), Y[batch]).backward()
        opt.step()
        if start_rank == KILL_RANK and KILL_IN_SEND and state.step == 0:
            sends_per_step[0] = kill_in_send.sends()
        state.sampler.record_batch(b, BS)
        state.step += 1
        state.commit()
        held[state.step] = held_now()
        step_done_at.append((state.step, time.monotonic()))
    return state.step


steps = train(state)
want_model, want_steps = reference()
if hvd.global_process_set.ranks != list(range(hvd.size())):
    fail(f"global_process_set.ranks is {hvd.global_process_set.ranks} after the rebuild")
try:
    hvd.allreduce(torch.ones(1), name="set.after", op=hvd.Sum, process_set=old_set)
    fail("an allreduce on a process set from before the rebuild did not fail")
except gyre.StateError as e:
    if f"process set {old_set.process_set_id}" not in str(e) or "dropped by gyre::rebuild()" not in str(e):
        fail(f"unclear error for a process set dropped by the rebuild: {e}")
new_set = hvd.add_process_set([0])  # a set added after the rebuild, in the new ranks
if hvd.rank() == 0 and hvd.allreduce(torch.ones(1), name="set.new", op=hvd.Sum,
                                     process_set=new_set).item() != 1:
    fail("an allreduce on a process set added after the rebuild gave a wrong sum")
if resets != [2]:
    fail(f"reset callbacks saw sizes {resets}, expected one reset to 2 ranks")
if steps != want_steps or hvd.committed_steps() != want_steps:
    fail(f"finished at step {steps} (committed {hvd.committed_steps()}), expected {want_steps}")
if len(sampler.processed_indices) != N:
    fail(f"{len(sampler.processed_indices)} of {N} samples processed in the epoch")
for name, p in model.state_dict().items():
    mine = p.detach().clone()
    first = hvd.broadcast(mine, root_rank=0, name=f"check.{name}")
    if not torch.equal(first, mine):
        fail(f"parameter {name} differs from rank 0's")
    want = want_model.state_dict()[name]
    if not torch.allclose(mine, want, rtol=1e-5, atol=1e-6):
        fail(f"parameter {name} differs from the reference by {(mine - want).abs().max():.3g}")
failed_at = getattr(state, "_failure_seen_at", None)
after = [t for s, t in step_done_at if failed_at is not None and t > failed_at]
if not after:
    fail("no failure was seen, or no step completed after it")
recovery = after[0] - failed_at
print(f"elastic: rank {start_rank} PASS: {steps} steps, now rank {hvd.rank()} of {hvd.size()}, "
      f"rebuild {state._last_rebuild['seconds']:.3f} s, recovery (failure to first step after "
      f"it) {recovery:.3f} s", flush=True)
hvd.shutdown()
