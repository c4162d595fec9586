#!/usr/bin/env bash
# scripts/test.sh's EXIT trap (it stops the background sanitizer builds) must
# leave the suite's exit status alone: whether the background job still runs,
# has ended, or has ended and been reaped, a passing suite exits 0 and a
# failing one keeps its status. The trap line is taken from test.sh itself.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
trap_line=$(grep -E "^trap '.*bg_pid.*' EXIT$" "$root/scripts/test.sh")
[ -n "$trap_line" ] || { echo "no EXIT trap on bg_pid in scripts/test.sh"; exit 1; }
fails=0
run_case() {  # run_case NAME JOB WAIT_FIRST EXIT_CODE
  local name=$1 job=$2 reap=$3 want=$4 rc
  bash -c "set -euo pipefail
    source '$root/scripts/env.sh'
    $job & bg_pid=\$!
    $reap
    $trap_line
    exit $want" >/dev/null 2>&1
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $name: exit $rc, expected $want"; fails=$((fails + 1))
  else
    echo "ok   $name: exit $rc"
  fi
}
run_case "job ended and reaped, suite passed" true 'wait $bg_pid' 0
run_case "job ended and reaped, suite failed" true 'wait $bg_pid' 1
run_case "job still running, suite passed" 'sleep 300' ':' 0
run_case "job still running, suite failed (status 3)" 'sleep 300' ':' 3
exit "$fails"
