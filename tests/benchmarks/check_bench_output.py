#!/usr/bin/env python3
"""Runs one benchmark command (an mpiexec line) and checks what it printed.

    check_bench_output.py --mode sweep|gradients|latency|torch [--json FILE]
                          [--sizes 1024,4096] [--timeout S] -- COMMAND...

Checks that the command succeeds, that every row parses into the expected
columns, that the columns agree with each other (busbw = algbw * 2(n-1)/n,
algbw = bytes / time, ratio = MPI time / gyre time, min <= median <= max),
that every correctness column is zero, and, with --json, that the JSON file
holds the same rows. Timings are never compared with any threshold.

`--self-test` runs the parsers on good and deliberately broken tables and
fails unless each broken one is rejected.
"""
import argparse
import json
import math
import re
import subprocess
import sys


class CheckError(Exception):
    pass


def close(a, b, rel=0.02, abs_tol=0.0015):
    # The table prints 2-3 decimals: compare with the rounding it implies.
    return abs(a - b) <= max(abs_tol, rel * max(abs(a), abs(b)))


def quotient_close(q, a, b, half_ulp=0.0005, q_half_ulp=0.005):
    # q printed beside a and b, each rounded to 3 decimals (q to 2) from the
    # unrounded values: a/b recomputed from the printed columns may be off by
    # the rounding of a and b, which is large where b is near 0.001 (a bound
    # row slowed by load), plus q's own rounding.
    if b <= half_ulp:
        return q > 0
    lo = max(a - half_ulp, 0.0) / (b + half_ulp)
    hi = (a + half_ulp) / (b - half_ulp)
    return lo * 0.98 - q_half_ulp - 0.001 <= q <= hi * 1.02 + q_half_ulp + 0.001


def require(cond, msg):
    if not cond:
        raise CheckError(msg)


def data_lines(text):
    return [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")
            and not l.startswith("[")]  # Open MPI notices start with '['


def footer_ok(text):
    require(re.search(r"^# Wrong elements in total: 0 OK$", text, re.M),
            "missing '# Wrong elements in total: 0 OK' footer")


def world_size(text, pattern):
    m = re.search(pattern, text)
    require(m, f"header does not state the number of ranks ({pattern!r})")
    return int(m.group(1))


def sized_rows_ok(text, rows, what, sizes, json_doc):
    """The checks every sweep's rows share: some rows, the expected sizes,
    the footer, and the JSON rows the same sizes as the table."""
    require(rows, f"no {what} rows")
    if sizes is not None:
        require(rows == sizes, f"sizes {rows} != expected {sizes}")
    footer_ok(text)
    if json_doc is not None:
        require([r["bytes"] for r in json_doc["rows"]] == rows, "JSON rows differ from the table")


def check_sweep(text, sizes=None, json_doc=None):
    n = world_size(text, r"^# gyre-allreduce-perf: (\d+) ranks", )
    elem = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
            "int8": 1, "uint8": 1, "int32": 4, "int64": 8}
    rows = []
    for line in data_lines(text):
        f = line.split()
        require(len(f) in (12, 14), f"sweep row has {len(f)} fields, expected 12 (14 with --bound): {line!r}")
        size, count, dtype, op = int(f[0]), int(f[1]), f[2], f[3]
        t, algbw, busbw, wrong = float(f[4]), float(f[5]), float(f[6]), int(f[7])
        require(dtype in elem, f"unknown type {dtype!r} in {line!r}")
        require(count * elem[dtype] == size, f"count {count} x {dtype} != {size} bytes")
        require(t > 0, f"non-positive time in {line!r}")
        require(close(algbw, size / t / 1e3), f"algbw {algbw} != bytes/time {size / t / 1e3:.3f}")
        require(close(busbw, algbw * 2 * (n - 1) / n), f"busbw {busbw} != algbw*2(n-1)/n")
        require(wrong == 0, f"gyre result wrong in {wrong} elements at {size} B")
        if f[8] == "n/a":
            require(f[9:] == ["n/a"] * 3, f"partial MPI columns in {line!r}")
        else:
            mt, mbw, mwrong, ratio = float(f[8]), float(f[9]), int(f[10]), float(f[11])
            require(mt > 0, f"non-positive MPI time in {line!r}")
            require(close(mbw, size / mt / 1e3 * 2 * (n - 1) / n), f"MPI busbw {mbw} inconsistent")
            require(close(ratio, mt / t, abs_tol=0.006), f"ratio {ratio} != MPI time / gyre time {mt / t:.3f}")
            require(mwrong == 0, f"MPI result wrong in {mwrong} elements at {size} B")
        if len(f) == 14:  # --bound: the bound's busbw and gyre's fraction of it
            bbw, frac = float(f[12]), float(f[13])
            require(bbw > 0, f"non-positive bound busbw in {line!r}")
            require(quotient_close(frac, busbw, bbw), f"gyre/bnd {frac} != {busbw / bbw:.3f}")
        rows.append(size)
    sized_rows_ok(text, rows, "sweep", sizes, json_doc)
    if json_doc is not None:
        require(json_doc.get("benchmark") == "allreduce-sweep", "JSON benchmark is not allreduce-sweep")
        require(all(r["wrong"] == 0 and r.get("mpi_wrong", 0) == 0 for r in json_doc["rows"]),
                "JSON reports wrong elements")
    return rows


