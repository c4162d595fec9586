#!/usr/bin/env bash
# Rounds run by waiting callers (GYRE_CALLER_ROUNDS) against the background
# thread alone, the same build, alternating: the 8-byte latency, a sweep of
# small sizes through the runtime, and the ResNet-50 gradient set, 3 rounds.
# Usage: bash benchmarks/results/caller-rounds/run.sh [BUILD]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${1:-$root/build}
out=$(dirname "$0")
perf=$build/benchmarks/gyre-allreduce-perf
mpi=(mpirun --oversubscribe --allow-run-as-root -np 2)
for round in 1 2 3; do
  for cr in 1 0; do
    tag="cr$cr.round$round"
    echo "== $tag $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/log.txt"
    "${mpi[@]}" -x GYRE_CALLER_ROUNDS=$cr "$perf" --latency -n 3000 > "$out/latency.$tag.txt" 2>&1
    "${mpi[@]}" -x GYRE_CALLER_ROUNDS=$cr "$perf" --runtime -b 8 -e 64K -f 4 -n 200 --blocks 5 \
      > "$out/sweep.$tag.txt" 2>&1
    "${mpi[@]}" -x GYRE_CALLER_ROUNDS=$cr "$perf" --gradients "$root/benchmarks/data/resnet50_sizes.txt" \
      -n 20 > "$out/resnet50.$tag.txt" 2>&1
  done
done
