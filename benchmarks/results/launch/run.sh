#!/bin/bash
# How the tables beside this script were made (docs/launch.md, "MPICH or Open
# MPI"): gyre-allreduce-perf built against Open MPI 4.1 (build/, mpirun) and
# against the MPICH wheel (build-mpich/cxx/, that MPICH's mpiexec; configure it
# with -DMPI_C_COMPILER=$venv/bin/mpicc -DMPI_CXX_COMPILER=$venv/bin/mpicxx
# -DGYRE_BUILD_BENCHMARKS=ON), 2 ranks, the two alternating twice.
#   bash benchmarks/results/launch/run.sh OUT
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
source scripts/env.sh
venv=${GYRE_MPICH_VENV:-$root/.venv-mpich}
out=${1:-/tmp/bench-mpi}; mkdir -p "$out"
ompi() { mpirun -np 2 build/benchmarks/gyre-allreduce-perf "$@"; }
mpich() { ( export PATH="$venv/bin:$PATH"; unset LD_LIBRARY_PATH
            for v in $(env | sed -n 's/^\(OMPI_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
            "$venv/bin/mpiexec" -n 2 build-mpich/cxx/benchmarks/gyre-allreduce-perf "$@" ); }
for r in 1 2; do
  for m in ompi mpich; do
    $m --latency > "$out/$m.latency.$r.txt" 2>&1
    $m --runtime -b 8 -e 64M -f 8 --blocks 3 > "$out/$m.sweep.$r.txt" 2>&1
    $m --gradients benchmarks/data/resnet50_sizes.txt > "$out/$m.resnet.$r.txt" 2>&1
  done
done