def named_rows(text, numeric):
    """Rows of `name words... v1 ... v_numeric`: the name may contain spaces."""
    out = []
    for line in data_lines(text):
        f = line.split()
        require(len(f) > numeric, f"row too short: {line!r}")
        try:
            vals = [float(x) for x in f[-numeric:]]
        except ValueError:
            raise CheckError(f"non-numeric column in {line!r}")
        out.append((" ".join(f[:-numeric]), vals))
    return out


def check_gradients(text, json_doc=None):
    world_size(text, r"float32 elements .*?, \w+, (\d+) ranks")
    rows = named_rows(text, 7)
    names = [r[0] for r in rows]
    # Six systems, and the bare shared-memory allreduce when every rank is on one host.
    require(len(rows) in (6, 7), f"expected 6 or 7 systems, got {names}")
    require(len(rows) == 6 or "gyre shm fused (1 call)" in names, f"unexpected systems {names}")
    require(any(n.startswith("gyre runtime") for n in names), "no gyre runtime row")
    require("MPI_Allreduce per tensor, no runtime" in names, "no MPI per-tensor row")
    for name, (med, lo, hi, busbw, vs_pt, vs_fused, wrong) in rows:
        require(0 < lo <= med <= hi, f"{name}: not min <= median <= max ({lo}, {med}, {hi})")
        require(busbw > 0 and vs_pt > 0 and vs_fused > 0, f"{name}: non-positive bandwidth or ratio")
        require(wrong == 0, f"{name}: {int(wrong)} wrong elements")
    ref = dict(rows)["MPI_Allreduce per tensor, no runtime"]
    require(close(ref[4], 1.0), "MPI per tensor is not 1.00 against itself")
    footer_ok(text)
    if json_doc is not None:
        require([r["system"] for r in json_doc["rows"]] == names, "JSON systems differ from the table")
        require(all(r["wrong"] == 0 for r in json_doc["rows"]), "JSON reports wrong elements")
    return names


def check_latency(text, json_doc=None):
    world_size(text, r"sum\), (\d+) ranks")
    rows = named_rows(text, 6)
    names = [r[0] for r in rows]
    require(names == ["gyre runtime", "gyre bare", "MPI_Allreduce"], f"unexpected systems {names}")
    for name, (med, p10, p90, p99, avg, wrong) in rows:
        require(0 < p10 <= med <= p90 <= p99, f"{name}: percentiles out of order")
        require(avg > 0, f"{name}: non-positive mean")
        require(wrong == 0, f"{name}: {int(wrong)} wrong results")
    footer_ok(text)
    if json_doc is not None:
        require([r["system"] for r in json_doc["rows"]] == names, "JSON systems differ from the table")
    return names


