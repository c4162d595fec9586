#!/usr/bin/env bash
# The flat allreduce across 4 and 8 simulated hosts of one rank each, over
# 1 Gbit/s links (scripts/hosts.sh; needs root), each run beside
# MPI_Allreduce on the same data:
#   chosen       through the runtime, the algorithm the cost model chooses
#                per size (GYRE_RABENSEIFNER_ALLREDUCE=-1, the default:
#                recursive doubling up to GYRE_ALLREDUCE_SMALL_BYTES, then
#                Rabenseifner's or the ring; at 4 and 8 ranks Rabenseifner's)
#   ring         through the runtime, the ring forced (GYRE_RABENSEIFNER_ALLREDUCE=0)
#   bare-chosen  the same algorithms called directly (no runtime: no
#                negotiation round, no background thread), as the model
#                chooses them at 4 and 8 ranks (--large rabenseifner)
#   bare-ring    the ring called directly
# Rounds alternate the systems so that noise hits each. The model's
# predictions for the same layouts: python3 benchmarks/cost_model.py hosts.
# SYSTEMS="chosen ring" runs only those.
#
#   bash benchmarks/scale_hosts.sh OUT_DIR [ROUNDS] [HOSTS...]
#        (build: $GYRE_BUILD, default build; HOSTS default "4 8")
set -euo pipefail
out=${1:?usage: scale_hosts.sh OUT_DIR [ROUNDS] [HOSTS...]}
rounds=${2:-2}
shift $(( $# >= 2 ? 2 : 1 ))
host_counts=("$@")
[ ${#host_counts[@]} -gt 0 ] || host_counts=(4 8)
build=${GYRE_BUILD:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export GYRE_HOSTS_RATE=${GYRE_HOSTS_RATE:-1gbit} GYRE_HOSTS_QUEUE_MS=${GYRE_HOSTS_QUEUE_MS:-50}
perf="$here/$build/benchmarks/gyre-allreduce-perf"
sweep=(-b 16 -e 64M -f 4 -w 1 -n 3 --blocks 3)
read -r -a systems <<< "${SYSTEMS:-chosen ring bare-chosen bare-ring}"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  nproc: $(nproc)  git: $(git -C "$here" rev-parse --short HEAD)"
  echo "link: tc tbf $GYRE_HOSTS_RATE, queue ${GYRE_HOSTS_QUEUE_MS} ms (scripts/hosts.sh)"
  echo "sweep: gyre-allreduce-perf ${sweep[*]}; systems: ${systems[*]}"
} | tee -a "$out/sweeps.txt"
for ((r = 1; r <= rounds; r++)); do
  for hosts in "${host_counts[@]}"; do
    for sys in "${systems[@]}"; do
      case $sys in
        chosen) env=(GYRE_RABENSEIFNER_ALLREDUCE=-1); args=(--runtime) ;;
        ring) env=(GYRE_RABENSEIFNER_ALLREDUCE=0); args=(--runtime) ;;
        bare-chosen) env=(); args=(--large rabenseifner) ;;
        bare-ring) env=(); args=(--large ring) ;;
        *) echo "scale_hosts: unknown system $sys" >&2; exit 2 ;;
      esac
      echo "== ${hosts}x1 $sys run $r load $(cat /proc/loadavg)" | tee -a "$out/sweeps.txt"
      env "${env[@]}" bash "$here/scripts/hosts.sh" run "$hosts" 1 "$perf" "${args[@]}" "${sweep[@]}" \
        --json "$out/${hosts}x1-$sys.$r.json" \
        2>&1 | grep -E '^ +[0-9]|Wrong|bus bandwidth' | tee -a "$out/sweeps.txt"
    done
  done
done
