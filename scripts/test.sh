#!/usr/bin/env bash
# Set-up, build and the whole test suite: C++ unit tests, MPI tests (2-4 ranks).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
source "$here/env.sh"
gyre_build
cd "$GYRE_BUILD"
ctest --output-on-failure -j "$jobs" --timeout 600
