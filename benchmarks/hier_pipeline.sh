#!/usr/bin/env bash
# The hierarchical allreduce pipelined (pieces chosen by the cost model with
# its built-in parameters, and with the parameters GYRE_LINK_PROBE=1
# measures) against unpipelined and the flat ring, through the runtime, on 2
# simulated hosts x 2 ranks over 1 Gbit/s links (scripts/hosts.sh; needs
# root). Rounds alternate the systems so that noise hits each;
# MPI_Allreduce is timed beside each run.
#
#   bash benchmarks/hier_pipeline.sh OUT_DIR [ROUNDS]     (build: $GYRE_BUILD, default build)
set -euo pipefail
out=${1:?usage: hier_pipeline.sh OUT_DIR [ROUNDS]}
rounds=${2:-2}
build=${GYRE_BUILD:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export GYRE_HOSTS_RATE=${GYRE_HOSTS_RATE:-1gbit} GYRE_HOSTS_QUEUE_MS=${GYRE_HOSTS_QUEUE_MS:-50}
sweep=("$here/$build/benchmarks/gyre-allreduce-perf" --runtime -b 1M -e 64M -f 4 -w 1 -n 3 --blocks 3)
for ((r = 1; r <= rounds; r++)); do
  for sys in pipelined probed unpipelined flat; do
    case $sys in
      pipelined) env=(GYRE_HIERARCHICAL_ALLREDUCE=1 GYRE_HIERARCHICAL_PIPELINE=-1) ;;
      probed) env=(GYRE_HIERARCHICAL_ALLREDUCE=1 GYRE_HIERARCHICAL_PIPELINE=-1 GYRE_LINK_PROBE=1
                   GYRE_LOG_LEVEL=info) ;;
      unpipelined) env=(GYRE_HIERARCHICAL_ALLREDUCE=1 GYRE_HIERARCHICAL_PIPELINE=1) ;;
      flat) env=(GYRE_HIERARCHICAL_ALLREDUCE=0) ;;
    esac
    echo "== $GYRE_HOSTS_RATE $sys run $r load $(cat /proc/loadavg)" | tee -a "$out/sweeps.txt"
    env "${env[@]}" bash "$here/scripts/hosts.sh" run 2 2 "${sweep[@]}" \
      2>&1 | grep -E '^ +[0-9]|Wrong|link parameters' | tee -a "$out/sweeps.txt"
  done
done
