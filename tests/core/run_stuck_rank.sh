#!/usr/bin/env bash
# Usage: run_stuck_rank.sh MPIEXEC NP EXE [mpiexec flags...]
# Passes when the job exits non-zero and a waiting rank logged the timeout.
set -u
mpiexec=$1 np=$2 exe=$3
shift 3
out=$(GYRE_OP_TIMEOUT_S=3 GYRE_CYCLE_TIME_MS=1 "$mpiexec" -n "$np" "$@" "$exe" 2>&1)
status=$?
echo "$out"
echo "exit status: $status"
if [ "$status" -eq 0 ]; then
  echo "FAIL: the job exited 0 although rank 1 stopped"
  exit 1
fi
if ! grep -q "timed out during" <<<"$out" || ! grep -q "GYRE_OP_TIMEOUT_S=3" <<<"$out"; then
  echo "FAIL: no rank logged the timeout"
  exit 1
fi
echo "PASS: job ended with status $status and the waiting ranks' message"
