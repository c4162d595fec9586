# Alternating A/B of the 8-byte allreduce through the runtime, 2 ranks:
# OLD = a build of the commit before the change, NEW = this tree's build.
cd /work/main
OLD=${OLD:-/tmp/ab-old/build}; NEW=${NEW:-build}
out=benchmarks/results/latency-allocs
for round in 1 2 3; do
  for which in old new; do
    b=$OLD; [ $which = new ] && b=$NEW
    echo "== round $round $which $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    mpirun --oversubscribe --allow-run-as-root -np 2 $b/tests/core/gyre_core_latency_probe 5000 2>&1 | grep -a median
    mpirun --oversubscribe --allow-run-as-root -np 2 $b/benchmarks/gyre-allreduce-perf --latency -n 3000 2>&1 | grep -a "gyre runtime\|MPI_Allreduce"
  done
done
