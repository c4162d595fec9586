"""Growing back from Python: gyre.torch.elastic under an MPI with ULFM and
`mpirun --with-ft ulfm -np 3 -x GYRE_ELASTIC_RESPAWN=1` (run by
run_respawn.sh). 3 ranks train a small model with a DistributedOptimizer
(SGD with momentum) on an ElasticSampler, committing every step; rank
GYRE_TEST_KILL_RANK (default 1) SIGKILLs itself at step 7. The survivors'
rebuild starts a replacement (this script again, with sys.executable), which
takes the committed TorchState by broadcast: before its first step it must
hold exactly the reference's state at the commit (parameters, sampler
progress, step). Every rank must end on 3 ranks with identical parameters,
equal to a reference run without failure computed here in one process
(the sampler re-partitions the remaining samples among 3 ranks as before).

Prints "elastic: rank N PASS ..." for each of the 3 ranks that finish."""
import os
import signal
import sys
import time

import torch

import gyre.torch as hvd
from gyre.torch.elastic import ElasticSampler

N, BS, KILL_STEP, NP = 132, 4, 7, 3


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 8, generator=g), torch.randn(N, 1, generator=g)


def new_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def new_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


X, Y = data()


def reference(stop=None):
    """The expected model after `stop` steps (all: None) on NP ranks' batches,
    in one process; and the steps of the epoch."""
    model = new_model()
    opt = new_optimizer(model)
    samplers = [ElasticSampler(range(N), seed=3, num_replicas=NP, rank=r) for r in range(NP)]
    steps = len(samplers[0]) // BS
    for b in range(steps if stop is None else stop):
        opt.zero_grad()
        batches = [s.get_indices(b, BS) for s in samplers]
        loss = sum(torch.nn.functional.mse_loss(model(X[i]), Y[i]) for i in batches)
        (loss / len(batches)).backward()
        opt.step()
    return model, steps


def fail(msg):
    print(f"elastic: rank {who} FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


hvd.init()
replacement = hvd.is_replacement()
who = f"r{hvd.rank()}@{hvd.replacement_info()['rebuilds']}" if replacement else str(hvd.rank())
if not hvd.elastic_enabled():
    fail("needs a ULFM build run with mpirun --with-ft ulfm")
kill_rank = int(os.environ.get("GYRE_TEST_KILL_RANK", "1"))
model = new_model()
opt = hvd.DistributedOptimizer(new_optimizer(model), named_parameters=model.named_parameters())
sampler = ElasticSampler(range(N), seed=3)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, step=0)
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
first_entry = [True]
step_done_at = []


@hvd.elastic.run
def train(state):
    if replacement and first_entry[0]:
        # The committed state arrived before this rank's first step.
        want, _ = reference(stop=state.step)
        if state.step != KILL_STEP:
            fail(f"joined at step {state.step}, expected {KILL_STEP}")
        for name, p in model.state_dict().items():
            if not torch.allclose(p, want.state_dict()[name], rtol=1e-5, atol=1e-6):
                fail(f"joined with parameter {name} off the commit by "
                     f"{(p - want.state_dict()[name]).abs().max():.3g}")
        if len(state.sampler.processed_indices) != KILL_STEP * BS * NP:
            fail(f"joined with {len(state.sampler.processed_indices)} samples processed")
        print(f"elastic: rank {who} joined as rank {hvd.rank()} of {hvd.size()} at step "
              f"{state.step} holding the commit", file=sys.stderr, flush=True)
    first_entry[0] = False
    indices = list(state.sampler)
    for b in range(len(indices) // BS):
        if not replacement and hvd.rank() == kill_rank and state.step == KILL_STEP and not resets:
            os.kill(os.getpid(), signal.SIGKILL)
        batch = indices[b * BS:(b + 1) * BS]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[batch]), Y[batch]).backward()
        opt.step()
        state.sampler.record_batch(b, BS)
        state.step += 1
        state.commit()
        step_done_at.append((state.step, time.monotonic()))
    return state.step


steps = train(state)
want_model, want_steps = reference()
if hvd.size() != NP:
    fail(f"{hvd.size()} ranks at the end, expected {NP}")
if not replacement and resets != [NP]:
    fail(f"reset callbacks saw sizes {resets}, expected one reset to {NP} ranks")
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
recovery = ""
failed_at = getattr(state, "_failure_seen_at", None)
if failed_at is not None:
    after = [t for s, t in step_done_at if t > failed_at]
    recovery = (f", rebuild with respawn {state._last_rebuild['seconds']:.3f} s, recovery "
                f"(failure to first step after it) {after[0] - failed_at:.3f} s")
print(f"elastic: rank {who} PASS: {steps} steps, rank {hvd.rank()} of {hvd.size()}{recovery}",
      flush=True)
hvd.shutdown()
