#!/usr/bin/env bash
# Usage: scripts/exit_soak.sh [JOBS] [PYTHON]
# Runs JOBS (default 200) consecutive torch.distributed jobs on the gyre
# backend under mpirun -np 2 (tests/python/exit_job.py: three all_reduce
# calls, then exit), cycling through four variants: plain, with
# destroy_process_group(), with a torch future callback still running
# Python on gyre's callback thread as the main thread exits, and with a
# PartialLocalSGD left without close() (its aggregator thread running). Counts the jobs
# that abort at interpreter exit (SIGABRT, "terminate called", mpirun exit
# 134) and the other failures; exits 1 if any job failed. Each job is bounded
# by a 120 s timeout.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
jobs=${1:-200}
python=${2:-python3}
mpiexec=${MPIEXEC:-mpirun}
variants=("" "--destroy" "--busy-callback" "--partial-local-sgd")
aborts=0 others=0
declare -A per_variant
start=$(date +%s)
for ((i = 0; i < jobs; i++)); do
  v=${variants[i % ${#variants[@]}]}
  out=$(timeout 120 "$mpiexec" -n 2 "$python" "$root/tests/python/exit_job.py" $v 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] && continue
  if [ "$rc" -eq 134 ] || grep -qE "terminate called|Aborted|signal 6" <<<"$out"; then
    aborts=$((aborts + 1))
    per_variant["${v:-plain}"]=$(( ${per_variant["${v:-plain}"]:-0} + 1 ))
  else
    others=$((others + 1))
  fi
  echo "job $i (${v:-plain}) exit $rc:"
  tail -n 5 <<<"$out" | sed 's/^/  /'
done
summary=""
for k in "${!per_variant[@]}"; do summary+=" $k=${per_variant[$k]}"; done
echo "exit soak: $jobs jobs in $(( $(date +%s) - start )) s: $aborts aborted at exit" \
     "(${summary# }), $others other failures"
[ "$aborts" -eq 0 ] && [ "$others" -eq 0 ]
