#!/usr/bin/env bash
# Rewrites the seed corpus in tests/fuzz/corpus/ from real encoded messages
# (make_corpus.cc). Needs clang (the fuzz project's compiler):
#   bash tests/fuzz/make_corpus.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-fuzz}
cxx=${CXX:-clang++-14}
cmake -S "$here" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target make_corpus -j 2
rm -rf "$here/corpus"
"$build/make_corpus" "$here/corpus"
