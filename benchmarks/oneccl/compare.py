#!/usr/bin/env python3
"""Markdown tables of benchmarks/oneccl/run.sh's JSON rows, with the ratios.

    python3 benchmarks/oneccl/compare.py oneccl-gyre.json
        one job timed all three (ccl-allreduce-gyre): every ratio same-run
    python3 benchmarks/oneccl/compare.py oneccl.json gyre-runtime.json
        oneCCL's sweep (ccl-allreduce) beside gyre's (gyre-allreduce-perf
        --runtime), each with the MPI_Allreduce timed in its own job:
        ccl/MPI and gyre/MPI are same-run; gyre/oneCCL compares two jobs run
        one after the other, so it also carries the drift between them

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


def one_job(ccl):
    print("| size | oneCCL µs | oneCCL busbw | MPI µs | MPI busbw | gyre µs | gyre busbw | "
          "oneCCL/MPI | gyre/MPI | gyre/oneCCL |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted(ccl):
        r = ccl[size]
        print(f"| {human(size)} | {r['time_us']:.2f} | {r['busbw_gbs']:.3f} | {r['mpi_time_us']:.2f} | "
              f"{r['mpi_busbw_gbs']:.3f} | {r['gyre_time_us']:.2f} | {r['gyre_busbw_gbs']:.3f} | "
              f"{r['ratio']:.2f} | {r['mpi_time_us'] / r['gyre_time_us']:.2f} | "
              f"{r['time_us'] / r['gyre_time_us']:.2f} |")
    wrong = sum(r["wrong"] + r["mpi_wrong"] + r["gyre_wrong"] for r in ccl.values())
    print(f"\nbusbw in GB/s; time: median of the blocks, slowest rank; one job; wrong elements in all rows: {wrong}")


def main():
    ccl = rows(sys.argv[1])
    if len(sys.argv) == 2:
        one_job(ccl)
        return
    gyre = rows(sys.argv[2])
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
