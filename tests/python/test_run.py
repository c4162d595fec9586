"""python -m gyre.run (gyrerun): the launcher command it makes for each MPI
family, and that it names this build's launcher. The launches themselves:
scripts/launch.sh (MPICH) and the README's commands (Open MPI)."""
import subprocess
import sys

import pytest

from gyre import run


def test_open_mpi_command():
    cmd = run.command(4, "a:2,b:2", ["train.py", "--epochs", "2"], "openmpi",
                      "--bind-to none", launcher="/x/mpirun")
    assert cmd[:5] == ["/x/mpirun", "-np", "4", "--host", "a:2,b:2"]
    assert cmd[-6:] == ["--bind-to", "none", sys.executable, "train.py", "--epochs", "2"]


def test_mpich_command():
    cmd = run.command(3, "h0:2,h1:1", ["python", "t.py"], "mpich", launcher="/v/bin/mpiexec")
    assert cmd == ["/v/bin/mpiexec", "-n", "3", "-hosts", "h0:2,h1:1", "python", "t.py"]


def test_refusals():
    with pytest.raises(SystemExit, match="at least one process"):
        run.command(0, None, ["t.py"], "mpich", launcher="m")
    with pytest.raises(SystemExit, match="no program"):
        run.command(2, None, [], "mpich", launcher="m")


def test_dry_run_names_this_builds_launcher():
    out = subprocess.run([sys.executable, "-m", "gyre.run", "-np", "2", "--dry-run", "t.py"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    launcher = out.stdout.split()[0]
    assert launcher.endswith(("mpirun", "mpiexec", "mpiexec.hydra")), out.stdout
    assert out.stdout.rstrip().endswith(f"{sys.executable} t.py")
