#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md REPS times (default 3) with 2
# ranks, keeps each run's table (.txt) and rows (.json) in OUT (default
# bench-results/), records the machine, and draws the bandwidth plot.
#
#   GYRE_BUILD=build-bench REPS=3 bash benchmarks/run_all.sh bench-results
#
# Set SKIP_TORCH=1 to leave out the torch.distributed comparison.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../scripts/env.sh"
out=${1:-bench-results}
reps=${REPS:-3}
np=${NP:-2}
perf=$GYRE_BUILD/benchmarks/gyre-allreduce-perf
mkdir -p "$out"
[ -x "$perf" ] || { echo "run_all: $perf not built" >&2; exit 1; }

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc: $(nproc)"
  lscpu | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|L[23] cache)' || true
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "mpirun: $(mpirun --version | head -1)"
  echo "compiler: $(c++ --version | head -1)"
  echo "git: $(git -C "$here/.." rev-parse --short HEAD)"
  echo "load before: $(cat /proc/loadavg)"
} > "$out/machine.txt"

run() {  # run NAME ARGS...: one benchmark run, table on stdout and in NAME.txt
  local name=$1; shift
  echo "== $name: mpirun -np $np gyre-allreduce-perf $*" | tee "$out/$name.txt"
  mpirun -np "$np" "$perf" "$@" --json "$out/$name.json" | tee -a "$out/$name.txt"
}

for r in $(seq 1 "$reps"); do
  run "sweep-bare.$r" -b 8 -e 256M -f 2
  run "sweep-hugepages.$r" -b 1M -e 256M -f 2 --hugepages
  run "sweep-runtime.$r" --runtime -b 8 -e 256M -f 2
  for set in resnet50 bert_base vgg16; do
    run "gradients-$set.$r" --gradients "$here/data/${set}_sizes.txt"
  done
  run "latency.$r" --latency
  if [ -z "${SKIP_TORCH:-}" ]; then
    echo "== torch.$r" | tee "$out/torch.$r.txt"
    mpirun -np "$np" python3 "$here/torch_allreduce_perf.py" -b 1K -e 64M -f 4 \
      --json "$out/torch.$r.json" | tee -a "$out/torch.$r.txt"
    echo "== torch-inplace.$r" | tee "$out/torch-inplace.$r.txt"
    mpirun -np "$np" python3 "$here/torch_allreduce_perf.py" -b 1K -e 64M -f 4 --in-place \
      --json "$out/torch-inplace.$r.json" | tee -a "$out/torch-inplace.$r.txt"
    # PyTorch's allocator on transparent huge pages: a new output tensor per
    # call no longer faults in every 4 KiB page (docs/benchmarks.md).
    echo "== torch-thp.$r" | tee "$out/torch-thp.$r.txt"
    THP_MEM_ALLOC_ENABLE=1 mpirun -np "$np" -x THP_MEM_ALLOC_ENABLE python3 "$here/torch_allreduce_perf.py" \
      -b 1K -e 64M -f 4 --json "$out/torch-thp.$r.json" | tee -a "$out/torch-thp.$r.txt"
  fi
done
echo "load after: $(cat /proc/loadavg)" >> "$out/machine.txt"

plots=("$out"/sweep-bare.*.json "$out"/sweep-hugepages.*.json "$out"/sweep-runtime.*.json)
[ -z "${SKIP_TORCH:-}" ] && plots+=("$out"/torch.*.json "$out"/torch-inplace.*.json "$out"/torch-thp.*.json)
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 "$here/plot_bandwidth.py" -o "$out/busbw.png" "${plots[@]}"
else
  echo "run_all: no plot (python3 -m pip install matplotlib, then run plot_bandwidth.py)" >&2
fi
