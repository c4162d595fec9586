#!/usr/bin/env bash
# Issue 28's "figures unchanged" for the torch rows, with CPU torch tensors in
# flight pinned (gyre._torch_memory): before = cb21ce7 (a worktree at
# BEFORE_TREE with its extension built in BEFORE_TREE/build-ab), after = this
# tree (its extension in bindings/python/gyre). Alternating, ROUNDS rounds
# (default 3), 2 ranks, nothing else running: benchmarks/run_all.sh's three
# torch sweeps (out of place, in place, huge pages) and ddp_step.py on the
# CNN and the MLP, each tree running its own copy of the scripts. Raw output
# beside this script; the table: python3 cmp.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
after=$(cd "$here/../../.." && pwd)
before=${BEFORE_TREE:-/work/wt-cb21}
source "$after/scripts/env.sh"
rounds=${ROUNDS:-3}
log=$here/log.txt
: > "$log"
for ((r = 1; r <= rounds; r++)); do
  for v in before after; do
    t=$after; [ "$v" = before ] && t=$before
    export PYTHONPATH=$t/bindings/python
    used=$(python3 -c 'import torch, gyre; from gyre import _gyre; torch.ones(1)
print(getattr(_gyre, "_torch_in_flight_mode", lambda: "(no such mode: before pinning)")(), gyre.__file__)')
    echo "$v round $r: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg); git $(git -C "$t" rev-parse --short HEAD); $used" | tee -a "$log"
    (cd "$t"
     mpirun -np 2 -x PYTHONPATH python3 benchmarks/torch_allreduce_perf.py -b 1K -e 64M -f 4 \
       --json "$here/torch.$v.$r.json" > "$here/torch.$v.$r.txt"
     mpirun -np 2 -x PYTHONPATH python3 benchmarks/torch_allreduce_perf.py -b 1K -e 64M -f 4 \
       --in-place --json "$here/torch-inplace.$v.$r.json" > "$here/torch-inplace.$v.$r.txt"
     THP_MEM_ALLOC_ENABLE=1 mpirun -np 2 -x PYTHONPATH -x THP_MEM_ALLOC_ENABLE python3 \
       benchmarks/torch_allreduce_perf.py -b 1K -e 64M -f 4 \
       --json "$here/torch-thp.$v.$r.json" > "$here/torch-thp.$v.$r.txt"
     mpirun -np 2 -x PYTHONPATH python3 benchmarks/ddp_step.py --models cnn,mlp \
       > "$here/ddp.$v.$r.txt" 2>&1)
  done
done
echo "done $(date -u +%H:%M:%S)" | tee -a "$log"
