cd /work/main
out=benchmarks/results/speculation-tail
for round in 1 2; do
  for h in 4 8; do
    for s in 16384 64; do
      echo "== round $round hosts $h GYRE_SPECULATE_BYTES=$s $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      GYRE_HOSTS_RATE=1gbit GYRE_HOSTS_QUEUE_MS=50 GYRE_HOSTS_MPIRUN_ARGS="-x GYRE_SPECULATE_BYTES=$s" timeout 900 \
        bash scripts/hosts.sh run $h 1 build/benchmarks/gyre-allreduce-perf --runtime -b 16 -e 64K -f 4 -w 3 -n 5 --blocks 5 \
        --json $out/h$h-spec$s-r$round.json > $out/h$h-spec$s-r$round.txt 2>&1
      grep -v "#" $out/h$h-spec$s-r$round.txt | awk 'NF>10 {printf "%s:%s/%s(%s) ", $1, $5, $9, $NF}'; echo
    done
  done
done
echo DONE
