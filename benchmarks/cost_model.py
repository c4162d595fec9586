#!/usr/bin/env python3
"""An alpha-beta (latency-bandwidth) cost model of gyre's collectives.

A message of b bytes over a link costs alpha + b * beta. The algorithms gyre
runs are sums of such steps (docs/scaling.md derives each formula):

  ring allreduce, N ranks        2(N-1) * (alpha + n/N * beta)
  recursive doubling, N ranks    ceil(log2 N) * (alpha + n * beta)
  hierarchical, H hosts x p      shm reduce-scatter + shm all-gather
                                 (2 * (alpha_shm + n * beta_shm))
                                 + p concurrent cross-host rings of n/p bytes
                                 sharing each host's link:
                                 2(H-1) * (alpha_net + n/H * beta_net)
  negotiation round, N ranks     c_round + ring allgather of 256-byte blocks:
                                 (N-1) * (alpha + 256 * beta)

The flat ring's slowest link is the network hop: with ranks placed
host-major, H of its N links cross hosts, each carrying one chunk per step.
core/src/backends/hierarchical/cost_model.h is the same model in C++ (what
GYRE_HIERARCHICAL_ALLREDUCE=-1 uses); keep the two in step.

Subcommands:

  fit DIR        fit the parameters to the runs of benchmarks/multihost_bench.sh
                 in DIR (cal-net.*, cal-shm.*, latency-*) and write DIR/params.json
  check DIR      predicted against measured at 1x2, 2x1 and 2x2 (sweep-flat,
                 sweep-hier, latency-*) with DIR/params.json
  measured DIR   the shaped-link comparison's tables (busbw per size, gradient sets)
  hosts DIR      the flat allreduce through the runtime at H hosts x 1 rank
                 (benchmarks/scale_hosts.sh's runs in DIR): the algorithm the
                 model chooses, the ring, MPI_Allreduce, and the model beside each
  scale [DIR]    predictions for 8..4096 hosts x 8 ranks, ResNet-50 and BERT-base
                 gradient sets, 100 and 400 Gbit/s links (parameters of DIR's
                 shared memory where given, the network's stated in the table)
"""
import argparse
import glob
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL_BYTES = 64 << 10          # GYRE_ALLREDUCE_SMALL_BYTES default
FUSION_BYTES = 64 << 20         # GYRE_FUSION_THRESHOLD default (see docs/environment.md)
NEGOTIATION_BLOCK = 256         # bytes per rank in a round's first allgather (negotiator.cc)


# ----------------------------------------------------------------- the model
def log2c(n):
    return 0 if n <= 1 else math.ceil(math.log2(n))


def ring_allreduce(n_bytes, ranks, alpha, beta):
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * (alpha + n_bytes / ranks * beta)


def recursive_doubling(n_bytes, ranks, alpha, beta):
    return log2c(ranks) * (alpha + n_bytes * beta)


def rabenseifner(n_bytes, ranks, alpha, beta, share=1):
    """Reduce-scatter by recursive halving + allgather by recursive doubling
    over P = 2^floor(log2 N) ranks, plus the folded pairs' two whole-buffer
    transfers when N is not a power of two; `share` allreduces on each link
    (core/src/backends/hierarchical/cost_model.h, rabenseifner_allreduce_s)."""
    if ranks <= 1:
        return 0.0
    pw = 1 << (ranks.bit_length() - 1)
    fold = 2 * (alpha + share * n_bytes * beta) if pw < ranks else 0.0
    return fold + 2 * math.log2(pw) * alpha + 2 * (pw - 1) / pw * share * n_bytes * beta


def flat_allreduce(n_bytes, hosts, per_host, p):
    """gyre's flat allreduce (recursive doubling up to SMALL_BYTES, the ring
    above) over hosts*per_host ranks; the slowest link is the network's
    (or shared memory's on one host)."""
    ranks = hosts * per_host
    a, b = (p["alpha_net"], p["beta_net"]) if hosts > 1 else (p["alpha_shm"], p["beta_shm"])
    if n_bytes <= SMALL_BYTES:
        return recursive_doubling(n_bytes, ranks, a, b)
    return ring_allreduce(n_bytes, ranks, a, b)


