#!/usr/bin/env bash
# Optional peer benchmark: Intel oneCCL's allreduce beside MPI_Allreduce and
# gyre's runtime allreduce, 2 ranks, float32 sum, 8 B .. 64 MiB by default.
#
#   bash benchmarks/oneccl/run.sh [OUT]          # OUT: default bench-results/oneccl
#
# Two ways to time gyre:
#   GYRE_PREFIX=<an installed gyre>   (cmake --install BUILD --prefix PREFIX)
#       one job times all three (ccl-allreduce-gyre, CMakeLists.txt here):
#       every ratio from the same run; table in OUT/oneccl-gyre.txt.
#   otherwise                         ccl-allreduce times oneCCL beside
#       MPI_Allreduce in one job, gyre-allreduce-perf --runtime (from
#       GYRE_BUILD) gyre beside MPI_Allreduce in the next; compare.py puts the
#       two side by side (gyre/oneCCL then spans two jobs).
#
# oneCCL is installed here at run time from the Python package registry into
# a venv of its own; gyre neither builds against it nor ships it (Intel
# Simplified Software License), and CI never runs this script.
#
# Environment:
#   GYRE_ONECCL_VENV   the venv (default /opt/gyre-oneccl); made when missing
#   ONECCL_VERSION     default 2022.1.2
#   GYRE_PREFIX        an installed gyre: time it in the oneCCL job
#   GYRE_BUILD         otherwise gyre's build folder, for
#                      benchmarks/gyre-allreduce-perf (default: build/ here)
#   SKIP_GYRE=1        oneCCL and MPI only
#   NP                 ranks (default 2)
#   SWEEP              sweep options for both programs (default "-b 8 -e 64M -f 2")
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../scripts/env.sh"
out=${1:-bench-results/oneccl}
venv=${GYRE_ONECCL_VENV:-/opt/gyre-oneccl}
version=${ONECCL_VERSION:-2022.1.2}
np=${NP:-2}
read -r -a sweep <<< "${SWEEP:--b 8 -e 64M -f 2}"
mkdir -p "$out"

# 1. The venv. oneccl-cpu-devel brings the headers and pulls oneccl-cpu (the
# CPU libccl.so.1) and impi-rt (Intel's libfabric and its providers, whose
# shm provider is the transport used below). The CPU libccl.so.1 needs
# libccl.so.2, which none of those wheels carries: the non-CPU `oneccl` wheel
# of the same version does. Installing that wheel would replace libccl.so.1
# with the GPU build (which needs the SYCL runtime), so only libccl.so.2 is
# taken from it.
if [ ! -f "$venv/include/oneapi/ccl.hpp" ] || [ ! -e "$venv/lib/libccl.so.1" ] || [ ! -e "$venv/lib/libccl.so.2" ]; then
  echo "run.sh: installing oneCCL $version into $venv" >&2
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q "oneccl-cpu-devel==$version"
  dl=$(mktemp -d)
  "$venv/bin/pip" download -q --no-deps "oneccl==$version" -d "$dl"
  python3 - "$dl"/oneccl-"$version"-*.whl "$venv/lib" <<'EOF'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if os.path.basename(n) in ("libccl.so.2", "libccl.so.2.0")]
    if not names:
        sys.exit(f"run.sh: no libccl.so.2 in {wheel}")
    for n in names:
        path = os.path.join(dest, os.path.basename(n))
        with z.open(n) as src, open(path, "wb") as dst:
            dst.write(src.read())
        os.chmod(path, 0o755)
EOF
  rm -rf "$dl"
fi

# 2. The program, against the venv's headers (-idirafter: Open MPI's mpi.h
# comes first) and libccl; the RPATH (not RUNPATH) lets libccl.so.1 find
# libccl.so.2 and its dlopen of libfabric.so.1 find Intel's, in the venv.
bin=$venv/bin/ccl-allreduce
if [ ! -x "$bin" ] || [ "$here/ccl_allreduce.cc" -nt "$bin" ]; then
  mpicxx -std=c++17 -O2 -Wall -Wextra -DOMPI_SKIP_MPICXX=1 -idirafter "$venv/include" \
    "$here/ccl_allreduce.cc" -o "$bin" "$venv/lib/libccl.so.1" \
    -Wl,--disable-new-dtags,-rpath,"$venv/lib" 2> >(grep -v 'may conflict with' >&2)
