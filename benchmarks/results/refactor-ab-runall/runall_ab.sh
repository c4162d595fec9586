#!/usr/bin/env bash
# Alternating before (cb21ce7) / after (main) runs of benchmarks/run_all.sh, one rep each, 3 rounds.
set -u
out=/work/main/benchmarks/results/refactor-ab-runall
mkdir -p $out
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for r in $(seq 1 ${ROUNDS:-3}); do
  for v in before after; do
    if [ $v = before ]; then t=/work/wt-cb21; else t=/work/main; fi
    echo "== $v round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git -C $t rev-parse --short HEAD)" | tee -a $out/log.txt
    (cd $t && PYTHONPATH=$t/bindings/python GYRE_BUILD=$t/build-ab REPS=1 bash benchmarks/run_all.sh $out/$v.$r > $out/$v.$r.log 2>&1)
  done
done
echo "done $(date -u +%H:%M:%S)" | tee -a $out/log.txt
