"""AsyncOptimizer's update rule in one process, without MPI or timing: the
task of benchmarks/async_training.py, N simulated ranks each with its own
optimizer (its own momentum) and data, pushing in turn into one set of
parameters, each computing its gradient on the parameters as they were
`lag` pushes ago (lag 0: no staleness at all). It separates what the update
rule does from what staleness does (docs/training-modes.md):

    python3 benchmarks/async_update_model.py [--ranks 2] [--steps 300] [--lags 0,1,4,16]

Prints, for the synchronous step of the averaged gradient and for each lag
with the update pushed as made ("sum") and divided by the ranks ("average"),
the final test loss, the mean of the last 5 evaluations, and the samples
needed to reach the synchronous run's final test loss (ratio: over the
synchronous run's own), evaluated every 10 rounds.
"""

import argparse

import torch

from async_task import BATCH, model, teacher_data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=300, help="synchronous steps; async runs twice as many rounds")
    p.add_argument("--lags", default="0,1,4,16")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    n = a.ranks
    test = teacher_data(99, 2000)
    data = [teacher_data(100 + r + 1000 * a.seed, 2 * a.steps * BATCH) for r in range(n)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def test_loss(net):
        with torch.no_grad():
            return loss_fn(net(test[0]), test[1]).item()

    def batch(r, s):
        x, y = data[r]
        return x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]

    def sync():
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
        curve = []
        for s in range(a.steps):
            opt.zero_grad()
            for r in range(n):
                x, y = batch(r, s)
                (loss_fn(net(x), y) / n).backward()
            opt.step()
            if s % 10 == 9:
                curve.append(((s + 1) * BATCH * n, test_loss(net)))
        return curve

    def asynchronous(scale, lag):
        shared = model()
        history = [[p.detach().clone() for p in shared.parameters()]]  # the last lag + 1 versions
        nets = [model() for _ in range(n)]
        opts = [torch.optim.SGD(m.parameters(), lr=a.lr, momentum=a.momentum) for m in nets]
        curve = []
        pushes = 0
        for s in range(2 * a.steps):
            for r in range(n):
                base = history[max(0, len(history) - 1 - lag)]
                with torch.no_grad():
                    for p, b in zip(nets[r].parameters(), base):
                        p.copy_(b)
                x, y = batch(r, s)
                opts[r].zero_grad()
                loss_fn(nets[r](x), y).backward()
                opts[r].step()
                with torch.no_grad():
                    for q, p, b in zip(shared.parameters(), nets[r].parameters(), base):
                        q.add_((p - b) * scale)
                history = (history + [[q.detach().clone() for q in shared.parameters()]])[-(lag + 1):]
                pushes += 1
                if pushes % (10 * n) == 0:
                    curve.append((pushes * BATCH, test_loss(shared)))
        return curve

    def reach(curve, target):
        hit = [s for s, l in curve if l <= target]
        return hit[0] if hit else None

    reference = sync()
    target = reference[-1][1]
    ref_samples = reach(reference, target)
    print(f"# {n} simulated ranks, batch {BATCH}, lr {a.lr}, momentum {a.momentum}; sync {a.steps} "
          f"steps, async {2 * a.steps} rounds; target: sync final test loss {target:.4f} "
          f"(first reached at {ref_samples} samples)")
    print(f"{'update':>8} {'lag':>4} {'test_loss':>9} {'last5':>7} {'to_target':>10} {'ratio':>6}")

    def line(name, lag, curve):
        s = reach(curve, target)
        last5 = sum(l for _, l in curve[-5:]) / len(curve[-5:])
        ratio = f"{s / ref_samples:.2f}" if s else f">{curve[-1][0] / ref_samples:.2f}"
        print(f"{name:>8} {lag:>4} {curve[-1][1]:9.4f} {last5:7.4f} {str(s) if s else '-':>10} {ratio:>6}",
              flush=True)

    line("sync", "-", reference)
    for lag in [int(v) for v in a.lags.split(",")]:
        for name, scale in (("sum", 1.0), ("average", 1.0 / n)):
            line(name, lag, asynchronous(scale, lag))


if __name__ == "__main__":
    main()
