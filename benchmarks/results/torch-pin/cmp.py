#!/usr/bin/env python3
"""Table of run.sh's output: per sweep and size, the median over rounds of
gyre's time pinned and copied, and copy/pin; gloo's median beside (same jobs).
DDP: the median step of each run per model and system."""
import glob
import json
import os
import re
import statistics

here = os.path.dirname(os.path.abspath(__file__))


def sweep(name, mode):
    rows = {}
    for f in sorted(glob.glob(f"{here}/{name}.{mode}.*.json")):
        for r in json.load(open(f))["rows"]:
            rows.setdefault(r["bytes"], []).append((r["time_us"], r["peer_time_us"]))
    return rows


for name in ("out", "inplace"):
    pin, copy = sweep(name, "pin"), sweep(name, "copy")
    print(f"\n{name}: µs per call, median of {len(next(iter(pin.values())))} runs each")
    print(f"{'bytes':>10} {'pinned':>10} {'copied':>10} {'copy/pin':>9} {'gloo(pin runs)':>15} {'gloo(copy runs)':>16}")
    for b in sorted(pin):
        p = statistics.median(t for t, _ in pin[b])
        c = statistics.median(t for t, _ in copy[b])
        gp = statistics.median(g for _, g in pin[b])
        gc = statistics.median(g for _, g in copy[b])
        print(f"{b:>10} {p:>10.1f} {c:>10.1f} {c / p:>8.2f}x {gp:>15.1f} {gc:>16.1f}")

print("\nDDP step (ms, median of each run)")
steps = {}
for f in sorted(glob.glob(f"{here}/ddp.*.txt")):
    mode = f.split(".")[-3]
    for line in open(f):
        m = re.match(r"(\w+)\s+\d+\s+(\w+)\s+([\d.]+)", line)
        if m:
            steps.setdefault((m[1], m[2], mode), []).append(float(m[3]))
for (model, system, mode), v in sorted(steps.items()):
    print(f"{model:6} {system:6} {mode:5} " + ", ".join(f"{x:.1f}" for x in v))
