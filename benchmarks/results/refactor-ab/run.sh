#!/usr/bin/env bash
# Alternating before/after runs of the runtime's allreduce sweep and the gradient sets.
set -u
out=/work/main/benchmarks/results/refactor-ab
mkdir -p $out
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for r in 1 2 3; do
  for v in before after; do
    if [ $v = before ]; then b=/work/wt-before/build; else b=/work/main/build; fi
    perf=$b/benchmarks/gyre-allreduce-perf
    echo "== $v run $r load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/log.txt
    mpirun -np 2 $perf --runtime -b 8 -e 64M -f 4 > $out/sweep-runtime.$v.$r.txt 2>&1
    mpirun -np 2 $perf --gradients /work/main/benchmarks/data/bert_base_sizes.txt > $out/gradients-bert_base.$v.$r.txt 2>&1
    mpirun -np 2 $perf --gradients /work/main/benchmarks/data/resnet50_sizes.txt > $out/gradients-resnet50.$v.$r.txt 2>&1
  done
done
echo done | tee -a $out/log.txt
