# Through the runtime across simulated hosts (1 Gbit/s, 50 ms queue), 16 KiB
# to 256 KiB: the build before the change (OLD, 8ec7419: recursive doubling
# up to 64 KiB) and after (NEW: the model's choice there), alternated.
cd /work/main
OLD=${OLD:-/tmp/ab-old/build}; NEW=${NEW:-build}
out=benchmarks/results/small-rabenseifner-hosts
for round in 1 2 3; do
  for h in 4 8; do
    for which in old new; do
      b=$OLD; [ $which = new ] && b=$NEW
      echo "== round $round hosts $h $which $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      GYRE_HOSTS_RATE=1gbit GYRE_HOSTS_QUEUE_MS=50 timeout 900 bash scripts/hosts.sh run $h 1 \
        $b/benchmarks/gyre-allreduce-perf --runtime -b 16K -e 256K -f 2 -w 3 -n 5 --blocks 5 \
        > $out/h$h-$which-r$round.txt 2>&1
      grep -v "#" $out/h$h-$which-r$round.txt | awk 'NF>10 {printf "%s:%s/%s(%s) ", $1, $5, $9, $NF}'; echo
    done
  done
done
echo DONE
