"""Starts a gyre job with the launcher of the MPI gyre is built against:

    python -m gyre.run -np 4 train.py --epochs 2
    python -m gyre.run -np 8 -H host1:4,host2:4 train.py
    gyrerun -np 4 python train.py

A script (a first argument ending in .py) runs under this interpreter. With
the MPICH build the launcher is that MPICH's `mpiexec` (Hydra; the one
beside this interpreter first, as `pip install mpich` puts it), with the
Open MPI build Open MPI's `mpirun`. `--dry-run` prints the command instead
of running it. Anything the two commands do not share goes after
`--mpi-args` as one string (e.g. `--mpi-args="--bind-to none"`).
torchrun needs no wrapper: docs/launch.md.
"""
import argparse
import os
import shlex
import shutil
import sys
from typing import List, Optional


def _family() -> str:
    from .bootstrap import starts_from_pmi
    return "mpich" if starts_from_pmi() else "openmpi"


def _launcher(family: str) -> str:
    names = ["mpiexec.hydra", "mpiexec"] if family == "mpich" else ["mpirun", "mpiexec"]
    beside = os.path.dirname(sys.executable)
    for name in names:
        path = os.path.join(beside, name)
        if os.access(path, os.X_OK):
            return path
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit(f"gyre.run: no {' or '.join(names)} on PATH or beside {sys.executable} "
                     f"(gyre is built against {'MPICH' if family == 'mpich' else 'Open MPI'})")


def command(np: int, hosts: Optional[str], program: List[str], family: str,
            mpi_args: str = "", launcher: Optional[str] = None) -> List[str]:
    """The launcher's command line for `np` processes of `program` (on
    `hosts`, "host:slots,..." if given)."""
    if np < 1:
        raise SystemExit(f"gyre.run: -np {np}: at least one process")
    if not program:
        raise SystemExit("gyre.run: no program to run (e.g. `python -m gyre.run -np 2 train.py`)")
    if program[0].endswith(".py"):
        program = [sys.executable] + program
    cmd = [launcher or _launcher(family)]
    if family == "mpich":
        cmd += ["-n", str(np)]
        if hosts:
            cmd += ["-hosts", hosts]
    else:
        cmd += ["-np", str(np)]
        if hosts:
            cmd += ["--host", hosts]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd + shlex.split(mpi_args) + list(program)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gyre.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("-np", "-n", dest="np", type=int, required=True, help="number of processes")
    ap.add_argument("-H", "--hosts", help="host:slots,... (default: this host)")
    ap.add_argument("--mpi-args", default="", help="more arguments for the MPI launcher")
    ap.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args] or a command")
    a = ap.parse_args(argv)
    cmd = command(a.np, a.hosts, a.program, _family(), a.mpi_args)
    if a.dry_run:
        print(shlex.join(cmd))
        return 0
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