def hierarchical_allreduce(n_bytes, hosts, per_host, p):
    shm = 2 * (p["alpha_shm"] + n_bytes * p["beta_shm"]) if per_host > 1 else 0.0
    if hosts <= 1:
        return shm
    shard = n_bytes / per_host
    if shard <= SMALL_BYTES:
        # p recursive doublings at once, each step moving every shard over the link.
        cross = log2c(hosts) * (p["alpha_net"] + n_bytes * p["beta_net"])
    else:
        cross = 2 * (hosts - 1) * (p["alpha_net"] + n_bytes / hosts * p["beta_net"])
    return shm + cross


def hierarchical_rabenseifner(n_bytes, hosts, per_host, p):
    """The hierarchical allreduce with its network phase by recursive
    doubling, the ring or Rabenseifner's algorithm, whichever the model
    predicts fastest (what GYRE_RABENSEIFNER_ALLREDUCE=-1 does)."""
    shm = 2 * (p["alpha_shm"] + n_bytes * p["beta_shm"]) if per_host > 1 else 0.0
    if hosts <= 1:
        return shm
    shard = n_bytes / per_host
    if shard <= SMALL_BYTES:
        return shm + log2c(hosts) * (p["alpha_net"] + n_bytes * p["beta_net"])
    ring = 2 * (hosts - 1) * (p["alpha_net"] + n_bytes / hosts * p["beta_net"])
    rab = rabenseifner(shard, hosts, p["alpha_net"], p["beta_net"], share=per_host)
    return shm + min(ring, rab)


PIPELINE_START_S = 50e-6   # the network phase's thread, started per call (cost_model.h)
PIECE_S = 20e-6            # a piece's hand-over between the threads (LayoutCost::piece_s)
MAX_PIECES = 64
MIN_PIECE_BYTES = 64 << 10
PIPELINE_MIN_GAIN = 0.05


def hierarchical_pipelined(n_bytes, hosts, per_host, p, pieces=None):
    """The hierarchical allreduce in pieces, pipelined (GYRE_HIERARCHICAL_PIPELINE,
    cost_model.h hierarchical_allreduce_s): each piece's two shared-memory
    passes run on the calling thread beside another piece's network phase
    (recursive doubling, the ring or Rabenseifner's, as hierarchical_rabenseifner
    chooses for the piece). pieces=None: the power of two up to 64 (pieces of at
    least 64 KiB) the model predicts fastest, as the runtime picks."""
    if pieces is None:
        one = best = hierarchical_pipelined(n_bytes, hosts, per_host, p, 1)
        k = 2
        while k <= MAX_PIECES and n_bytes / k >= MIN_PIECE_BYTES:
            best = min(best, hierarchical_pipelined(n_bytes, hosts, per_host, p, k))
            k *= 2
        # Pipelined only when predicted PIPELINE_MIN_GAIN faster (cost_model.h).
        return best if best <= (1 - PIPELINE_MIN_GAIN) * one else one
    piece = n_bytes / pieces
    one_pass = (p["alpha_shm"] + piece * p["beta_shm"]) if per_host > 1 else 0.0
    net = hierarchical_rabenseifner(piece, hosts, per_host, dict(p, alpha_shm=0.0, beta_shm=0.0)) \
        if hosts > 1 else 0.0
    if pieces == 1:
        return 2 * one_pass + net
    return PIPELINE_START_S + 2 * one_pass + net + \
        (pieces - 1) * (max(2 * one_pass, net) + p.get("piece_s", PIECE_S))


