#!/usr/bin/env python3
"""Wall time to a target loss: synchronous DDP on gyre against local SGD and DiLoCo.

    mpirun -np 4 python3 benchmarks/local_sgd.py --out local_sgd.json
    GYRE_HOSTS_RATE=1gbit GYRE_HOSTS_QUEUE_MS=50 \\
        bash scripts/hosts.sh run 2 2 python3 benchmarks/local_sgd.py --netdev eth0 --out local_sgd.json

Every rank trains the same small causal transformer language model (token
and learned position embeddings, pre-norm nn.TransformerEncoder layers, a
linear head) on its own batches of one synthetic, learnable language: an
order-2 Markov chain over a small vocabulary whose transition table is fixed
by --seed (each pair of previous tokens has --branch possible next tokens with
Dirichlet-drawn probabilities), so the loss has a known floor (the chain's
conditional entropy, printed) and every run sees the same data: rank r's
training stream and the held-out evaluation set are generated from seeds,
identically in every mode and every run.

Modes, run one after the other in the same job (same ranks, same links):
  sync        DistributedDataParallel on torch.distributed's "gyre" backend,
              AdamW; one allreduce of every gradient per step
  localH      gyre.torch.LocalSGD(AdamW, period=H), outer plain averaging
  dilocoH     gyre.torch.LocalSGD(AdamW, period=H,
              outer_optimizer=LocalSGD.diloco_outer) (SGD lr 0.7, Nesterov 0.9;
              --outer-lr and --outer-momentum change them)
  localHfFdD, dilocoHfFdD
              the same, streaming: the parameters in F fragments whose
              rounds are spread over the period, each fragment's allreduce
              completed D inner steps after it starts (LocalSGD's
              fragments=F, sync_delay=D), e.g. diloco16f4d2
  any of these with -fp16, -bf16 or -int8: the pseudo-gradients travel
              compressed (LocalSGD's compression=gyre.Compression.fp16,
              .bf16, or LocalSGD.int8), e.g. diloco16-bf16
The synchronous run goes first for --steps steps; its final evaluation loss is
the target. Every other mode runs until its evaluation loss is at or below the
target or until --max-factor x --steps steps.

--pretrain N: every mode starts from one model pre-trained for N steps (one
worker's AdamW training on a stream of its own, run alike on every rank
without communication; untimed), each with a fresh optimizer: DiLoCo's
setting, where the outer hyperparameters come from.

Timing: each rank times its training steps (batch lookup, forward, backward,
optimizer step with its communication); evaluation is not timed. Every
--eval-every steps each rank evaluates its current model (for local SGD the
ranks' models differ between rounds) on the fixed held-out set, and one
allgather (untimed) collects every rank's loss, training time and byte
counters: the curve's loss is the mean over ranks, its time the slowest rank's
training time so far. That allgather also re-aligns the ranks every
--eval-every steps.

Bytes per step, three figures. "runtime": what gyre's runtime counted
itself sending over its transports (gyre.runtime_stats()["transport_bytes"]:
negotiation and the collectives' data; shared memory within a host is not
a transport and is not counted), less the evaluation allgathers', per rank
per step. "payload": the bytes of the tensors this rank hands to
the allreduce (DDP: every gradient each step; local SGD: every parameter's
pseudo-gradient plus float buffers each round), computed from the tensor
sizes, divided by the steps. "wire" (only with --netdev, e.g. eth0 inside
scripts/hosts.sh's namespaces): the host's transmitted bytes on that
interface read from /proc/net/dev (the kernel's counter for the host's
link: everything gyre and MPI sent between hosts, TCP/IP headers included),
with the traffic during the evaluation allgathers subtracted, per host per
step; read by every rank, reported once per host.

Output: a JSON of every curve and a summary table (time to the target and its
ratio to the synchronous run's, steps, ms per step, bytes per step).
"""
import argparse
import functools
import json
import os
import re
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gyre
import gyre.torch as hvd
import gyre.torch.distributed  # noqa: F401  (registers the "gyre" backend)


