#!/usr/bin/env bash
# Usage: run_stopped_rank.sh DELAY_US MPIEXEC NP EXE [mpiexec flags...]
# Rank 1 stops itself (SIGSTOP) mid-collective. Passes when the job ends
# non-zero within GYRE_OP_TIMEOUT_S plus a margin, every other rank logged
# the deadline error naming whom it waited for (over shared memory rank 1;
# over MPI its ring predecessor, a chain that leads back to rank 1, or rank 1
# itself), and no
# process of the job is left, stopped or not.
set -u
delay_us=$1 mpiexec=$2 np=$3 exe=$4
shift 4
deadline_s=5
bound_s=$((deadline_s + 15))  # from the stop to the end of the job
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$(date +%s%N)
# Each rank's stderr goes straight to a file of its own: what mpirun
# forwards can lose a killed rank's last lines when it ends the job.
out=$(GYRE_OP_TIMEOUT_S=$deadline_s timeout 120 "$mpiexec" -n "$np" "$@" \
      bash -c 'exec "$0" stop "$1" 2>"$2/stderr.$OMPI_COMM_WORLD_RANK"' "$exe" "$delay_us" "$logs" 2>&1)
status=$?
end_ms=$(date +%s%3N)
for r in $(seq 0 $((np - 1))); do out+=$'\n'$(cat "$logs/stderr.$r" 2>/dev/null); done
stop_ms=$(sed -n 's/^rank 1 stops at \([0-9]*\) ms$/\1/p' <<<"$out" | head -1)
elapsed_ms=$(( end_ms - ${stop_ms:-$((start / 1000000))} ))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
echo "$out" | tail -n 30
echo "exit status: $status, ${elapsed}s after rank 1 stopped (GYRE_OP_TIMEOUT_S=$deadline_s, GYRE_SHM=${GYRE_SHM:-1})"
failed=""
fail() { echo "FAIL: $*"; failed=1; }
[ -n "$stop_ms" ] || fail "rank 1 did not report when it stopped"
# Whatever else happens, nothing of the job may stay behind: a process left
# stopped would hold its memory and shared-memory mappings for ever.
pids=$(sed -n 's/^rank [0-9]* pid \([0-9]*\)$/\1/p' <<<"$out")
[ "$(wc -w <<<"$pids")" -eq "$np" ] || fail "not every rank reported its pid"
alive() {  # alive PID: prints its state unless it is gone or a zombie
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null | tr -d ' ')
  [ -n "$st" ] && [[ "$st" != Z* ]] && echo "$st"
}
for pid in $pids; do
  # A zombie (state Z) has ended and freed everything; its parent, mpirun,
  # is gone, and whoever adopted it may not reap it at once. mpirun may
  # return while a rank it continued and terminated is still running its
  # last instructions (seen once: state R right after the job ended), so a
  # rank gets up to 5 s to go; a stopped one (state T) never would.
  state=$(alive "$pid")
  for _ in $(seq 50); do
    [ -n "$state" ] && [[ "$state" != T* ]] || break
    sleep 0.1
    state=$(alive "$pid")
  done
  if [ -n "$state" ]; then
    fail "process $pid of the job is still there after the job ended (state $state)"
    kill -CONT "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null
  fi
done
[ "$status" -ne 0 ] || fail "the job exited 0 although rank 1 stopped"
[ "$status" -ne 124 ] || fail "the job did not end within 120 s"
(( elapsed_ms < bound_s * 1000 )) || fail "the job ended ${elapsed}s after the stop (bound ${bound_s}s)"
(( elapsed_ms >= deadline_s * 1000 )) || fail "the job ended before the deadline: not by it"
for r in $(seq 0 $((np - 1))); do
  [ "$r" -eq 1 ] && continue
  line=$(grep "^\[gyre $r ERROR\] timed out during" <<<"$out" | head -1)
  [ -n "$line" ] || { fail "rank $r did not log the deadline error"; continue; }
  grep -q "GYRE_OP_TIMEOUT_S=$deadline_s" <<<"$line" || fail "rank $r's error does not name the deadline"
  # Whom it waited for: over shared memory, the stopped rank itself; over
  # MPI (negotiation, or the ring with GYRE_SHM=0), its ring predecessor,
  # so that the lines form a chain back to the stopped rank.
  if grep -q "shared memory group" <<<"$line"; then
    grep -qE "local rank\(s\) ([0-9]+, )*1(, [0-9]+)* to reach" <<<"$line" ||
      fail "rank $r's error does not name rank 1: $line"
  else
    # Or the stopped rank itself: a rank blocked sending a message too
    # large to go eagerly to its successor, rank 1, names that rank, and a
    # log-depth negotiation round (dissemination at these 3 ranks: step k
    # receives from rank r - 2^k; at a power of two it would be r XOR 2^k)
    # may wait on rank 1 directly.
    pred=$(( (r + np - 1) % np ))
    grep -qE "(from|to) rank $pred |(from|to) rank 1 " <<<"$line" ||
      fail "rank $r's error names neither its predecessor $pred nor rank 1: $line"
  fi
done
grep -qE "^\[gyre [0-9]+ ERROR\] timed out during.*(from rank 1 |local rank\(s\) 1 )" <<<"$out" ||
  fail "no rank's error names rank 1 as the one it waited for"
[ -z "$failed" ] || exit 1
echo "PASS: job ended with status $status ${elapsed}s after rank 1 stopped, every other rank logged the deadline, nothing left"
