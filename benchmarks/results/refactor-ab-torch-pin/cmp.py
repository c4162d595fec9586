#!/usr/bin/env python3
"""run.sh's table: per torch sweep and size, gyre's median time over the
rounds before and after and after/before, with each side's spread; gloo in
the same jobs beside. DDP: the median step of each run per model and system."""
import glob
import json
import os
import re
import statistics

here = os.path.dirname(os.path.abspath(__file__))


def sweep(name, v):
    rows = {}
    for f in sorted(glob.glob(f"{here}/{name}.{v}.*.json")):
        for r in json.load(open(f))["rows"]:
            rows.setdefault(r["bytes"], []).append((r["time_us"], r["peer_time_us"]))
    return rows


for name in ("torch", "torch-inplace", "torch-thp"):
    b4, af = sweep(name, "before"), sweep(name, "after")
    if not b4 or not af:
        continue
    print(f"\n{name}: µs per call (runs: min-max), median over rounds")
    for b in sorted(af):
        tb = [t for t, _ in b4[b]]
        ta = [t for t, _ in af[b]]
        gb = statistics.median(g for _, g in b4[b])
        ga = statistics.median(g for _, g in af[b])
        print(f"{b:>10} before {statistics.median(tb):9.1f} ({min(tb):.1f}-{max(tb):.1f})"
              f"  after {statistics.median(ta):9.1f} ({min(ta):.1f}-{max(ta):.1f})"
              f"  after/before {statistics.median(ta) / statistics.median(tb):5.2f}x"
              f"  gloo {gb:9.1f} / {ga:9.1f}")

print("\nDDP step (ms, median of each run)")
steps = {}
for f in sorted(glob.glob(f"{here}/ddp.*.txt")):
    v = os.path.basename(f).split(".")[1]
    for line in open(f):
        m = re.match(r"(\w+)\s+\d+\s+(\w+)\s+([\d.]+)", line)
        if m:
            steps.setdefault((m[1], m[2]), {}).setdefault(v, []).append(float(m[3]))
for (model, system), d in sorted(steps.items()):
    b4, af = d.get("before", []), d.get("after", [])
    ratio = statistics.median(af) / statistics.median(b4) if b4 and af else float("nan")
    print(f"{model:6} {system:6} before {', '.join(f'{x:.1f}' for x in b4):24}"
          f" after {', '.join(f'{x:.1f}' for x in af):24} after/before {ratio:.2f}")