class LM(nn.Module):
    def __init__(self, vocab, d, layers, heads, ff, seq):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        # A plain attribute, not a buffer: LocalSGD would average it with the float buffers.
        self.mask = nn.Transformer.generate_square_subsequent_mask(seq)

    def forward(self, x):
        h = self.emb(x) + self.pos[: x.shape[1]]
        return self.head(self.ln(self.enc(h, mask=self.mask, is_causal=True)))

    def loss(self, tokens):
        logits = self(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, self.vocab), tokens[:, 1:].reshape(-1))


def markov_table(vocab, branch, seed):
    """(successors [V, V, branch], probabilities [V, V, branch]) of an order-2 chain."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.stack([torch.stack([torch.randperm(vocab, generator=g)[:branch] for _ in range(vocab)])
                        for _ in range(vocab)])
    # Dirichlet(1, ..., 1) as normalised Exp(1) draws (from g, not the global generator).
    gamma = -torch.log(torch.rand(vocab, vocab, branch, generator=g))
    probs = gamma / gamma.sum(-1, keepdim=True)
    return succ, probs


def entropy_floor(probs):
    """The chain's conditional entropy (nats) under its stationary pair distribution,
    estimated by the uniform pair average (the pairs are close to uniform)."""
    return float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean())


def sequences(succ, probs, n, length, seed, order=2):
    """n sequences of the chain, each from a random start pair (order 1: the
    next token depends on the previous one only, through the table's row 0)."""
    g = torch.Generator().manual_seed(seed)
    vocab = succ.shape[0]
    out = torch.empty(n, length, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    out[:, 1] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(2, length):
        a, b = out[:, t - 2] * (order - 1), out[:, t - 1]
        pick = torch.multinomial(probs[a, b], 1, generator=g).squeeze(1)
        out[:, t] = succ[a, b, pick]
    return out


def netdev_tx(dev):
    """Transmitted bytes of interface dev in this process's network namespace."""
    if not dev:
        return 0
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                return int(rest.split()[8])
    raise SystemExit(f"local_sgd: no interface {dev!r} in /proc/net/dev")


def payload_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def pretrain(args, succ, probs, evalset):
    """--pretrain N: N steps of one worker's AdamW training (batch --batch
    from a stream no mode trains on), run identically on every rank without
    communication, so that every rank holds the same model (one thread,
    same operations, same data). Returns its state dict and its evaluation
    loss; every mode starts from it, with a fresh optimizer."""
    torch.manual_seed(args.seed)
    model = LM(args.vocab, args.d_model, args.layers, args.heads, args.ff, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    stream = sequences(succ, probs, args.train_seqs, args.seq + 1, args.seed * 1000 + 997, args.order)
    picker = torch.Generator().manual_seed(args.seed * 1000 + 991)
    for _ in range(args.pretrain):
        batch = stream[torch.randint(0, stream.shape[0], (args.batch,), generator=picker)]
        opt.zero_grad()
        _loss(model, batch, args.vocab).backward()
        opt.step()
    with torch.no_grad():
        loss = float(model.loss(evalset))
    # Every rank must hold the same bits.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo = gyre.allreduce(flat.view(torch.int32).clone(), op=gyre.Min, name="bench.pretrain.min")
    hi = gyre.allreduce(flat.view(torch.int32).clone(), op=gyre.Max, name="bench.pretrain.max")
    if not torch.equal(lo, hi):
        raise SystemExit("local_sgd: the ranks' pretrained models differ")
    return {k: v.clone() for k, v in model.state_dict().items()}, loss


def run_mode(mode, args, succ, probs, evalset, target, start_state=None):
    rank, world = gyre.rank(), gyre.size()
    torch.manual_seed(args.seed)
    model = LM(args.vocab, args.d_model, args.layers, args.heads, args.ff, args.seq)
    if start_state is not None:
        model.load_state_dict(start_state)
    params = [p for p in model.parameters() if p.requires_grad]
    param_bytes = payload_bytes(params)
    buffer_bytes = payload_bytes([b for b in model.buffers() if b.dtype.is_floating_point])
    if mode == "sync":
        model = DDP(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        period, outer = 1, None
        round_bytes = param_bytes  # every gradient, every step
        core = model.module
    else:
        found = re.fullmatch(r"(local|diloco)(\d+)(?:f(\d+)d(\d+))?(?:-(fp16|bf16|int8))?", mode)
        if not found:
            raise SystemExit(f"local_sgd: unknown mode {mode!r} (sync, localH, dilocoH, "
                             f"localHfFdD, dilocoHfFdD, each optionally -fp16, -bf16 or -int8)")
        period = int(found.group(2))
        fragments = int(found.group(3) or 1)
        sync_delay = int(found.group(4) or 0)
        compression = {None: gyre.Compression.none, "fp16": gyre.Compression.fp16,
                       "bf16": gyre.Compression.bf16, "int8": hvd.LocalSGD.int8}[found.group(5)]
        outer = hvd.LocalSGD.diloco_outer if mode.startswith("diloco") else None
        if outer is not None and (args.outer_lr is not None or args.outer_momentum is not None):
            # DiLoCo's outer step with other hyperparameters (Nesterov SGD).
            lr = 0.7 if args.outer_lr is None else args.outer_lr
            momentum = 0.9 if args.outer_momentum is None else args.outer_momentum
            outer = functools.partial(torch.optim.SGD, lr=lr, momentum=momentum, nesterov=momentum > 0)
        inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        opt = hvd.LocalSGD(inner, model, period=period, outer_optimizer=outer,
                           fragments=fragments, sync_delay=sync_delay, compression=compression)
        # LocalSGD's round: one grouped allreduce of every parameter's
        # pseudo-gradient and every float buffer (this model has none).
        round_bytes = param_bytes + buffer_bytes
        if found.group(5) in ("fp16", "bf16"):
            round_bytes //= 2  # every pseudo-gradient and buffer in 16 bits
        elif found.group(5) == "int8":
            # One byte per value and a float32 scale per block of
            # LocalSGD.int8.block values, allgathered; buffers in float32.
            values = param_bytes // 4
            round_bytes = values + 4 * -(-values // hvd.LocalSGD.int8.block) + buffer_bytes
        core = model
    # This rank's training data: the same stream in every mode and run.
    stream = sequences(succ, probs, args.train_seqs, args.seq + 1, args.seed * 1000 + 17 + rank, args.order)
    picker = torch.Generator().manual_seed(args.seed * 1000 + 71 + rank)
    max_steps = args.steps if mode == "sync" else int(args.max_factor * args.steps)
    train_s = 0.0
    eval_tx = 0
    tx0 = netdev_tx(args.netdev)
    rt0 = gyre.runtime_stats()["transport_bytes"]
    eval_rt = 0
    payload = 0
    curve = []

    def evaluate(step):
        nonlocal eval_tx, eval_rt
        model.eval()
        with torch.no_grad():
            loss = float(core.loss(evalset))
        model.train()
        before = netdev_tx(args.netdev)
        rt_before = gyre.runtime_stats()["transport_bytes"]
        row = torch.tensor([[loss, train_s, float(payload), float(netdev_tx(args.netdev) - tx0 - eval_tx),
                             float(rt_before - rt0 - eval_rt)]], dtype=torch.float64)
        rows = gyre.allgather(row, name=f"bench.eval.{mode}.{step}")
        eval_tx += netdev_tx(args.netdev) - before
        eval_rt += gyre.runtime_stats()["transport_bytes"] - rt_before
        mean_loss = float(rows[:, 0].mean())
        point = {"step": step, "time_s": float(rows[:, 1].max()), "loss": mean_loss,
                 "rank_losses": [float(v) for v in rows[:, 0]],
                 "payload_bytes_per_rank": float(rows[:, 2].mean()),
                 # What the runtime's own counters say each rank sent over its
                 # transports (negotiation and data; not shared memory).
                 "runtime_bytes_per_rank": float(rows[:, 4].mean())}
        if args.netdev:
            point["wire_tx_bytes_per_rank_view"] = [float(v) for v in rows[:, 3]]
        curve.append(point)
        return mean_loss

    evaluate(0)
    step = 0
    while step < max_steps:
        t0 = time.perf_counter()
        idx = torch.randint(0, stream.shape[0], (args.batch,), generator=picker)
        batch = stream[idx]
        opt.zero_grad()
        loss = _loss(model, batch, args.vocab)  # through DDP's forward in the sync mode
        loss.backward()
        opt.step()
        step += 1
        at_eval = step % args.eval_every == 0 or step == max_steps
        if at_eval and mode != "sync":
            # Streaming (sync_delay > 0): a fragment's round may be in flight
            # here. Its communication must not run during the untimed
            # evaluation, whose allgather's bytes are subtracted from the
            # counters: wait, timed, until it has arrived (it is merged at
            # its due step as always). This charges streaming the part of
            # that round the next inner steps would have hidden.
            for frag in opt._fragments:
                while frag.handle is not None and not gyre.poll(frag.handle):
                    time.sleep(0.0005)
        train_s += time.perf_counter() - t0
        if step % period == 0:
            payload += round_bytes
        if at_eval:
            mean_loss = evaluate(step)
            if rank == 0 and args.verbose:
                print(f"  {mode} step {step} t {curve[-1]['time_s']:.1f}s loss {mean_loss:.4f}", flush=True)
            if target is not None and mean_loss <= target:
                break
    if mode != "sync":
        opt.sync()  # a streaming round still in flight ends here, untimed, before the next mode
    # Host-level wire bytes: ranks on the same host read the same counter.
    hosts = gyre.allgather_object(socket.gethostname(), name=f"bench.hosts.{mode}")
    result = {"mode": mode, "period": period, "outer": "diloco" if outer else ("plain" if period > 1 else None),
              "steps": step, "curve": curve, "round_payload_bytes": round_bytes,
              "payload_bytes_per_step": curve[-1]["payload_bytes_per_rank"] / step,
              "runtime_bytes_per_step": curve[-1]["runtime_bytes_per_rank"] / step}
    if args.netdev:
        per_host = {}
        for r, h in enumerate(hosts):
            per_host.setdefault(h, curve[-1]["wire_tx_bytes_per_rank_view"][r])
        result["wire_tx_bytes_per_host_per_step"] = {h: v / step for h, v in per_host.items()}
        result["wire_tx_bytes_per_rank_per_step"] = sum(per_host.values()) / world / step
    return result


def _loss(model, batch, vocab):
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))


def time_to(curve, target):
    for p in curve:
        if p["loss"] <= target:
            return p["time_s"], p["step"]
    return None, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="sync,local4,local16,local64,diloco16")
    parser.add_argument("--steps", type=int, default=192, help="steps of the synchronous run")
    parser.add_argument("--max-factor", type=float, default=1.5,
                        help="other modes stop at the target or after this many times --steps")
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--branch", type=int, default=2)
    parser.add_argument("--order", type=int, default=2, choices=(1, 2))
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-seqs", type=int, default=4096, help="sequences in each rank's stream")
    parser.add_argument("--eval-seqs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--outer-lr", type=float, default=None,
                        help="dilocoH: the outer SGD's learning rate (default DiLoCo's 0.7)")
    parser.add_argument("--outer-momentum", type=float, default=None,
                        help="dilocoH: the outer SGD's Nesterov momentum (default DiLoCo's 0.9)")
    parser.add_argument("--pretrain", type=int, default=0,
                        help="start every mode from a model pre-trained for this many steps "
                             "(one worker's, computed on every rank alike; untimed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--netdev", default="", help="interface whose tx bytes to count (eth0 in hosts.sh)")
    parser.add_argument("--out", default="")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gyre")
    hvd.init()
    rank, world = gyre.rank(), gyre.size()
    succ, probs = markov_table(args.vocab, args.branch, args.seed)
    evalset = sequences(succ, probs, args.eval_seqs, args.seq + 1, args.seed * 1000 + 5, args.order)
    modes = args.modes.split(",")
    if modes[0] != "sync":
        raise SystemExit("local_sgd: the first mode must be sync (its final loss is the target)")
    nparams = sum(p.numel() for p in LM(args.vocab, args.d_model, args.layers, args.heads, args.ff,
                                        args.seq).parameters())
    floor = entropy_floor(probs[:1] if args.order == 1 else probs)
    hosts = gyre.allgather_object(socket.gethostname(), name="bench.hosts")
    if rank == 0:
        print(f"# local SGD benchmark: {world} ranks on {len(set(hosts))} host(s), {nparams} parameters "
              f"({nparams * 4 / 2**20:.1f} MiB float32), batch {args.batch}x{args.seq} tokens per rank, "
              f"chain entropy ~{floor:.3f} nats, load {os.getloadavg()[0]:.2f}", flush=True)
    start_state = None
    if args.pretrain:
        start = time.time()
        start_state, pre_loss = pretrain(args, succ, probs, evalset)
        if rank == 0:
            print(f"# pre-trained {args.pretrain} steps (one worker, untimed) in "
                  f"{time.time() - start:.1f} s: evaluation loss {pre_loss:.4f}", flush=True)
    results, target = [], None
    for mode in modes:
        start = time.time()
        res = run_mode(mode, args, succ, probs, evalset, target, start_state)
        res["job_wall_s"] = time.time() - start
        if mode == "sync":
            target = res["curve"][-1]["loss"]
        results.append(res)
        if rank == 0:
            print(f"# {mode}: {res['steps']} steps, final loss {res['curve'][-1]['loss']:.4f}, "
                  f"train time {res['curve'][-1]['time_s']:.1f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    if rank != 0:
        dist.destroy_process_group()
        return
    sync_t, _ = time_to(results[0]["curve"], target)
    rows = []
    for res in results:
        t, s = time_to(res["curve"], target)
        last = res["curve"][-1]
        row = {"mode": res["mode"], "period": res["period"], "outer": res["outer"],
               "time_to_target_s": t, "steps_to_target": s,
               "speedup_vs_sync": (sync_t / t) if t else None,
               "ms_per_step": 1000 * last["time_s"] / res["steps"],
               "steps_run": res["steps"], "final_loss": last["loss"],
               "payload_bytes_per_rank_per_step": res["payload_bytes_per_step"],
               "runtime_bytes_per_rank_per_step": res["runtime_bytes_per_step"]}
        if "wire_tx_bytes_per_rank_per_step" in res:
            row["wire_tx_bytes_per_rank_per_step"] = res["wire_tx_bytes_per_rank_per_step"]
        rows.append(row)
    print(f"\ntarget: the synchronous run's final loss {target:.4f} (chain entropy ~{floor:.3f})")
    print(f"{'mode':<10} {'to target s':>11} {'vs sync':>8} {'steps':>6} {'ms/step':>8} "
          f"{'final':>7} {'payload B/step':>15} {'runtime B/step':>15} {'wire B/step':>12}")
    for r in rows:
        tt = f"{r['time_to_target_s']:.1f}" if r["time_to_target_s"] is not None else "not reached"
        sp = f"{r['speedup_vs_sync']:.2f}x" if r["speedup_vs_sync"] else "-"
        st = r["steps_to_target"] if r["steps_to_target"] is not None else f">{r['steps_run']}"
        wire = f"{r['wire_tx_bytes_per_rank_per_step']:.0f}" if "wire_tx_bytes_per_rank_per_step" in r else "-"
        print(f"{r['mode']:<10} {tt:>11} {sp:>8} {st:>6} {r['ms_per_step']:>8.1f} {r['final_loss']:>7.4f} "
              f"{r['payload_bytes_per_rank_per_step']:>15.0f} {r['runtime_bytes_per_rank_per_step']:>15.0f} "
              f"{wire:>12}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "world": world, "hosts": sorted(set(hosts)), "parameters": nparams,
                       "entropy_floor": floor, "target": target, "summary": rows, "runs": results,
                       "torch": torch.__version__, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                      f, indent=1)
        print(f"wrote {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
