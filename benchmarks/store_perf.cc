// gyre-store-perf: the parameter store's pull and push beside MPI_Allreduce
// of the same bytes (docs/training-modes.md). Rank 0 measures; the other
// ranks serve (their server threads) and wait in a barrier.
//   remote  a tensor of one shard owned by rank 1: one request and reply
//   split   a tensor cut into one shard per rank, pulled/pushed from all
//           owners at once (rank 0's own shard served on its thread)
// Each cell is the median of repeated calls (5 to 2000: about 256 MiB moved).
// Usage: mpirun -np 2 gyre-store-perf [max_bytes]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gyre/gyre.h"
#include "gyre/store.h"

namespace {

using Clock = std::chrono::steady_clock;

// The median of `calls` timed calls after one warm-up. The count depends on
// the size alone: every rank makes the same number of MPI_Allreduce calls.
double median_us(int calls, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  while (static_cast<int>(t.size()) < calls) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

gyre::TensorView view(std::vector<float>& v) {
  return gyre::TensorView{v.data(), gyre::DataType::kFloat32, {static_cast<std::int64_t>(v.size())}};
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (64u << 20);
  gyre::init();
  const int rank = gyre::rank(), size = gyre::size();
  if (size < 2) {
    std::fprintf(stderr, "gyre-store-perf needs 2 or more ranks\n");
    gyre::shutdown();
    return 2;
  }
  if (rank == 0) {
    std::printf("# %d ranks; median microseconds per call; GB/s = bytes / time\n", size);
    std::printf("%12s %14s %14s %14s %14s %14s %10s %10s\n", "bytes", "MPI_Allreduce", "pull_remote",
                "push_remote", "pull_split", "push_split", "pull_GB/s", "ar_GB/s");
  }
  for (std::size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / 4;
    const int calls = static_cast<int>(std::clamp<std::size_t>((256u << 20) / bytes, 5, 2000));
    std::vector<float> a(n, 1.0f), b(n, 0.0f), d(n, 0.0f);
    double ar = 0, pull_r = 0, push_r = 0, pull_s = 0, push_s = 0;
    ar = median_us(calls, [&] { MPI_Allreduce(a.data(), b.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    MPI_Barrier(MPI_COMM_WORLD);
    {
      gyre::StoreOptions whole;
      whole.split_bytes = max_bytes * 2;
      gyre::ParameterStore store(gyre::kGlobalProcessSet, whole);
      store.register_tensor("pad", view(a));     // member 0
      store.register_tensor("remote", view(a));  // member 1: the fewest bytes
      if (rank == 0) {
        std::vector<std::int64_t> v = store.pull("remote", view(b));
        pull_r = median_us(calls, [&] { v = store.pull("remote", view(b)); });
        push_r = median_us(calls, [&] { store.push("remote", view(d), v, -1, gyre::PushPolicy::kApply); });
      }
      store.close();
    }
    {
      gyre::StoreOptions split;
      split.split_bytes = bytes / static_cast<std::size_t>(size) > 0 ? bytes / 2 : 0;
      gyre::ParameterStore store(gyre::kGlobalProcessSet, split);
      store.register_tensor("split", view(a));
      if (rank == 0) {
        std::vector<std::int64_t> v = store.pull("split", view(b));
        pull_s = median_us(calls, [&] { v = store.pull("split", view(b)); });
        push_s = median_us(calls, [&] { store.push("split", view(d), v, -1, gyre::PushPolicy::kApply); });
      }
      store.close();
    }
    if (rank == 0) {
      std::printf("%12zu %14.1f %14.1f %14.1f %14.1f %14.1f %10.2f %10.2f\n", bytes, ar, pull_r, push_r,
                  pull_s, push_s, bytes / pull_r / 1e3, bytes / ar / 1e3);
      std::fflush(stdout);
    }
  }
  gyre::shutdown();
  return 0;
}
