#!/usr/bin/env bash
# Round 3 of the alternating before (cb21ce7) / after (92fa955) runs of benchmarks/run_all.sh.
# "after" is a worktree of 92fa955 whose C++ is /work/main/build-ab (built from 92fa955's
# sources), as in rounds 1 and 2.
set -u
out=/work/main/benchmarks/results/refactor-ab-runall
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
r=3
for v in before after; do
  if [ $v = before ]; then t=/work/wt-cb21; b=/work/wt-cb21/build-ab; else t=/work/wt-92fa; b=/work/main/build-ab; fi
  echo "== $v round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git -C $t rev-parse --short HEAD)" | tee -a $out/log.txt
  (cd $t && PYTHONPATH=$t/bindings/python GYRE_BUILD=$b REPS=1 bash benchmarks/run_all.sh $out/$v.$r > $out/$v.$r.log 2>&1)
done
echo "done $(date -u +%H:%M:%S)" | tee -a $out/log.txt
