# Sourced by the scripts: where the build goes, and what Open MPI needs here.
GYRE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GYRE_BUILD=${GYRE_BUILD:-$GYRE_ROOT/build}
# Tests and examples run up to 4 ranks on 2 cores, possibly as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
jobs=$(nproc 2>/dev/null || echo 2)

gyre_build() {
  cmake -S "$GYRE_ROOT" -B "$GYRE_BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$GYRE_BUILD" -j "$jobs"
}
