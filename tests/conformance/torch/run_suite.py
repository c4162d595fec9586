#!/usr/bin/env python3
"""Runs torch's backend suite (DistributedTest._DistTestBase) under mpirun.

    run_suite.py --backend gyre --np 3 [--select REGEX] [--tests a,b] [--json OUT]
    run_suite.py --backend gyre --np 3 --expect expectations.json   # CI: compare

Each job is one mpirun of dist_worker.py over the tests that remain, one
default process group per job; a test that fails, crashes or outlives
--timeout ends the job, and the next job starts after it. Prints one line per
test (pass, fail, skip, with the first failing rank's reason) and a count.

With --expect, the tests run are those that pass on gloo at this np
(expectations.json, recorded with --record from gloo runs), optionally
narrowed by --select; the exit status is non-zero when any of them does not
pass here. --record FILE merges this run's outcomes (normally gloo's) into
FILE under the np.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def all_tests():
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", "2")
    from torch.testing._internal.distributed import distributed_test as dt  # noqa: PLC0415
    return sorted(n for n in dir(dt.DistributedTest._DistTestBase) if n.startswith("test_"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_outcomes(results, name, np_):
    got = {}
    for r in range(np_):
        try:
            with open(os.path.join(results, f"{name}.{r}")) as f:
                got[r] = json.load(f)
        except (OSError, ValueError):
            pass
    return got


def merge(name, got, np_):
    """All ranks' outcomes as one: pass only where every rank passed."""
    outcomes = [got[r]["outcome"] for r in sorted(got)]
    if len(got) == np_ and all(o == "skip" for o in outcomes):
        return "skip", got[0]["detail"]
    if len(got) == np_ and all(o in ("pass", "skip") for o in outcomes) and "pass" in outcomes:
        return "pass", ""
    for r in sorted(got):
        if got[r]["outcome"] == "fail":
            return "fail", f"rank {r}: {got[r]['detail']}"
    return "fail", None


def run_job(args, tests, results, log_path):
    """One mpirun over `tests`; returns (exit status, timed out)."""
    env = dict(os.environ)
    env["MASTER_PORT"] = str(free_port())
    env["GYRE_CONFORMANCE_TMP"] = tempfile.mkdtemp(prefix="job", dir=results)
    env.setdefault("GYRE_CONFORMANCE_PEER_WAIT_S", str(args.timeout))
    cmd = [args.mpiexec, "-np", str(args.np)] + (args.mpiexec_flag or ["--oversubscribe"]) + [
           sys.executable,
           os.path.join(HERE, "dist_worker.py"), args.backend, results] + tests
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        done, last = 0, time.monotonic()
        timed_out = False
        while proc.poll() is None:
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            now_done = sum(1 for t in tests if len(read_outcomes(results, t, args.np)) == args.np)
            if now_done != done:
                done, last = now_done, time.monotonic()
            elif time.monotonic() - last > args.timeout + (0 if done else args.startup):
                timed_out = True
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return proc.returncode, timed_out


def tail(path, n=1500):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run(args, tests):
    results = tempfile.mkdtemp(prefix=f"torch-suite-{args.backend}-np{args.np}-")
    report = {}
    remaining = list(tests)
    jobs = 0
    while remaining:
        jobs += 1
        log_path = os.path.join(results, f"job{jobs}.log")
        rc, timed_out = run_job(args, remaining, results, log_path)
        finished = 0
        for name in remaining:
            got = read_outcomes(results, name, args.np)
            outcome, detail = merge(name, got, args.np)
            if detail is None:  # this test ended the job: a hang, a crash or a dead rank
                why = f"timed out after {args.timeout:.0f} s" if timed_out else f"job exit {rc}"
                ranks = sorted(set(range(args.np)) - set(got))
                detail = f"{why}; no outcome from ranks {ranks}\n{tail(log_path)}"
            report[name] = (outcome, detail)
            finished += 1
            print(f"{outcome:5} {name}", flush=True)
            if outcome == "fail":
                if not args.quiet:
                    lines = detail.strip().splitlines()
                    print("      " + "\n      ".join(lines[-8:]), flush=True)
                break
        remaining = remaining[finished:]
    if not args.keep:
        shutil.rmtree(results, ignore_errors=True)
    return report, jobs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--backend", default="gyre", choices=["gyre", "gloo"])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--select", help="regular expression over the test names")
    p.add_argument("--exclude", help="regular expression over the test names")
    p.add_argument("--tests", help="comma-separated test names")
    p.add_argument("--timeout", type=float, default=150, help="seconds per test")
    p.add_argument("--startup", type=float, default=240,
                   help="seconds more for a job's first test (mpirun, imports, the group)")
    p.add_argument("--json", help="write {test: [outcome, detail]} here")
    p.add_argument("--expect", help="run gloo's passing tests at this np and compare")
    p.add_argument("--record", help="merge this run's outcomes into this expectations file")
    p.add_argument("--keep", action="store_true", help="keep the results folder")
    p.add_argument("--mpiexec", default="mpirun")
    p.add_argument("--mpiexec-flag", action="append", help="a flag for mpiexec (repeatable)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()

    expected = None
    if args.expect:
        with open(args.expect) as f:
            data = json.load(f)
        differences = data.get("differences_on_gyre", {})
        expected = [t for t in data[str(args.np)]["pass_on_gloo"] if t not in differences]
        tests = list(expected)
        for t in data[str(args.np)]["pass_on_gloo"]:
            if t in differences:
                print(f"not run {t}: {differences[t]}")
    elif args.tests:
        tests = args.tests.split(",")
    else:
        tests = all_tests()
    if args.select:
        tests = [t for t in tests if re.search(args.select, t)]
    if args.exclude:
        tests = [t for t in tests if not re.search(args.exclude, t)]

    start = time.monotonic()
    report, jobs = run(args, tests)
    counts = {o: sum(1 for v in report.values() if v[0] == o) for o in ("pass", "fail", "skip")}
    print(f"{args.backend} np {args.np}: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['skip']} skipped in {time.monotonic() - start:.0f} s ({jobs} jobs)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    if args.record:
        record(args, report)
    if expected is not None:
        missing = [t for t in tests if report[t][0] != "pass"]
        for t in missing:
            print(f"REGRESSION against gloo at np {args.np}: {t} ({report[t][0]})")
        return 1 if missing else 0
    return 1 if counts["fail"] else 0


def summary(detail):
    """A failure's exception line (the last line naming an error), or a skip's reason."""
    lines = [ln.strip() for ln in (detail or "").strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Exit)\b|^[\w.]*(Error|Exception):", ln):
            return ln[:300]
    return lines[-1][:300] if lines else ""


def record(args, report):
    """Merges a run's outcomes into the expectations file, under its np:
    pass_on_gloo lists the tests that passed; the others keep their reason
    (a hand-written one is kept over the runner's)."""
    data = {}
    if os.path.exists(args.record):
        with open(args.record) as f:
            data = json.load(f)
    entry = data.setdefault(str(args.np), {"pass_on_gloo": [], "not_on_gloo": {}})
    passed = set(entry["pass_on_gloo"])
    for name, (outcome, detail) in report.items():
        if outcome == "pass":
            passed.add(name)
            entry["not_on_gloo"].pop(name, None)
        else:
            passed.discard(name)
            entry["not_on_gloo"].setdefault(name, f"{outcome}: {summary(detail)}")
    entry["pass_on_gloo"] = sorted(passed)
    entry["not_on_gloo"] = dict(sorted(entry["not_on_gloo"].items()))
    with open(args.record, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
