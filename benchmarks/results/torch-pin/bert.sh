#!/usr/bin/env bash
# DDP's BERT step with CPU torch tensors in flight pinned against copied
# (GYRE_TORCH_IN_FLIGHT=copy), alternating, ROUNDS rounds (default 2), 2 ranks,
# nothing else running: `ddp_step.py --models bert`, raw output beside.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
source "$root/scripts/env.sh"
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
  for mode in pin copy; do
    echo "bert round $r $mode: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$here/log.txt"
    GYRE_TORCH_IN_FLIGHT=$mode mpirun -np 2 -x GYRE_TORCH_IN_FLIGHT python3 \
      "$root/benchmarks/ddp_step.py" --models bert > "$here/ddp_bert.$mode.$r.txt" 2>&1
  done
done
