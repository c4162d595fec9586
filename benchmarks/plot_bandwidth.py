#!/usr/bin/env python3
"""Plots bus bandwidth against message size (log-log), one line per system,
from the --json files of gyre-allreduce-perf's sweep and of
torch_allreduce_perf.py.

    python3 benchmarks/plot_bandwidth.py -o docs/benchmarks_busbw.png \
        bare.json runtime.json torch.json

Each file contributes a run of its own system and a run of its peer
(MPI_Allreduce, or torch.distributed with gloo). The C++ sweeps and the torch
sweeps are drawn side by side in two panels. Runs with the same label,
from however many files, are drawn as one line through the median of each
size, with a band from the lowest to the highest run: MPI_Allreduce measured
beside the bare collectives pools into one line (beside the runtime, it is a
line of its own).
"""
import argparse
import json
import statistics
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

PEER_KEYS = ("mpi_busbw_gbs", "peer_busbw_gbs")


def series_of(doc, by_ranks=False):
    """[(label, {bytes: busbw})] for the system, the peer and (--bound) the
    machine's bound of one file; with by_ranks, each label says the number of
    ranks, so that runs at different rank counts are lines of their own."""
    own, peer, bound = {}, {}, {}
    peer_name = doc.get("peer", "MPI_Allreduce")
    for row in doc["rows"]:
        if row.get("busbw_gbs") is not None:
            own[row["bytes"]] = row["busbw_gbs"]
        for k in PEER_KEYS:
            if row.get(k) is not None:
                peer[row["bytes"]] = row[k]
        if row.get("bound_busbw_gbs") is not None:
            bound[row["bytes"]] = row["bound_busbw_gbs"]
    # Runs on transparent huge pages (--hugepages) and MPI measured in the
    # same process as gyre's runtime are lines of their own, never pooled
    # with the plain runs.
    # gloo's buffer is allocated once, so its runs pool whatever the pages.
    suffix = " (huge pages)" if doc.get("pages") == "huge" else ""
    out = [(doc["system"] + suffix, own)]
    if peer:
        if doc["system"] == "gyre runtime":
            peer_name += " (beside gyre runtime)"
        out.append((peer_name + ("" if doc.get("benchmark") == "torch-sweep" else suffix), peer))
    if bound:
        out.append(("single-copy bound (shared memory)" + suffix, bound))
    if by_ranks:
        out = [(f"{label}, {doc.get('ranks')} ranks", points) for label, points in out]
    return out


def human(nbytes):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}"


def main():
    ap = argparse.ArgumentParser(description="bus bandwidth vs size, log-log")
    ap.add_argument("files", nargs="+", help="--json outputs of the sweeps")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", default=None)
    ap.add_argument("--by-ranks", action="store_true",
                    help="a line per rank count (files of several rank counts)")
    a = ap.parse_args()

    panels = OrderedDict()  # benchmark -> label -> list of {bytes: busbw}, one per run
    ranks = set()
    for path in a.files:
        with open(path) as f:
            doc = json.load(f)
        ranks.add(doc.get("ranks"))
        runs = panels.setdefault(doc.get("benchmark", "allreduce-sweep"), OrderedDict())
        for label, points in series_of(doc, a.by_ranks):
            runs.setdefault(label, []).append(points)

    titles = {"allreduce-sweep": "C++: gyre-allreduce-perf", "torch-sweep": "Python: torch_allreduce_perf.py"}
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), dpi=110, squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, (kind, runs) in zip(axes[0], panels.items()):
        for i, (label, run_list) in enumerate(runs.items()):
            sizes = sorted(set().union(*run_list))
            med, lo, hi = [], [], []
            for s in sizes:
                vals = [r[s] for r in run_list if s in r]
                med.append(statistics.median(vals))
                lo.append(min(vals))
                hi.append(max(vals))
            n = len(run_list)
            color = colors[i % len(colors)]
            ax.plot(sizes, med, marker="o", markersize=3, color=color,
                    label=label + (f" (median of {n} runs)" if n > 1 else ""))
            if n > 1:
                ax.fill_between(sizes, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        all_sizes = sorted(set().union(*(set(r) for rl in runs.values() for r in rl)))
        if all_sizes:
            ticks = [1 << k for k in range(0, 41, 2) if all_sizes[0] <= (1 << k) <= all_sizes[-1]]
            ax.set_xticks(ticks)
            ax.set_xticklabels([human(t) for t in ticks], rotation=45, fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(titles.get(kind, kind), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    r = ", ".join(str(x) for x in sorted(x for x in ranks if x is not None))
    fig.suptitle(a.title or f"allreduce bus bandwidth, float32 sum, {r} ranks")
    fig.tight_layout()
    fig.savefig(a.output)
    lines = sum(len(runs) for runs in panels.values())
    print(f"wrote {a.output}: {lines} lines in {len(panels)} panels from {len(a.files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
