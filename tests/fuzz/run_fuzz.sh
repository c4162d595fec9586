#!/usr/bin/env bash
# Builds the libFuzzer targets (clang) and runs each for a bounded time over
# the seed corpus in the tree; new inputs go to a temporary directory, not
# into the tree. Exits non-zero on any finding (the crashing input is left
# in the build directory, named crash-*), 77 when no clang is installed.
#   bash tests/fuzz/run_fuzz.sh [BUILD_DIR] [SECONDS_PER_TARGET] [all|build|run]
# "build" only builds the targets, "run" only runs those already built
# (scripts/test.sh builds them in the background, ahead of running them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-fuzz}
seconds=${2:-30}
mode=${3:-all}
cxx=${CXX:-clang++-14}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "run_fuzz: $cxx not found (apt-get install clang-14 libclang-rt-14-dev): skipped"
  exit 77
fi
if [ "$mode" != run ]; then
  cmake -S "$here" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" --target fuzz_message fuzz_coordinator -j 2
fi
[ "$mode" = build ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for target in message coordinator; do
  mkdir -p "$work/$target"
  echo "== fuzz_$target: ${seconds} s over tests/fuzz/corpus/$target"
  # -rss_limit_mb/-malloc_limit_mb: a message must never make the decoder
  # allocate beyond its own length (messages here are at most 64 KiB).
  (cd "$build" && "./fuzz_$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 \
      "$work/$target" "$here/corpus/$target" 2>&1 | tail -n 25) || status=1
done
exit "$status"
