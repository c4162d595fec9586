#!/usr/bin/env bash
# Set-up, build and the whole test suite: C++ unit tests, MPI tests (2-4 ranks),
# the Python package's tests under mpirun -np 2 and -np 3, the training example.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
source "$here/env.sh"
gyre_build -DGYRE_BUILD_TESTS=ON
cd "$GYRE_BUILD"
# Every part runs even if an earlier one failed; the script fails if any did.
status=0
echo "== ctest: C++ unit and MPI tests"
ctest --output-on-failure -j "$jobs" --timeout 600 -LE python || status=1

# Python: every rank runs the same pytest session under mpirun -np 2 and -np 3
# (tests/python/mpi_pytest.py: a failure on any rank fails mpirun, "no tests
# collected" too), registered in CTest by tests/python/CMakeLists.txt when
# python3 imports the installed gyre and torch; run alone, after the rest.
# pytest-timeout bounds each test, the CTest timeout the whole run.
echo "== ctest -L python: pytest under mpirun -np 2 and -np 3"
ctest --output-on-failure -L python --no-tests=error || status=1
cd "$GYRE_ROOT"
echo "== examples/train_cnn.py, mpirun -np 2"
timeout 300 mpirun -np 2 python3 examples/train_cnn.py --epochs 2 || status=1
exit "$status"
