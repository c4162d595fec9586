#!/usr/bin/env bash
# run_gpu_mpi.sh EXE MPIEXEC NP [MPIEXEC FLAGS...]
# Runs a GPU test under mpirun, or reports it skipped: the test binary's
# --probe looks for a CUDA device per rank first, and exits 77 with "SKIPPED: ..."
# when there is none. Probing outside mpirun keeps the skip independent of
# how mpirun reports ranks' exit codes.
set -u
exe=$1 mpiexec=$2 np=$3
shift 3
"$exe" --probe "$np"
rc=$?
if [ "$rc" -ne 0 ]; then
  exit "$rc"  # 77: skipped (no CUDA device); anything else: the probe failed
fi
exec "$mpiexec" -n "$np" "$@" "$exe"
