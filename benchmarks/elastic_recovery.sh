#!/usr/bin/env bash
# Recovery time of elastic training (docs/elastic.md): failure to the first
# step completed after it, for 2->1, 3->2 and 4->3 ranks, several runs each.
# Runs tests/elastic/elastic_kill.cc (16 steps of a 2 MiB int64 allreduce,
# committing every step; rank 1 SIGKILLs itself right after submitting the
# allreduce of step 7) under `mpirun --with-ft ulfm`, from the ULFM build of
# scripts/elastic.sh (run that first). A run's recovery time is from the
# killed rank's timestamp just before SIGKILL to the latest survivor's
# timestamp when it completed its first step after the rebuild (both from
# CLOCK_MONOTONIC, common to the processes of one host): it includes the
# detection of the failure, the revoke, shrink and agreement, the broadcast
# of the 2 MiB state from the agreed rank, and the step redone.
#
# Usage: benchmarks/elastic_recovery.sh [RUNS]   (default 5 runs per size)
#   GYRE_ULFM_VENV, GYRE_ULFM_BUILD as for scripts/elastic.sh
# Not part of the tests (timings on a shared machine are noisy).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
venv=${GYRE_ULFM_VENV:-$root/.venv-ulfm}
build=${GYRE_ULFM_BUILD:-$root/build-ulfm}
runs=${1:-5}
bin=$build/tests/elastic/gyre_elastic_kill
[ -x "$bin" ] && [ -x "$venv/bin/mpirun" ] || {
  echo "elastic_recovery.sh: no $bin or $venv/bin/mpirun: run scripts/elastic.sh first" >&2; exit 1; }
export PATH="$venv/bin:$PATH"
unset LD_LIBRARY_PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
status=0
for np in 2 3 4; do
  times=()
  for ((r = 0; r < runs; ++r)); do
    out=$(timeout 120 "$venv/bin/mpirun" --with-ft ulfm -n "$np" --oversubscribe "$bin" 2>&1)
    killed=$(sed -n 's/^elastic: rank [0-9]* killed at \([0-9]*\)$/\1/p' <<<"$out" | head -1)
    last=$(sed -n 's/^elastic: rank [0-9]* recovered at \([0-9]*\)$/\1/p' <<<"$out" | sort -n | tail -1)
    passed=$(grep -cE "^elastic: rank [0-9]+ PASS" <<<"$out")
    if [ -z "$killed" ] || [ -z "$last" ] || [ "$passed" -ne $((np - 1)) ]; then
      echo "np $np run $r: FAILED ($passed survivors passed)"; tail -n 20 <<<"$out"; status=1; continue
    fi
    times+=("$(( (last - killed) / 1000 ))")  # microseconds
  done
  [ "${#times[@]}" -gt 0 ] || continue
  printf '%s\n' "${times[@]}" | sort -n | awk -v np="$np" '
    { t[NR] = $1 / 1000.0 }
    END {
      med = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
      s = ""; for (i = 1; i <= NR; ++i) s = s sprintf(" %.1f", t[i])
      printf "%d -> %d ranks: %d runs, recovery median %.1f ms, max %.1f ms (all:%s)\n",
             np, np - 1, NR, med, t[NR], s
    }'
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at end"
exit "$status"
