#!/bin/bash
# The three versions were measured with a temporary switch in _work.py (GYRE_TMP_LAZY: 0 = callbacks
# registered at the call, 1 = registered on demand), since removed; "orig" is the _work.py of
# 705fab0 in a copy of the package (/tmp/orig_py). Kept as the record of how the table was made.
# A/B/C of dist.all_reduce per-call cost, 2 ranks, alternating
for round in 1 2 3; do
  for v in orig fastwait lazy; do
    case $v in orig) pp=/tmp/orig_py; L=1;; fastwait) pp=/work/main/bindings/python; L=0;; lazy) pp=/work/main/bindings/python; L=1;; esac
    for b in 8 4096; do
    echo "== round $round $v bytes $b"
    PYTHONPATH=$pp GYRE_TMP_LAZY=$L timeout 200 mpirun --oversubscribe --allow-run-as-root -np 2 -x PYTHONPATH -x GYRE_TMP_LAZY \
      python3 /work/main/benchmarks/torch_call_cost.py --calls 3000 --dist --bytes $b 2>&1 | grep -A2 "(us)" | tail -2
    done
  done
done
