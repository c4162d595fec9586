#!/usr/bin/env bash
# The benchmarks on simulated hosts (scripts/hosts.sh: a network namespace per
# host, veth links shaped by tc tbf to GYRE_HOSTS_RATE, default 10gbit), REPS
# times (default 3), each run's table (.txt) and rows (.json) kept in OUT
# (default bench-multihost/). Two uses, both read by benchmarks/cost_model.py:
#
#   calibration (the cost model's parameters):
#     2x1 bare sweep: the flat ring between two hosts (network alpha, beta)
#     1x2 shm sweep:  the shared-memory allreduce (shared-memory alpha, beta)
#     latency at 1x2, 2x1, 2x2: the runtime's 8-byte latency beside the bare
#                     collective's (the negotiation round's cost)
#   the shaped-link comparison, 2 hosts x 2 ranks:
#     sweep-flat:  the bare flat ring over the 4 ranks, beside MPI_Allreduce
#     sweep-hier:  the runtime with GYRE_HIERARCHICAL_ALLREDUCE=1, beside MPI
#     sweep-rtflat: the runtime with GYRE_HIERARCHICAL_ALLREDUCE=0, beside MPI
#     gradients-{resnet50,bert_base}.{hier,flat}: the gradient sets
#     torch: gyre.torch beside torch.distributed gloo (SKIP_TORCH=1: not run)
#
#   GYRE_BUILD=build REPS=3 bash benchmarks/multihost_bench.sh bench-multihost
#   ONLY="sweep-hier sweep-flat" ...: just those runs; FIRST_REP=N: number the
#   runs from N (to add runs to an earlier OUT)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../scripts/env.sh"
out=${1:-bench-multihost}
reps=${REPS:-3}
first=${FIRST_REP:-1}
perf=$GYRE_BUILD/benchmarks/gyre-allreduce-perf
hosts_sh="$here/../scripts/hosts.sh"
py=${PYTHON:-python3}
mkdir -p "$out"
[ -x "$perf" ] || { echo "multihost_bench: $perf not built" >&2; exit 1; }
why=$(bash "$hosts_sh" check) || { echo "multihost_bench: $why" >&2; exit 77; }

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc: $(nproc)"
  echo "link: tc tbf ${GYRE_HOSTS_RATE:-10gbit} on veth pairs to a bridge (scripts/hosts.sh)"
  echo "mpirun: $(mpirun --version | head -1)"
  echo "git: $(git -C "$here/.." rev-parse --short HEAD)"
  echo "load before: $(cat /proc/loadavg)"
} > "$out/machine.txt"

wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

# run NAME HOSTS SLOTS [VAR=VALUE...] -- ARGS...: one gyre-allreduce-perf run.
run() {
  local name=$1 hosts=$2 slots=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  wanted "$name" || return 0
  echo "== $name.$r: ${hosts}x${slots} ${envs[*]} gyre-allreduce-perf $*" | tee "$out/$name.$r.txt"
  env "${envs[@]}" timeout 900 bash "$hosts_sh" run "$hosts" "$slots" "$perf" "$@" \
    --json "$out/$name.$r.json" 2>&1 | grep -v 'setpgid' | tee -a "$out/$name.$r.txt"
}

for r in $(seq "$first" "$reps"); do
  # Calibration.
  run cal-net 2 1 GYRE_HIERARCHICAL_ALLREDUCE=0 -- -b 8 -e 8M -f 4
  run cal-shm 1 2 GYRE_HIERARCHICAL_ALLREDUCE=0 -- --shm -b 8 -e 8M -f 4
  run latency-1x2 1 2 GYRE_HIERARCHICAL_ALLREDUCE=-1 -- --latency -n 300
  run latency-2x1 2 1 GYRE_HIERARCHICAL_ALLREDUCE=-1 -- --latency -n 300
  run latency-2x2 2 2 GYRE_HIERARCHICAL_ALLREDUCE=1 -- --latency -n 300
  # The comparison on 2 hosts x 2 ranks.
  run sweep-flat 2 2 GYRE_HIERARCHICAL_ALLREDUCE=0 -- -b 1K -e 64M -f 4
  run sweep-hier 2 2 GYRE_HIERARCHICAL_ALLREDUCE=1 -- --runtime -b 1K -e 64M -f 4
  run sweep-rtflat 2 2 GYRE_HIERARCHICAL_ALLREDUCE=0 -- --runtime -b 1K -e 64M -f 4
done
# The gradient sets and torch after every sweep (they take longest).
for r in $(seq "$first" "$reps"); do
  for set in resnet50 bert_base; do
    run "gradients-$set-hier" 2 2 GYRE_HIERARCHICAL_ALLREDUCE=1 -- --gradients "$here/data/${set}_sizes.txt" -w 1 -n 3
    run "gradients-$set-flat" 2 2 GYRE_HIERARCHICAL_ALLREDUCE=0 -- --gradients "$here/data/${set}_sizes.txt" -w 1 -n 3
  done
  if [ -z "${SKIP_TORCH:-}" ] && wanted torch; then
    echo "== torch.$r: 2x2 gyre.torch (hierarchical) beside gloo" | tee "$out/torch.$r.txt"
    GYRE_BENCH_MASTER_ADDR=host0 GLOO_SOCKET_IFNAME=eth0 GYRE_HIERARCHICAL_ALLREDUCE=1 \
      timeout 900 bash "$hosts_sh" run 2 2 "$py" "$here/torch_allreduce_perf.py" -b 1K -e 64M -f 4 \
      --json "$out/torch.$r.json" 2>&1 | grep -v 'setpgid' | tee -a "$out/torch.$r.txt"
  fi
done
echo "load after: $(cat /proc/loadavg)" >> "$out/machine.txt"
