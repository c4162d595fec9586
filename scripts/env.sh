# Sourced by the scripts: where the build goes, and what Open MPI needs here.
GYRE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GYRE_BUILD=${GYRE_BUILD:-$GYRE_ROOT/build}
# Tests and examples run up to 4 ranks on 2 cores, possibly as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
jobs=$(nproc 2>/dev/null || echo 2)
# ccache where installed (scripts/setup.sh installs it): the suite's build
# trees (build/python, build/, build-ulfm/ and its python/, build-mpich/)
# compile mostly the same sources with the same flags; only files whose
# preprocessed text differs (mpi.h's users, another MPI) are compiled again.
# CMake reads these when it configures a new tree.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
fi

gyre_build() {
  cmake -S "$GYRE_ROOT" -B "$GYRE_BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$GYRE_BUILD" -j "$jobs"
}

# What failed, for scripts/test.sh's summary at the end of the suite (CI
# keeps only the tail of a run's output). gyre_ctest_failed DIR: the names of
# the tests the last ctest run in DIR saw fail, comma-separated (nothing if
# it recorded none). gyre_record_failure WHAT: appends WHAT to
# $GYRE_FAILURE_LOG when that is set (elastic.sh and launch.sh, run by
# test.sh).
gyre_ctest_failed() {
  local log=$1/Testing/Temporary/LastTestsFailed.log
  [ -f "$log" ] && cut -d: -f2- "$log" | paste -sd, -
  return 0
}
gyre_record_failure() {
  [ -n "${GYRE_FAILURE_LOG:-}" ] && echo "$1" >>"$GYRE_FAILURE_LOG"
  return 0
}

# gyre_stop_job PID: ends a background job of the calling script if it still
# runs, and reaps it. Never fails: it runs in EXIT traps of `set -e` scripts,
# where a failing command (kill of a job that has already ended and been
# reaped) would replace the script's exit status with 1.
gyre_stop_job() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
