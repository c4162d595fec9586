#!/usr/bin/env bash
# Set-up, build, and the main job: gyre's allreduce as users get it (through
# the runtime: negotiation, fusion, shared memory within the host) over
# mpirun -np 2, a bandwidth table beside MPI_Allreduce and the machine's
# single-copy bound measured in the same run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
source "$here/env.sh"
gyre_build
mpirun -np 2 "$GYRE_BUILD/benchmarks/gyre-allreduce-perf" -b 1K -e 64M -f 4 --runtime --bound "$@"
