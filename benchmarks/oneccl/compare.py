#!/usr/bin/env python3
"""A markdown table of oneCCL's sweep (ccl-allreduce --json) beside gyre's
(gyre-allreduce-perf --runtime --json), each with the MPI_Allreduce timed in
its own job, and the ratios:

    python3 benchmarks/oneccl/compare.py oneccl.json gyre-runtime.json

ccl/MPI and gyre/MPI come from one job each (same run); gyre/oneCCL compares
two jobs run one after the other, so it also carries the drift between them.
Ratios are of busbw (equally of inverse time): above 1, the first is faster.
"""
import json
import sys


def human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def rows(path):
    with open(path) as f:
        return {r["bytes"]: r for r in json.load(f)["rows"]}


def main():
    ccl, gyre = rows(sys.argv[1]), rows(sys.argv[2])
    print("| size | oneCCL µs | oneCCL busbw | MPI busbw (ccl job) | ccl/MPI | gyre µs | gyre busbw | "
          "MPI busbw (gyre job) | gyre/MPI | gyre/oneCCL |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted(set(ccl) & set(gyre)):
        c, g = ccl[size], gyre[size]
        print(f"| {human(size)} | {c['time_us']:.2f} | {c['busbw_gbs']:.3f} | {c['mpi_busbw_gbs']:.3f} | "
              f"{c['ratio']:.2f} | {g['time_us']:.2f} | {g['busbw_gbs']:.3f} | {g['mpi_busbw_gbs']:.3f} | "
              f"{g['ratio']:.2f} | {c['time_us'] / g['time_us']:.2f} |")
    wrong = sum(r.get("wrong", 0) + r.get("mpi_wrong", 0) for r in list(ccl.values()) + list(gyre.values()))
    print(f"\nbusbw in GB/s; time: median of the blocks, slowest rank; wrong elements in all rows: {wrong}")


if __name__ == "__main__":
    main()
