#!/usr/bin/env bash
# Usage: run_killed_rank.sh MPIEXEC NP EXE [mpiexec flags...]
#        run_killed_rank.sh --hosts HOSTS_SH HOSTS SLOTS EXE
# Passes when the job ends non-zero within the bound after the victim rank
# (GYRE_TEST_KILL_RANK, default 1) is killed, with the dead rank named, and no
# shared-memory segment of the job remains. The second form runs the job
# across simulated hosts (scripts/hosts.sh; exit 77 where it cannot).
set -u
victim=${GYRE_TEST_KILL_RANK:-1}
export GYRE_TEST_KILL_RANK=$victim
if [ "$1" = --hosts ]; then
  hosts_sh=$2 hosts=$3 slots=$4 exe=$5
  launch=(bash "$hosts_sh" run "$hosts" "$slots" "$exe")
else
  mpiexec=$1 np=$2 exe=$3
  shift 3
  launch=("$mpiexec" -n "$np" "$@" "$exe")
fi
bound_s=20
start=$(date +%s%N)
out=$(timeout 120 "${launch[@]}" 2>&1)
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
echo "$out" | tail -n 20
echo "exit status: $status after ${elapsed}s"
fail() { echo "FAIL: $*"; exit 1; }
[ "$status" -ne 77 ] || { echo "SKIP: $(tail -n 1 <<<"$out")"; exit 77; }
[ "$status" -ne 0 ] || fail "the job exited 0 although rank $victim was killed"
[ "$status" -ne 124 ] || fail "the job did not end within 120 s"
(( elapsed_ms < bound_s * 1000 )) || fail "the job took ${elapsed}s to end (bound ${bound_s}s)"
grep -qE "rank $victim .*(signal 9|Killed)|process rank $victim" <<<"$out" ||
  fail "no message names rank $victim"
pid=$(sed -n 's/^rank 0 pid \([0-9]*\)$/\1/p' <<<"$out" | head -1)
[ -n "$pid" ] || fail "rank 0 did not report its pid"
left=$(ls /dev/shm 2>/dev/null | grep -c "^gyre-$pid-" || true)
[ "$left" -eq 0 ] || fail "$left shared-memory segment(s) of the job left in /dev/shm"
echo "PASS: job ended with status $status in ${elapsed}s, rank $victim named, /dev/shm clean"
