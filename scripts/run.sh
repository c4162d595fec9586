#!/usr/bin/env bash
# Set-up, build, and the main job: gyre's collectives over mpirun -np 2 with a
# short bandwidth table beside MPI_Allreduce.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
source "$here/env.sh"
gyre_build
mpirun -np 2 "$GYRE_BUILD/benchmarks/gyre-allreduce-perf" -b 1K -e 64M -f 4 "$@"
