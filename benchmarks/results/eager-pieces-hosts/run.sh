# Through the runtime across simulated hosts (1 Gbit/s, 50 ms queue), the
# build before the change (OLD, f6ef3fb) and after (NEW), alternated.
cd /work/main
OLD=${OLD:-/tmp/ab-old/build}; NEW=${NEW:-build}
out=benchmarks/results/eager-pieces-hosts
for round in 1 2; do
  for h in 4 8; do
    for which in old new; do
      b=$OLD; [ $which = new ] && b=$NEW
      echo "== round $round hosts $h $which $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      GYRE_HOSTS_RATE=1gbit GYRE_HOSTS_QUEUE_MS=50 timeout 900 bash scripts/hosts.sh run $h 1 \
        $b/benchmarks/gyre-allreduce-perf --runtime -b 16 -e 1M -f 4 -w 3 -n 5 --blocks 5 \
        > $out/h$h-$which-r$round.txt 2>&1
      grep -v "#" $out/h$h-$which-r$round.txt | awk 'NF>10 {printf "%s:%s/%s(%s) ", $1, $5, $9, $NF}'; echo
    done
  done
done
echo DONE
