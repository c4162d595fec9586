#!/usr/bin/env bash
# Usage: run_elastic.sh MPIEXEC NP COMMAND...
# (GYRE_ELASTIC_TIMEOUT_S bounds the whole job, default 120 s: a hang ends.)
# Runs COMMAND on NP ranks with `--with-ft ulfm`; one rank kills itself.
# Passes when exactly NP-1 ranks (NP-2 with GYRE_TEST_KILL_IN_RECOVERY_RANK
# among the arguments: a second rank dies) print "elastic: rank N PASS" and none
# prints FAIL, whatever mpirun's own exit status (it reports the dead rank).
set -u
mpiexec=$1 np=$2
shift 2
limit=${GYRE_ELASTIC_TIMEOUT_S:-120}
start=$(date +%s%N)
out=$(timeout "$limit" "$mpiexec" --with-ft ulfm -n "$np" --oversubscribe --allow-run-as-root "$@" 2>&1)
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out" | grep -E "^elastic" | head -n 40
echo "mpirun exit status: $status after $((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))s"
fail() { echo "FAIL: $*"; echo "$out" | tail -n 30; exit 1; }
[ "$status" -ne 124 ] || fail "the job did not end within $limit s"
grep -qE "^elastic: rank [0-9]+ FAIL" <<<"$out" && fail "a rank failed"
passed=$(grep -cE "^elastic: rank [0-9]+ PASS" <<<"$out" || true)
want=$((np - 1))
case " $* " in *GYRE_TEST_KILL_IN_RECOVERY_RANK=*) want=$((np - 2)) ;; esac
[ "$passed" -eq "$want" ] || fail "$passed rank(s) passed, expected $want"
echo "PASS: $passed survivors finished"
