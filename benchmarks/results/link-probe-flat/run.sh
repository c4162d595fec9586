# Through the runtime across simulated hosts of one rank each (1 Gbit/s,
# 50 ms queue), 1 KiB to 256 KiB: the cost model with its built-in
# parameters (GYRE_LINK_PROBE=0) and with the probed ones (=1), alternated.
cd /work/main
out=benchmarks/results/link-probe-flat
for round in 1 2 3; do
  for h in 4 8; do
    for probe in 0 1; do
      echo "== round $round hosts $h probe $probe $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      GYRE_LINK_PROBE=$probe GYRE_LOG_LEVEL=info GYRE_HOSTS_RATE=1gbit GYRE_HOSTS_QUEUE_MS=50 timeout 900 \
        bash scripts/hosts.sh run $h 1 \
        build/benchmarks/gyre-allreduce-perf --runtime -b 1K -e 256K -f 2 -w 3 -n 5 --blocks 5 \
        > $out/h$h-probe$probe-r$round.txt 2>&1
      grep -v "#" $out/h$h-probe$probe-r$round.txt | awk 'NF>10 {printf "%s:%s/%s(%s) ", $1, $5, $9, $NF}'; echo
    done
  done
done
echo DONE
