# Alternating A/B of the per-call cost from Python, 2 ranks: OLD = the
# package of the commit before the change (pip install --target /tmp/pyold),
# NEW = the installed package of this tree.
cd /work/main
for round in 1 2 3; do
  for which in old new; do
    pp=""; [ $which = old ] && pp=/tmp/pyold
    for d in "" "--dist"; do
      echo "== round $round $which ${d:-allreduce_} $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      mpirun --oversubscribe --allow-run-as-root -np 2 -x PYTHONPATH=$pp python3 benchmarks/torch_call_cost.py --calls 3000 $d 2>&1 | grep -v "^#\|Warn\|W1130" | tail -1
    done
  done
done
