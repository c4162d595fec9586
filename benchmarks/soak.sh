#!/usr/bin/env bash
# The long soak (tests/core/soak.cc): 3 ranks, 20,000 steps of the mixed
# gradient set, every result checked, RSS after step 1,000 and at the end
# (growth bounded), the response-cache hit rate. Figures: docs/benchmarks.md.
#
#   GYRE_BUILD=build bash benchmarks/soak.sh [STEPS]
#
# Needs a build with -DGYRE_BUILD_TESTS=ON (the program is a test binary;
# CTest runs it with 1,000 steps as core_soak_np3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../scripts/env.sh"
steps=${1:-20000}
soak=$GYRE_BUILD/tests/core/gyre_core_soak
[ -x "$soak" ] || { echo "soak: $soak not built (configure with -DGYRE_BUILD_TESTS=ON)" >&2; exit 1; }
echo "load before: $(cat /proc/loadavg)"
start=$(date +%s.%N)
mpirun -np 3 "$soak" --steps "$steps" --warmup 1000
echo "wall time with start-up: $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
echo "load after: $(cat /proc/loadavg)"