def check_torch(text, sizes=None, json_doc=None):
    n = world_size(text, r"^# torch allreduce sweep: (\d+) ranks")
    rows = []
    for line in data_lines(text):
        f = line.split()
        require(len(f) == 9, f"torch row has {len(f)} fields, expected 9: {line!r}")
        size, count = int(f[0]), int(f[1])
        t, busbw, wrong, gt, gbusbw, gwrong, ratio = (float(x) for x in f[2:9])
        require(count * 4 == size, f"count {count} x float32 != {size}")
        require(t > 0 and gt > 0, f"non-positive time in {line!r}")
        require(close(busbw, size / t / 1e3 * 2 * (n - 1) / n), f"gyre busbw {busbw} inconsistent")
        require(close(gbusbw, size / gt / 1e3 * 2 * (n - 1) / n), f"gloo busbw {gbusbw} inconsistent")
        require(close(ratio, gt / t, abs_tol=0.006), f"ratio {ratio} != gloo time / gyre time")
        require(wrong == 0, f"gyre.torch: {int(wrong)} wrong elements at {size} B")
        require(gwrong == 0, f"gloo: {int(gwrong)} wrong elements at {size} B")
        rows.append(size)
    sized_rows_ok(text, rows, "torch sweep", sizes, json_doc)
    return rows


CHECKS = {"sweep": check_sweep, "gradients": check_gradients, "latency": check_latency,
          "torch": check_torch}


def self_test():
    good = """# gyre-allreduce-perf: 2 ranks, float32 sum, out-of-place
        1024          256  float32     sum      10.00    0.102    0.102       0      20.00    0.051       0     2.00
# Wrong elements in total: 0 OK
"""
    check_sweep(good, sizes=[1024])
    broken = {
        "wrong elements": good.replace("0.102       0", "0.102       3"),
        "bad busbw": good.replace("0.102    0.102", "0.102    0.500"),
        "bad ratio": good.replace("2.00\n", "3.00\n"),
        "missing column": good.replace("     2.00\n", "\n"),
        "no footer": good.replace("0 OK", "1 FAILED"),
        "bad count": good.replace("  256  ", "  255  "),
    }
    for what, text in broken.items():
        try:
            check_sweep(text, sizes=[1024])
        except CheckError:
            continue
        raise CheckError(f"self-test: a table with {what} was accepted")
    try:
        check_sweep(good, sizes=[1024, 4096])
        raise CheckError("self-test: a missing size was accepted")
    except CheckError as e:
        if "self-test" in str(e):
            raise
    lat = """# gyre-allreduce-perf latency: 8 bytes (2 x float32, sum), 2 ranks
  gyre runtime        50.00      40.00      60.00      90.00      52.00       0
  gyre bare           10.00       9.00      12.00      20.00      10.50       0
  MPI_Allreduce        5.00       4.00       6.00       9.00       5.20       0
# Wrong elements in total: 0 OK
"""
    check_latency(lat)
    for bad in (lat.replace("40.00      60.00", "70.00      60.00"), lat.replace("52.00       0", "52.00       1")):
        try:
            check_latency(bad)
        except CheckError:
            continue
        raise CheckError("self-test: a broken latency table was accepted")
    print("self-test: 1 good sweep and 1 good latency table accepted, 9 broken tables rejected")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=sorted(CHECKS))
    ap.add_argument("--json", help="JSON file the command writes (removed first)")
    ap.add_argument("--sizes", help="comma-separated byte sizes the sweep must print, in order")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or not a.mode:
        ap.error("--mode and a command after -- are required")
    if a.json:
        import os
        if os.path.exists(a.json):
            os.remove(a.json)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired as e:
        print(f"FAIL: command did not finish within {a.timeout} s", file=sys.stderr)
        print(e.stdout or "", e.stderr or "", sep="\n", file=sys.stderr)
        return 1
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        print(f"FAIL: command exited with status {p.returncode}", file=sys.stderr)
        return 1
    try:
        doc = None
        if a.json:
            with open(a.json) as f:
                doc = json.load(f)
        kwargs = {"json_doc": doc}
        if a.sizes:
            kwargs["sizes"] = [int(s) for s in a.sizes.split(",")]
        result = CHECKS[a.mode](p.stdout, **kwargs)
    except (CheckError, OSError, ValueError, KeyError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    print(f"check_bench_output: {a.mode} OK ({len(result)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