def tree_allreduce(n_bytes, hosts, per_host, p):
    """Not in gyre: a pipelined binary tree across hosts (reduce up, broadcast
    down; the shape of NCCL's trees), for comparison: 2 log2 H latency terms,
    and each host sends and receives the whole buffer twice (full bandwidth
    when pipelined in chunks of n/k)."""
    shm = 2 * (p["alpha_shm"] + n_bytes * p["beta_shm"]) if per_host > 1 else 0.0
    if hosts <= 1:
        return shm
    chunks = max(1, min(64, int(n_bytes // (512 << 10))))
    return shm + (2 * log2c(hosts) + chunks - 1) * (p["alpha_net"] + n_bytes / chunks * p["beta_net"]) \
        + n_bytes * p["beta_net"]


def negotiation_round(ranks, p, link="net"):
    a, b = (p["alpha_net"], p["beta_net"]) if link == "net" else (p["alpha_shm"], p["beta_shm"])
    return p["round_s"] + (ranks - 1) * (a + NEGOTIATION_BLOCK * b)


def busbw(n_bytes, seconds, ranks):
    return n_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9 if seconds > 0 else float("inf")


# ------------------------------------------------------------ measurements
def load_runs(d, pattern):
    out = []
    for f in sorted(glob.glob(os.path.join(d, pattern))):
        try:
            with open(f) as fh:
                out.append(json.load(fh))
        except (OSError, json.JSONDecodeError) as e:
            print(f"cost_model: skipping {f}: {e}", file=sys.stderr)
    return out


def sweep_times(runs, key="time_us"):
    """bytes -> [seconds per run] for the given column."""
    t = {}
    for run in runs:
        for row in run["rows"]:
            if key in row and row[key] is not None:
                t.setdefault(row["bytes"], []).append(row[key] * 1e-6)
    return t


def latency_of(runs, system, how=min):
    """The median sample of each run; of those, the best (how=min) run's."""
    vals = [row["median_us"] * 1e-6 for run in runs for row in run["rows"] if row["system"] == system]
    return how(vals) if vals else None


def lstsq2(xs, ys):
    """Least squares of y = a * x0 + b * x1 with relative weights (each row
    divided by its y), so small sizes count as much as large ones."""
    s00 = s01 = s11 = t0 = t1 = 0.0
    for (x0, x1), y in zip(xs, ys):
        w = 1.0 / (y * y)
        s00 += w * x0 * x0
        s01 += w * x0 * x1
        s11 += w * x1 * x1
        t0 += w * x0 * y
        t1 += w * x1 * y
    det = s00 * s11 - s01 * s01
    if det == 0:
        raise SystemExit("cost_model: not enough distinct sizes to fit")
    a = (t0 * s11 - t1 * s01) / det
    b = (s00 * t1 - s01 * t0) / det
    return max(a, 0.0), max(b, 1e-15)


def fit(d):
    net = sweep_times(load_runs(d, "cal-net.*.json"))
    shm = sweep_times(load_runs(d, "cal-shm.*.json"))
    if not net or not shm:
        raise SystemExit(f"cost_model: no cal-net.*.json / cal-shm.*.json in {d} "
                         "(run benchmarks/multihost_bench.sh first)")
    # 2x1, bare: recursive doubling (1 step of n) up to SMALL_BYTES, the ring
    # (2 steps of n/2) above: time = steps * alpha + bytes_on_link * beta.
    xs, ys = [], []
    # Each size's best run: on a machine shared with other work, the least
    # disturbed run is the closest to the links' own cost (the spread is
    # reported by `check`).
    for n, ts in net.items():
        steps, on_link = (1, n) if n <= SMALL_BYTES else (2, n)
        xs.append((steps, on_link))
        ys.append(min(ts))
    alpha_net, beta_net = lstsq2(xs, ys)
    # 1x2, shm_allreduce = reduce-scatter + all-gather through the slots:
    # time = 2 * (alpha_shm + n * beta_shm).
    xs, ys = [], []
    for n, ts in shm.items():
        xs.append((2, 2 * n))
        ys.append(min(ts))
    alpha_shm, beta_shm = lstsq2(xs, ys)
    params = {"alpha_net": alpha_net, "beta_net": beta_net,
              "alpha_shm": alpha_shm, "beta_shm": beta_shm}
    # The round: the runtime's 8-byte latency minus the bare collective's, at
    # 1x2 (the round's allgather over shared memory... MPI's vader) and 2x1.
    rounds = []
    for layout in ("1x2", "2x1"):
        runs = load_runs(d, f"latency-{layout}.*.json")
        rt, bare = latency_of(runs, "gyre runtime"), latency_of(runs, "gyre bare")
        if rt is None or bare is None:
            continue
        link = "shm" if layout == "1x2" else "net"
        extra = rt - bare - (alpha_net + NEGOTIATION_BLOCK * beta_net if link == "net"
                             else alpha_shm + NEGOTIATION_BLOCK * beta_shm)
        rounds.append(max(extra, 0.0))
    params["round_s"] = statistics.median(rounds) if rounds else 0.0
    params["source"] = os.path.abspath(d)
    params["runs"] = {"cal-net": len(load_runs(d, "cal-net.*.json")),
                      "cal-shm": len(load_runs(d, "cal-shm.*.json"))}
    with open(os.path.join(d, "params.json"), "w") as fh:
        json.dump(params, fh, indent=1)
    print("parameters (fitted to each size's best run):")
    print(f"  network (tbf-shaped veth, 2 hosts): alpha {alpha_net * 1e6:8.1f} us   "
          f"beta {beta_net * 1e9:7.3f} ns/B  ({1 / beta_net / 1e9:6.2f} GB/s)")
    print(f"  shared memory (2 ranks, one pass):  alpha {alpha_shm * 1e6:8.1f} us   "
          f"beta {beta_shm * 1e9:7.3f} ns/B  ({1 / beta_shm / 1e9:6.2f} GB/s)")
    print(f"  negotiation round (runtime - bare at 8 bytes, less one message): "
          f"{params['round_s'] * 1e6:.1f} us")
    return params


def load_params(d):
    path = os.path.join(d, "params.json")
    if not os.path.exists(path):
        return fit(d)
    with open(path) as fh:
        return json.load(fh)


def spread(ts):
    return f"{min(ts) * 1e6:.0f} / {statistics.median(ts) * 1e6:.0f} / {max(ts) * 1e6:.0f}"


def check(d):
    p = load_params(d)
    print("predicted against measured, microseconds; measured: best / median / worst run")
    print("1x2 and 2x1 are the calibration runs themselves (in-sample); 2x2 is out of sample.\n")
    print(f"| layout | algorithm | bytes | predicted us | measured us (best / median / worst) | best / predicted |")
    print("|---|---|---:|---:|---:|---:|")
    cases = [
        ("1x2", "shm allreduce", "cal-shm.*.json", "time_us", lambda n: hierarchical_allreduce(n, 1, 2, p)),
        ("2x1", "flat (rec. doubling / ring)", "cal-net.*.json", "time_us", lambda n: flat_allreduce(n, 2, 1, p)),
        ("2x2", "flat ring (bare)", "sweep-flat.*.json", "time_us", lambda n: flat_allreduce(n, 2, 2, p)),
        ("2x2", "hierarchical (runtime)", "sweep-hier.*.json", "time_us",
         lambda n: hierarchical_allreduce(n, 2, 2, p) + negotiation_round(4, p)),
        ("2x2", "flat ring (runtime)", "sweep-rtflat.*.json", "time_us",
         lambda n: flat_allreduce(n, 2, 2, p) + negotiation_round(4, p)),
    ]
    for layout, name, pattern, key, model in cases:
        t = sweep_times(load_runs(d, pattern), key)
        for n in sorted(t):
            if n not in (8, 2048, 1024, 65536, 131072, 1 << 20, 2 << 20, 4 << 20, 8 << 20,
                         16 << 20, 64 << 20):
                continue
            pred = model(n)
            print(f"| {layout} | {name} | {n} | {pred * 1e6:.1f} | {spread(t[n])} | "
                  f"{min(t[n]) / pred:.2f} |")
    for layout, ranks, link in (("1x2", 2, "shm"), ("2x1", 2, "net"), ("2x2", 4, "net")):
        runs = load_runs(d, f"latency-{layout}.*.json")
        rt = latency_of(runs, "gyre runtime")
        if rt is None:
            continue
        rts = [latency_of(runs, "gyre runtime", how) for how in (min, statistics.median, max)]
        a, b = (p["alpha_net"], p["beta_net"]) if link == "net" else (p["alpha_shm"], p["beta_shm"])
        if layout == "2x2":
            coll = hierarchical_allreduce(8, 2, 2, p)
        else:
            coll = recursive_doubling(8, ranks, a, b)
        pred = coll + negotiation_round(ranks, p, link)
        print(f"| {layout} | runtime, 8 bytes (round + allreduce) | 8 | {pred * 1e6:.1f} | "
              f"{spread(rts)} | {rt / pred:.2f} |")


def gradient_set(name):
    with open(os.path.join(HERE, "data", f"{name}_sizes.txt")) as fh:
        return [int(line) * 4 for line in fh if line.strip()]  # float32 bytes


def step_time(sizes, hosts, per_host, p, algo):
    """One training step's gradient allreduce: one negotiation round (the
    response cache makes it the steady-state one), then the tensors fused
    into buckets of at most FUSION_BYTES, one allreduce per bucket."""
    buckets, cur = [], 0
    for s in reversed(sizes):
        if cur and cur + s > FUSION_BYTES:
            buckets.append(cur)
            cur = 0
        cur += s
    if cur:
        buckets.append(cur)
    coll = sum(algo(b, hosts, per_host, p) for b in buckets)
    return negotiation_round(hosts * per_host, p), coll


def negotiation_log_depth(ranks, p, cache_bits=1024):
    """The fix: the steady-state round as a bitwise AND of the cache-hit
    bits by recursive doubling (log2 N steps of cache_bits/8 bytes), as
    Horovod's response cache does, instead of an allgather of N messages."""
    return p["round_s"] + log2c(ranks) * (p["alpha_net"] + cache_bits / 8 * p["beta_net"])


def flat_chosen(n_bytes, ranks, alpha, beta):
    """The flat allreduce GYRE_RABENSEIFNER_ALLREDUCE=-1 runs with one rank
    per host: up to SMALL_BYTES recursive doubling, or Rabenseifner's
    algorithm where predicted strictly faster (more than 2 ranks); above it
    Rabenseifner's algorithm where predicted strictly faster than the ring
    (cost_model.h)."""
    if n_bytes <= SMALL_BYTES:
        rd = recursive_doubling(n_bytes, ranks, alpha, beta)
        rab = rabenseifner(n_bytes, ranks, alpha, beta)
        return (rab, "rab") if ranks > 2 and rab < rd else (rd, "rd")
    ring = ring_allreduce(n_bytes, ranks, alpha, beta)
    rab = rabenseifner(n_bytes, ranks, alpha, beta)
    return (rab, "rab") if rab < ring else (ring, "ring")


def hosts_table(d, alpha, gbit, round_s):
    """Measured against predicted for benchmarks/scale_hosts.sh's runs: per
    size the median over the runs (each run's figure is itself a median of
    blocks, slowest rank) of each system and of MPI_Allreduce (timed beside
    every run); the model's time for the runtime is the collective plus the
    steady-state negotiation round (a log-depth round of 40-byte messages,
    plus round_s of CPU), for the bare algorithms the collective alone."""
    beta = 8 / (gbit * 1e9)
    layouts = sorted({os.path.basename(f).split("-")[0] for f in glob.glob(os.path.join(d, "*x1-*.json"))},
                     key=lambda x: int(x.split("x")[0]))
    print(f"model: alpha {alpha * 1e6:.0f} us per message, {gbit:g} Gbit/s links "
          f"(beta {beta * 1e9:.1f} ns/B), a round's CPU cost {round_s * 1e6:.0f} us\n")
    systems = ("chosen", "ring", "bare-chosen", "bare-ring")
    for lay in layouts:
        hosts = int(lay.split("x")[0])
        runs = {s: load_runs(d, f"{lay}-{s}.*.json") for s in systems}
        t = {s: sweep_times(r) for s, r in runs.items()}
        mpi = sweep_times([x for r in runs.values() for x in r], "mpi_time_us")
        have = [s for s in systems if runs[s]]
        neg = round_s + log2c(hosts) * (alpha + 40 * beta)
        print(f"#### {hosts} hosts x 1 rank: runs " + ", ".join(f"{s} {len(runs[s])}" for s in have) +
              "; ms per allreduce, median over runs\n")
        print("| bytes | " + " | ".join(have) + " | MPI_Allreduce | " +
              " | ".join(f"{s} / best of ({s.replace('chosen', 'ring')}, MPI)" for s in have if "chosen" in s) +
              " | chosen / MPI | model: chosen (algorithm) | chosen / model |")
        print("|---:|" + "---:|" * (len(have) + 1 + sum("chosen" in s for s in have) + 3))
        med = lambda s, n: statistics.median(t[s][n]) if n in t[s] else float("nan")
        for n in sorted(mpi):
            m = statistics.median(mpi[n])
            cells = [f"{med(s, n) * 1e3:.3f}" for s in have]
            ratios = []
            for s in have:
                if "chosen" not in s:
                    continue
                other = med(s.replace("chosen", "ring"), n)
                best = min(other, m) if other == other else m
                ratios.append(f"{best / med(s, n):.2f}")
            pc, algo = flat_chosen(n, hosts, alpha, beta)
            c = med("chosen", n) if "chosen" in have else float("nan")
            print(f"| {n} | " + " | ".join(cells) + f" | {m * 1e3:.3f} | " + " | ".join(ratios) +
                  f" | {m / c:.2f} | {(pc + neg) * 1e3:.3f} ({algo}) | {c / (pc + neg):.2f} |")
        print()

def scale(d):
    shm = {"alpha_shm": 5e-6, "beta_shm": 1 / 20e9}
    note = "assumed: 20 GB/s per pass, 5 us (a server's memory; this machine's is shared with other work)"
    round_s = 20e-6
    if d:
        fitted = load_params(d)
        shm = {"alpha_shm": fitted["alpha_shm"], "beta_shm": fitted["beta_shm"]}
        note = f"fitted in {d} ({1 / shm['beta_shm'] / 1e9:.1f} GB/s, {shm['alpha_shm'] * 1e6:.1f} us)"
        round_s = fitted["round_s"]
    per_host = 8
    print(f"8 ranks per host; shared memory {note}; network alpha 5 us per message "
          f"(RDMA-class; TCP is 10-30 us); a round's CPU cost {round_s * 1e6:.0f} us")
    print("times in ms per training step (one negotiation round, then the gradients fused into "
          f"{FUSION_BYTES >> 20} MiB buckets); busbw in GB/s over all ranks (nccl-tests' definition)\n")
    for gbit in (100, 400):
        p = dict(shm, alpha_net=5e-6, beta_net=1 / (gbit / 8 * 1e9), round_s=round_s)
        for model in ("resnet50", "bert_base"):
            sizes = gradient_set(model)
            total = sum(sizes)
            print(f"#### {model}: {total / 1e6:.0f} MB of float32 gradients, {gbit} Gbit/s per host\n")
            print("| hosts | ranks | round (allgather) | round (log-depth AND) | flat ring | hierarchical "
                  "| -1 picks (before) | busbw (before) | hier. + Rabenseifner | hier. pipelined + Rabenseifner "
                  "| best + log-depth round | busbw with all |")
            print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
            for hosts in (8, 32, 128, 512, 1024, 4096):
                n = hosts * per_host
                neg, flat = step_time(sizes, hosts, per_host, p, flat_allreduce)
                _, hier = step_time(sizes, hosts, per_host, p, hierarchical_allreduce)
                _, tree = step_time(sizes, hosts, per_host, p, tree_allreduce)
                _, hier_rab = step_time(sizes, hosts, per_host, p, hierarchical_rabenseifner)
                _, hier_pipe = step_time(sizes, hosts, per_host, p, hierarchical_pipelined)
                neg_fix = negotiation_log_depth(n, p)
                pick = "hier" if hier <= flat else "flat"
                today = neg + min(flat, hier)
                # The tree is not built: not in "best".
                fixed = neg_fix + min(flat, hier, hier_rab, hier_pipe)
                print(f"| {hosts} | {n} | {neg * 1e3:.2f} | {neg_fix * 1e3:.2f} | {flat * 1e3:.1f} | "
                      f"{hier * 1e3:.1f} | {pick} | {busbw(total, today, n):.1f} | {hier_rab * 1e3:.1f} | "
                      f"{hier_pipe * 1e3:.1f} | {fixed * 1e3:.1f} | {busbw(total, fixed, n):.1f} |")
            print()


def measured(d):
    """The shaped-link comparison on 2 hosts x 2 ranks: busbw per size of
    each system (best / median / worst over the runs), and the gradient sets."""
    def bw(n, ts, ranks=4):
        return [busbw(n, t, ranks) for t in ts]

    cols = [("flat ring (bare)", "sweep-flat.*.json", "time_us"),
            ("hierarchical (runtime)", "sweep-hier.*.json", "time_us"),
            ("flat ring (runtime)", "sweep-rtflat.*.json", "time_us"),
            ("MPI_Allreduce (in every sweep)", "sweep-*.json", "mpi_time_us")]
    data = [(name, sweep_times(load_runs(d, pat), key)) for name, pat, key in cols]
    torch = load_runs(d, "torch.*.json")
    if torch:
        g = {}
        for run in torch:
            for row in run["rows"]:
                if row.get("peer_time_us"):
                    g.setdefault(row["bytes"], []).append(row["peer_time_us"] * 1e-6)
        data.append(("torch gloo", g))
    runs = {name: max((len(v) for v in t.values()), default=0) for name, t in data}
    print("busbw GB/s on 2 hosts x 2 ranks (10 Gbit/s tbf-shaped links): best / median / worst run; "
          "runs: " + ", ".join(f"{k} {v}" for k, v in runs.items()) + "\n")
    print("| bytes | " + " | ".join(name for name, _ in data) + " | hier / flat ring (median) | hier / MPI (median) |")
    print("|---:|" + "---:|" * (len(data) + 2))
    sizes = sorted(set().union(*[set(t) for _, t in data]))
    for n in sizes:
        cells, med = [], {}
        for name, t in data:
            if n in t:
                b = sorted(bw(n, t[n]))
                med[name] = statistics.median(b)
                cells.append(f"{b[-1]:.3f} / {med[name]:.3f} / {b[0]:.3f}")
            else:
                cells.append("")
        r1 = med.get("hierarchical (runtime)", 0) / med["flat ring (bare)"] if med.get("flat ring (bare)") else 0
        mpi = med.get("MPI_Allreduce (in every sweep)")
        r2 = med.get("hierarchical (runtime)", 0) / mpi if mpi else 0
        print(f"| {n} | " + " | ".join(cells) + f" | {r1:.2f} | {r2:.2f} |")
    print()
    for model in ("resnet50", "bert_base"):
        rows = {}
        for mode in ("hier", "flat"):
            for run in load_runs(d, f"gradients-{model}-{mode}.*.json"):
                for row in run["rows"]:
                    name = row["system"]
                    if name.startswith("gyre runtime"):
                        name = f"gyre runtime, {'hierarchical' if mode == 'hier' else 'flat ring'}"
                    elif mode == "hier" and not name.startswith("gyre"):
                        pass
                    elif mode == "hier":
                        continue  # the bare ring: once, from the flat runs
                    rows.setdefault(name, []).append(row["median_ms"])
        if not rows:
            continue
        print(f"{model}: step time ms, best / median / worst run\n")
        print("| system | ms | runs |\n|---|---:|---:|")
        for name, v in rows.items():
            v = sorted(v)
            print(f"| {name} | {v[0]:.0f} / {statistics.median(v):.0f} / {v[-1]:.0f} | {len(v)} |")
        print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("fit", "check", "measured"):
        s = sub.add_parser(name)
        s.add_argument("dir")
    s = sub.add_parser("hosts")
    s.add_argument("dir")
    s.add_argument("--alpha-us", type=float, default=12.0, help="per-message latency (default 12)")
    s.add_argument("--gbit", type=float, default=1.0, help="link rate in Gbit/s (default 1)")
    s.add_argument("--round-us", type=float, default=20.0, help="a round's CPU cost (default 20)")
    s = sub.add_parser("scale")
    s.add_argument("dir", nargs="?")
    a = ap.parse_args()
    {"fit": lambda: fit(a.dir), "check": lambda: check(a.dir), "scale": lambda: scale(a.dir),
     "measured": lambda: measured(a.dir),
     "hosts": lambda: hosts_table(a.dir, a.alpha_us * 1e-6, a.gbit, a.round_us * 1e-6)}[a.cmd]()


if __name__ == "__main__":
    main()
