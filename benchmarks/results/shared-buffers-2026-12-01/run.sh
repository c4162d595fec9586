#!/usr/bin/env bash
# The runtime's allreduce on private buffers against buffers from
# gyre::alloc_shared, with the machine's bound, 2 ranks, alternated in 3
# rounds (raw: private.N.txt, shared.N.txt). From the repository root:
#   bash benchmarks/results/shared-buffers-2026-12-01/run.sh build
set -euo pipefail
build=${1:-build}
out=$(dirname "$0")
export GYRE_SHM_POOL_BYTES=64M
for i in 1 2 3; do
  for m in private shared; do
    flag=""; [ "$m" = shared ] && flag=--shared-buffers
    { echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load: $(cut -d' ' -f1-3 /proc/loadavg)"
      mpirun --allow-run-as-root -np 2 -x GYRE_SHM_POOL_BYTES "$build/benchmarks/gyre-allreduce-perf" \
        --runtime $flag --bound -b 64K -e 64M -f 4 -w 3 -n 10 --blocks 5
    } >"$out/$m.$i.txt" 2>&1
  done
done