fi

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc: $(nproc)"
  lscpu | grep -E '^Model name' || true
  echo "mpirun: $(mpirun --version | head -1)"
  echo "oneCCL: $version ($venv)"
  echo "git: $(git -C "$here/../.." rev-parse --short HEAD)"
  if [ -n "${GYRE_PREFIX:-}" ]; then echo "gyre: installed in $GYRE_PREFIX (same job)"
  else echo "gyre: $GYRE_BUILD/benchmarks/gyre-allreduce-perf (next job)"; fi
  echo "load before: $(cat /proc/loadavg)"
} > "$out/machine.txt"

# 3. oneCCL's fastest setting on one host here: libfabric's shm provider
# (Intel's, FI_PROVIDER_PATH keeps other providers out), oneCCL's shared
# memory transport, and no worker thread (with the default worker thread a
# 1 KiB allreduce takes tens of ms on 2 cores).
mpiflags=(-np "$np" --oversubscribe --allow-run-as-root)
export CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm FI_PROVIDER_PATH=$venv/lib CCL_WORKER_OFFLOAD=0
export CCL_LOG_LEVEL=${CCL_LOG_LEVEL:-error}
# oneCCL says on stdout that CCL_LOG_LEVEL was changed, whatever the level.
quiet() { grep --line-buffered -v 'CCL_WARN| value of CCL_LOG_LEVEL changed' || true; }
cclenv=(-x CCL_ATL_TRANSPORT -x CCL_ATL_SHM -x FI_PROVIDER -x FI_PROVIDER_PATH -x CCL_WORKER_OFFLOAD -x CCL_LOG_LEVEL)
if [ -n "${GYRE_PREFIX:-}" ] && [ -z "${SKIP_GYRE:-}" ]; then
  # 3a. All three systems in one job.
  gbuild=$venv/build-gyre
  cmake -S "$here" -B "$gbuild" -DCMAKE_BUILD_TYPE=Release -DONECCL_ROOT="$venv" \
    -Dgyre_DIR="$GYRE_PREFIX/lib/cmake/gyre" > "$out/cmake.log"
  cmake --build "$gbuild" -j 2 2> >(grep -v 'may conflict with' >&2) >> "$out/cmake.log"
  echo "== oneccl-gyre: mpirun ${mpiflags[*]} ccl-allreduce-gyre ${sweep[*]}" | tee "$out/oneccl-gyre.txt"
  mpirun "${mpiflags[@]}" "${cclenv[@]}" "$gbuild/ccl-allreduce-gyre" "${sweep[@]}" \
    --json "$out/oneccl-gyre.json" | quiet | tee -a "$out/oneccl-gyre.txt"
  echo "load after: $(cat /proc/loadavg)" >> "$out/machine.txt"
  python3 "$here/compare.py" "$out/oneccl-gyre.json" | tee "$out/compare.md"
  exit 0
fi
echo "== oneccl: mpirun ${mpiflags[*]} ccl-allreduce ${sweep[*]}" | tee "$out/oneccl.txt"
mpirun "${mpiflags[@]}" "${cclenv[@]}" "$bin" "${sweep[@]}" --json "$out/oneccl.json" | quiet | tee -a "$out/oneccl.txt"
unset CCL_ATL_TRANSPORT CCL_ATL_SHM FI_PROVIDER FI_PROVIDER_PATH CCL_WORKER_OFFLOAD CCL_LOG_LEVEL

# 3b. gyre through the runtime, the same sizes, in the next job.
if [ -z "${SKIP_GYRE:-}" ]; then
  perf=$GYRE_BUILD/benchmarks/gyre-allreduce-perf
  [ -x "$perf" ] || { echo "run.sh: $perf not built (set GYRE_BUILD, or SKIP_GYRE=1)" >&2; exit 1; }
  echo "== gyre-runtime: mpirun ${mpiflags[*]} gyre-allreduce-perf --runtime ${sweep[*]}" | tee "$out/gyre-runtime.txt"
  mpirun "${mpiflags[@]}" "$perf" --runtime "${sweep[@]}" --json "$out/gyre-runtime.json" \
    | tee -a "$out/gyre-runtime.txt"
fi
echo "load after: $(cat /proc/loadavg)" >> "$out/machine.txt"

if [ -z "${SKIP_GYRE:-}" ]; then
  python3 "$here/compare.py" "$out/oneccl.json" "$out/gyre-runtime.json" | tee "$out/compare.md"
fi
