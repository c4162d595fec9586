#!/usr/bin/env bash
# Issue 23's measurements again on a quiet machine (the first set, in
# benchmarks/results/store/, ran at load 4-12 from other jobs): push/pull
# against MPI_Allreduce (3 runs), the straggler at 2 and 3 ranks (3 runs
# each), and the convergence comparison (3 data seeds), the same commands as
# docs/training-modes.md gives. Nothing else running; log.txt has the load
# before each run. GYRE_BUILD: the tree with gyre-store-perf (default build/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
source "$root/scripts/env.sh"
log=$here/log.txt
: > "$log"
note() { echo "$1: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"; }
cd "$root"
for r in 1 2 3; do
  note "perf run $r"
  mpirun -np 2 "$GYRE_BUILD/benchmarks/gyre-store-perf" > "$here/perf_np2_run$r.txt"
done
for np in 2 3; do
  for r in 1 2 3; do
    note "straggler np$np run $r"
    { echo "# command: mpirun -np $np python3 benchmarks/async_training.py --steps 200 --runs both"
      echo "# load average before: $(cat /proc/loadavg)"
      mpirun -np "$np" python3 benchmarks/async_training.py --steps 200 --runs both
    } > "$here/async_straggler_np${np}_run$r.txt" 2>&1
  done
done
for seed in 0 1 2; do
  note "convergence seed $seed"
  mpirun -np 2 python3 benchmarks/async_training.py --steps 300 --async-factor 2 --runs fast \
    --lrs 0.0125,0.025,0.05 --seed "$seed" --curves "$here/async_convergence_np2_seed$seed.json" \
    > "$here/async_convergence_np2_seed$seed.txt" 2>&1
done
python3 benchmarks/async_convergence_summary.py "$here"/async_convergence_np2_seed{0,1,2}.json \
  > "$here/async_convergence_summary.txt" 2>&1
note "done"
