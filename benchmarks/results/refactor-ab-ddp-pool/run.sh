#!/usr/bin/env bash
# Alternating before (cb21ce7) / after (main) runs of ddp_step.py (cnn, mlp), 3 each.
set -u
out=/work/main/benchmarks/results/refactor-ab-ddp-pool
mkdir -p $out
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for r in 1 2 3; do
  for v in before after; do
    if [ $v = before ]; then t=/work/wt-cb21; else t=/work/main; fi
    echo "== $v run $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git -C $t rev-parse --short HEAD)" | tee -a $out/log.txt
    (cd $t && mpirun -np 2 -x PYTHONPATH=$t/bindings/python python3 benchmarks/ddp_step.py --models cnn,mlp > $out/ddp_step.$v.$r.txt 2>&1)
  done
done
echo "done $(date -u +%H:%M:%S)" | tee -a $out/log.txt
