#!/usr/bin/env bash
# Usage: run_respawn.sh MPIEXEC NP PASSES ENDS ENDED_TEXT COMMAND...
# (GYRE_ELASTIC_TIMEOUT_S bounds the whole job, default 120 s: a hang ends.)
# Runs COMMAND on NP ranks with `--with-ft ulfm` (elastic_respawn.cc, or a
# Python script printing the same lines). Passes when exactly PASSES ranks
# print "elastic: rank P PASS", exactly ENDS print "elastic: rank P ENDED:"
# with ENDED_TEXT in the line, and none prints FAIL, whatever mpirun's own
# exit status (it reports the dead ranks). GYRE_TEST_EXPECT_OUTPUT: a text
# the job's output must contain as well ("{hostname}" stands for this host's
# name). GYRE_TEST_RETRY_ON_RECOVERY_DEADLINE=1: a job that the recovery
# deadline ended (GYRE_ELASTIC_RECOVERY_TIMEOUT_S: a recovery blocked inside
# Open MPI, docs/elastic.md "Limits") is run once more, saying so; the
# second run's outcome is the test's.
set -u
mpiexec=$1 np=$2 passes=$3 ends=$4 ended_text=$5
shift 5
limit=${GYRE_ELASTIC_TIMEOUT_S:-120}
deadline_text="the recovery has not finished after"
for attempt in 1 2; do
  start=$(date +%s%N)
  out=$(timeout -k 10 "$limit" "$mpiexec" --with-ft ulfm -n "$np" --oversubscribe --allow-run-as-root "$@" 2>&1)
  status=$?
  [ "${GYRE_TEST_RETRY_ON_RECOVERY_DEADLINE:-0}" = 1 ] && [ "$attempt" = 1 ] &&
    [ "$status" -ne 124 ] && grep -qF -- "$deadline_text" <<<"$out" || break
  echo "attempt 1 was ended by the recovery deadline (a recovery blocked inside MPI):"
  grep -F -- "$deadline_text" <<<"$out" | head -n 3
  echo "running the job once more"
done
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out" | grep -E "^elastic" | head -n 40
echo "mpirun exit status: $status after $((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))s"
fail() { echo "FAIL: $*"; echo "$out" | tail -n 30; exit 1; }
[ "$status" -ne 124 ] || fail "the job did not end within $limit s"
grep -qE "^elastic: rank [^ ]+ FAIL" <<<"$out" && fail "a rank failed"
got=$(grep -cE "^elastic: rank [^ ]+ PASS" <<<"$out" || true)
[ "$got" -eq "$passes" ] || fail "$got rank(s) passed, expected $passes"
got=$(grep -E "^elastic: rank [^ ]+ ENDED:" <<<"$out" | grep -cF -- "$ended_text" || true)
[ "$got" -eq "$ends" ] || fail "$got rank(s) ended with '$ended_text', expected $ends"
# Where the program prints when it killed a rank and when each rank ended
# (steady_clock ns, elastic_respawn.cc), every end must come within
# GYRE_TEST_END_WITHIN_S (default 30 s, generous on a loaded machine) of
# the kill: the survivors end, they do not wait.
killed_ns=$(grep -oE "^elastic: rank [^ ]+ killed at step [0-9]+ at [0-9]+ ns" <<<"$out" | head -n 1 |
            grep -oE "[0-9]+ ns$" | grep -oE "^[0-9]+" || true)
if [ -n "$killed_ns" ]; then
  for end_ns in $(grep -E "^elastic: rank [^ ]+ ENDED:" <<<"$out" | grep -oE "\(at [0-9]+ ns\)" |
                  grep -oE "[0-9]+"); do
    waited_ms=$(( (end_ns - killed_ns) / 1000000 ))
    echo "ended ${waited_ms} ms after the kill"
    [ "$waited_ms" -le $(( ${GYRE_TEST_END_WITHIN_S:-30} * 1000 )) ] ||
      fail "a rank ended ${waited_ms} ms after the kill"
  done
fi
if [ -n "${GYRE_TEST_EXPECT_OUTPUT:-}" ]; then
  expect=${GYRE_TEST_EXPECT_OUTPUT//\{hostname\}/$(hostname)}
  grep -qF -- "$expect" <<<"$out" || fail "the output does not contain '$expect'"
  echo "output contains: $expect"
fi
echo "PASS: $passes rank(s) finished, $ends ended as expected"
