#!/usr/bin/env python3
"""Markdown tables, with the range over runs, from the JSON files that
benchmarks/run_all.sh leaves in its output folder, and the verdict on each
target of docs/benchmarks.md:

    python3 benchmarks/summarize.py bench-results

A cell "a–b (m)" is the lowest and highest of the runs, m their median.
"""
import glob
import json
import os
import statistics
import sys


def load(folder, pattern):
    docs = []
    for p in sorted(glob.glob(os.path.join(folder, pattern))):
        with open(p) as f:
            docs.append(json.load(f))
    return docs


def cell(vals, fmt="{:.2f}"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    lo, hi, med = min(vals), max(vals), statistics.median(vals)
    if len(vals) == 1:
        return fmt.format(med)
    return f"{fmt.format(lo)}–{fmt.format(hi)} ({fmt.format(med)})"


def human(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def by_size(docs, key):
    out = {}
    for d in docs:
        for r in d["rows"]:
            out.setdefault(r["bytes"], []).append(r.get(key))
    return out


def sweep_table(ring, runtime):
    print("| size | gyre bare busbw | MPI busbw (beside bare) | bare / MPI | gyre runtime busbw | "
          "MPI busbw (beside runtime) | runtime / MPI |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    keys = ("busbw_gbs", "mpi_busbw_gbs", "ratio")
    rs = [by_size(ring, k) for k in keys]
    us = [by_size(runtime, k) for k in keys]
    for size in sorted(set(rs[0]) | set(us[0])):
        cells = [cell(t.get(size, [])) for t in rs + us]
        print(f"| {human(size)} | " + " | ".join(cells) + " |")
    print("\nbusbw in GB/s; ratio = gyre busbw / MPI busbw in the same run.\n")


def gradient_table(folder):
    print("| gradient set | system | step time (ms) | speedup vs MPI per tensor | speedup vs MPI fused |")
    print("|---|---|---:|---:|---:|")
    verdict = None
    for name in ("resnet50", "bert_base", "vgg16"):
        docs = load(folder, f"gradients-{name}.*.json")
        if not docs:
            continue
        systems = [r["system"] for r in docs[0]["rows"]]
        for s in systems:
            rows = [r for d in docs for r in d["rows"] if r["system"] == s]
            print(f"| {name} ({docs[0]['tensors']} tensors) | {s} | {cell([r['median_ms'] for r in rows])} | "
                  f"{cell([r['speedup_vs_mpi_per_tensor'] for r in rows])} | "
                  f"{cell([r['speedup_vs_mpi_fused'] for r in rows])} |")
            if name == "resnet50" and s.startswith("gyre runtime"):
                verdict = [r["speedup_vs_mpi_per_tensor"] for r in rows]
    print("\nstep time: median over the steps of one run, slowest rank; speedup = reference time / "
          "this time (above 1: faster).\n")
    return verdict


def latency_table(folder):
    docs = load(folder, "latency.*.json")
    if not docs:
        return None
    print("| system | median (µs) | p90 (µs) | p99 (µs) |")
    print("|---|---:|---:|---:|")
    verdict = None
    for s in [r["system"] for r in docs[0]["rows"]]:
        rows = [r for d in docs for r in d["rows"] if r["system"] == s]
        print(f"| {s} | {cell([r['median_us'] for r in rows])} | {cell([r['p90_us'] for r in rows])} | "
              f"{cell([r['p99_us'] for r in rows])} |")
        if s == "gyre runtime":
            verdict = [r["median_us"] for r in rows]
    print()
    return verdict


def torch_table(folder):
    variants = [(name, docs) for name, docs in (
        ("gyre.torch.allreduce", load(folder, "torch.*.json")),
        ("gyre.torch.allreduce_", load(folder, "torch-inplace.*.json")),
        ("gyre.torch.allreduce, THP", load(folder, "torch-thp.*.json"))) if docs]
    if not variants:
        return
    print("| size | " + " | ".join(f"{name} busbw | gloo busbw | ratio" for name, _ in variants) + " |")
    print("|---:|" + "---:|---:|---:|" * len(variants))
    cols = [by_size(d, k) for _, d in variants for k in ("busbw_gbs", "peer_busbw_gbs", "ratio")]
    for size in sorted(set().union(*cols[0::3])):
        print(f"| {human(size)} | " + " | ".join(cell(c.get(size, [])) for c in cols) + " |")
    print("\nbusbw in GB/s; ratio = gyre.torch busbw / gloo busbw in the same run; allreduce returns a new "
          "tensor, allreduce_ reduces in place (as gloo does); THP: run under THP_MEM_ALLOC_ENABLE=1.\n")


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "bench-results"
    ring, runtime = load(folder, "sweep-bare.*.json"), load(folder, "sweep-runtime.*.json")
    print(f"## Sweep ({len(ring)} bare runs, {len(runtime)} runtime runs)\n")
    sweep_table(ring, runtime)
    huge = load(folder, "sweep-hugepages.*.json")
    if huge:
        print(f"## Sweep on transparent huge pages ({len(huge)} bare runs)\n")
        sweep_table(huge, [])
    print("## Gradient sets\n")
    grad = gradient_table(folder)
    print("## Latency, 8 bytes\n")
    lat = latency_table(folder)
    print("## torch\n")
    torch_table(folder)

    print("## Targets\n")
    for label, docs in (("bare", ring), ("runtime", runtime), ("bare on huge pages", huge)):
        if not docs:
            continue
        r64 = by_size(docs, "ratio").get(64 << 20, [])
        print(f"- 64 MiB, {label} / MPI busbw >= 2.5: runs {cell(r64)} -> "
              f"{'holds' if r64 and min(r64) >= 2.5 else 'does not hold'}")
        worst = [min(r["ratio"] for r in d["rows"] if r["bytes"] >= 1 << 20 and r.get("ratio")) for d in docs]
        print(f"- >= 1 MiB, {label} never below 0.9x MPI: lowest ratio per run {cell(worst)} -> "
              f"{'holds' if worst and min(worst) >= 0.9 else 'does not hold'}")
    if grad:
        print(f"- ResNet-50 runtime step <= MPI per tensor: speedup {cell(grad)} -> "
              f"{'holds' if min(grad) >= 1.0 else 'does not hold in every run'}")
    if lat:
        print(f"- 8-byte runtime latency < 100 us: medians {cell(lat)} -> "
              f"{'holds' if max(lat) < 100 else 'does not hold in every run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
