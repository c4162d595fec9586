#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, builds a separate project
# against it with find_package(gyre CONFIG REQUIRED), and runs it on 2 ranks.
# usage: check_package.sh <gyre build dir> <consumer source dir> <scratch dir> <mpiexec> <mpiexec flags...>
set -euo pipefail
build=$1 src=$2 scratch=$3 mpiexec=$4
shift 4
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$src" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/build" >/dev/null
"$mpiexec" -n 2 "$@" "$scratch/build/consumer"
