"""Samples to the synchronous run's final test loss, over several runs of
benchmarks/async_training.py (each written with --curves FILE, one data seed
each): per file, and the median over the files, each mode at its best
learning rate of the grid (the same grid for every mode), on the raw curves
and on the curves smoothed over 5 evaluations, as async_training.py defines
them.

    python3 benchmarks/async_convergence_summary.py benchmarks/results/store/async_convergence_np2_seed*.json
"""

import json
import statistics
import sys

from async_task import reach, smoothed


def ratios(runs, smooth):
    """mode -> (best ratio or None, its lr), fast runs only."""
    curves = [(r["mode"], r["lr"], smoothed(r["curve"]) if smooth else r["curve"])
              for r in runs if not r["slowed"]]
    target = min(c[-1][1] for m, lr, c in curves if m == "sync")
    base = min(s for s in (reach(c, target) for m, lr, c in curves if m == "sync") if s is not None)
    out = {}
    for m, lr, c in curves:
        s = reach(c, target)
        r = s / base if s is not None else None
        if m not in out or (r is not None and (out[m][0] is None or r < out[m][0])):
            out[m] = (r, lr)
    return out, target, base


def main():
    files = sys.argv[1:]
    data = [json.load(open(f)) for f in files]
    modes = list(dict.fromkeys(r["mode"] for r in data[0]))
    for smooth in (False, True):
        print(f"# {'smoothed over 5 evaluations' if smooth else 'raw'}: ratio = samples to reach the "
              f"synchronous final test loss / the synchronous mode's; each mode at its best lr; "
              f"met: <= 1.10; '-': not reached")
        per = [ratios(runs, smooth) for runs in data]
        print(f"{'mode':>8} " + " ".join(f"{'run ' + str(i + 1):>14}" for i in range(len(files)))
              + f" {'median':>7} {'met':>4}")
        for m in modes:
            cells, vals = [], []
            for out, _, _ in per:
                r, lr = out.get(m, (None, None))
                cells.append(f"{r:.3f} @{lr:g}" if r is not None else "-")
                vals.append(r if r is not None else float("inf"))
            med = statistics.median(vals)
            print(f"{m:>8} " + " ".join(f"{c:>14}" for c in cells)
                  + f" {med:7.3f} {'yes' if med <= 1.10 else 'no':>4}")
        print("# targets: " + ", ".join(f"{t:.4f} at {b} samples" for _, t, b in per))
    print("# files: " + " ".join(files))


if __name__ == "__main__":
    main()
