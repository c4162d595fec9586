# What one copy and one add cost on this machine, beside the shared-memory
# allreduce and the bound (docs/benchmarks.md, "Against the machine's bound").
# copy_bw N ITERS: memcpy of N MiB into another N MiB buffer, and y += x over
# N MiB of float32, ITERS times each, in GB/s of buffer.
cd /work/main
out=benchmarks/results/bound-2026-11-30
gcc -O3 -march=native $out/copy_bw.c -o /tmp/copy_bw
{
  echo "== one process"; /tmp/copy_bw 64 20; /tmp/copy_bw 256 5
  echo "== two processes at once, 128 MiB each"; /tmp/copy_bw 128 10 & /tmp/copy_bw 128 10; wait
  for m in "--runtime --bound --only gyre" "--shm --bound --only gyre" "--runtime --bound"; do
    echo "== gyre-allreduce-perf $m -b 16M -e 256M -f 4 --blocks 3"
    mpirun --allow-run-as-root --oversubscribe -np 2 build/benchmarks/gyre-allreduce-perf $m \
      -b 16M -e 256M -f 4 --blocks 3 2>&1 | grep -v "^#  "
  done
} > $out/run.txt 2>&1
