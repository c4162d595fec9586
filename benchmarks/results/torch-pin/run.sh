#!/usr/bin/env bash
# CPU torch tensors in flight, pinned (gyre._torch_memory) against copied
# (GYRE_TORCH_IN_FLIGHT=copy): the torch sweeps of benchmarks/run_all.sh
# (out of place, in place) and DDP's step, alternating the two ways, ROUNDS
# rounds (default 3), 2 ranks, nothing else running. Raw output beside this
# script; the table: python3 cmp.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
source "$root/scripts/env.sh"
rounds=${ROUNDS:-3}
log=$here/log.txt
: > "$log"
for ((r = 1; r <= rounds; r++)); do
  for mode in pin copy; do
    # The mode the extension actually uses (a gyre without gyre._torch_memory copies).
    used=$(GYRE_TORCH_IN_FLIGHT=$mode python3 -c 'import torch, gyre; from gyre import _gyre
torch.ones(1); print(_gyre._torch_in_flight_mode(), gyre.__file__)')
    echo "round $r $mode: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg); in use: $used" | tee -a "$log"
    for sweep in out inplace; do
      flag=(); [ "$sweep" = inplace ] && flag=(--in-place)
      GYRE_TORCH_IN_FLIGHT=$mode mpirun -np 2 -x GYRE_TORCH_IN_FLIGHT python3 \
        "$root/benchmarks/torch_allreduce_perf.py" -b 1K -e 64M -f 4 "${flag[@]}" \
        --json "$here/$sweep.$mode.$r.json" > "$here/$sweep.$mode.$r.txt"
    done
    GYRE_TORCH_IN_FLIGHT=$mode mpirun -np 2 -x GYRE_TORCH_IN_FLIGHT python3 \
      "$root/benchmarks/ddp_step.py" --models mlp,cnn > "$here/ddp.$mode.$r.txt" 2>&1
  done
done
