set -u
source /work/main/scripts/env.sh
export CCACHE_BASEDIR=/work
pybind=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())')
t=/work/wt-before
cmake -S $t -B $t/build-ab -DCMAKE_BUILD_TYPE=Release -DGYRE_BUILD_PYTHON=ON -DGYRE_BUILD_TESTS=OFF -DGYRE_BUILD_BENCHMARKS=OFF -DGYRE_BUILD_EXAMPLES=OFF -DGYRE_WITH_NCCL=OFF -Dpybind11_DIR=$pybind >/dev/null
cmake --build $t/build-ab -j2 --target _gyre 2>&1 | tail -1
ln -sf $(ls $t/build-ab/bindings/_gyre*.so) $t/bindings/python/gyre/
out=/work/main/benchmarks/results/refactor-ab-ddp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for r in 1 2; do
  for v in a894d97 after; do
    if [ $v = after ]; then tt=/work/main; else tt=$t; fi
    echo "== mlp $v run $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/log-bisect.txt
    (cd $tt && mpirun -np 2 -x PYTHONPATH=$tt/bindings/python python3 benchmarks/ddp_step.py --models mlp > $out/ddp_step_mlp.$v.b$r.txt 2>&1)
  done
done
echo done
