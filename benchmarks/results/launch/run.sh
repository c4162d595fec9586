#!/bin/bash
# Open MPI 4.1 (build/) against MPICH 5.0.2 (build-mpich/cxx/), 2 ranks, alternating.
cd /work/main
source scripts/env.sh
out=/tmp/bench-mpi; mkdir -p $out
ompi() { mpirun -np 2 build/benchmarks/gyre-allreduce-perf "$@"; }
mpich() { ( export PATH=/opt/gyre-mpich/bin:$PATH; unset LD_LIBRARY_PATH; for v in $(env | sed -n 's/^\(OMPI_[A-Za-z0-9_]*\)=.*/\1/p'); do unset $v; done; /opt/gyre-mpich/bin/mpiexec -n 2 build-mpich/cxx/benchmarks/gyre-allreduce-perf "$@" ); }
for r in 1 2; do
  for m in ompi mpich; do
    echo "== $m latency.$r"; $m --latency > $out/$m.latency.$r.txt 2>&1; tail -3 $out/$m.latency.$r.txt
    echo "== $m sweep.$r"; $m --runtime -b 8 -e 64M -f 8 --blocks 3 > $out/$m.sweep.$r.txt 2>&1; cat $out/$m.sweep.$r.txt | tail -14
    echo "== $m resnet50.$r"; $m --gradients benchmarks/data/resnet50_sizes.txt > $out/$m.resnet.$r.txt 2>&1; tail -8 $out/$m.resnet.$r.txt
  done
done
