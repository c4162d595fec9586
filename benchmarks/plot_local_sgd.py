#!/usr/bin/env python3
"""Plots the loss curves of benchmarks/local_sgd.py (evaluation loss, mean
over ranks, against the slowest rank's training time; left) and the same
curves against steps (right), with the target (the synchronous run's final
loss) as a dashed line.

    python3 benchmarks/plot_local_sgd.py -o docs/local_sgd_curves.png RESULT.json
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.8))
    speed = {r["mode"]: r for r in data["summary"]}
    for run in data["runs"]:
        xs_t = [p["time_s"] for p in run["curve"]]
        xs_s = [p["step"] for p in run["curve"]]
        ys = [p["loss"] for p in run["curve"]]
        row = speed[run["mode"]]
        label = run["mode"]
        if row["speedup_vs_sync"]:
            label += f" ({row['time_to_target_s']:.0f} s to target, {row['speedup_vs_sync']:.2f}x)"
        else:
            label += " (target not reached)"
        style = "-" if run["mode"] == "sync" else ("--" if run["mode"].startswith("diloco") else "-.")
        width = 2.2 if run["mode"] == "sync" else 1.4
        line, = by_time.plot(xs_t, ys, style, linewidth=width, marker=".", markersize=4, label=label)
        by_step.plot(xs_s, ys, style, linewidth=width, marker=".", markersize=4, color=line.get_color(),
                     label=run["mode"])
    for ax in (by_time, by_step):
        ax.axhline(data["target"], color="gray", linestyle=":", linewidth=1)
        ax.set_ylabel("held-out loss (nats, mean over ranks)")
        ax.grid(True, alpha=0.3)
    by_time.set_xlabel("training wall time, slowest rank (s; evaluation excluded)")
    by_step.set_xlabel("step")
    by_time.legend(fontsize=8)
    by_step.legend(fontsize=8)
    hosts = len(data.get("hosts", [])) or 1
    title = args.title or (f"{data['world']} ranks on {hosts} host(s), {data['parameters'] / 1e6:.1f} M parameters; "
                           f"dotted: target {data['target']:.3f} (sync's final loss)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
