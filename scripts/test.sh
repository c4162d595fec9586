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
ctest --output-on-failure -j "$jobs" --timeout 600 || status=1

# Python: every rank runs the same pytest session; a failure on any rank fails
# mpirun (tests/python/mpi_pytest.py; "no tests collected" counts as failure).
# pytest-timeout bounds each test, `timeout` the whole run.
cd "$GYRE_ROOT"
for np in 2 3; do
  echo "== pytest, mpirun -np $np"
  timeout 900 mpirun -np "$np" python3 tests/python/mpi_pytest.py tests/python \
    -p no:cacheprovider -q --color=no || status=1
done
echo "== examples/train_cnn.py, mpirun -np 2"
timeout 300 mpirun -np 2 python3 examples/train_cnn.py --epochs 2 || status=1
exit "$status"
