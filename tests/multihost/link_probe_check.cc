// Run on every rank of a job across simulated hosts with GYRE_LINK_PROBE=1:
// the cost model's parameters come from the source named by the first
// argument ("probed" or "cached"), are finite and positive, and are the same
// bits on every rank (so every rank chooses the same algorithm); an
// allreduce of 16 MiB taken with them (hierarchical, pipelined by the
// model's choice) gives the closed form. Exits non-zero on any rank that
// saw otherwise; prints the parameters on rank 0.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gyre/gyre.h"

using namespace gyre;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: link_probe_check probed|cached\n");
    return 2;
  }
  const std::string want = argv[1];
  init();
  const int me = rank(), n = size();
  const RuntimeStats st = runtime_stats();
  int wrong = 0;
  if (st.link_source != want) {
    std::fprintf(stderr, "rank %d: link parameters %s, expected %s\n", me, st.link_source.c_str(),
                 want.c_str());
    ++wrong;
  }
  const double mine[4] = {st.net_alpha_s, st.net_bytes_per_s, st.shm_alpha_s, st.shm_bytes_per_s};
  for (double x : mine) {
    if (!std::isfinite(x) || x <= 0) {
      std::fprintf(stderr, "rank %d: link parameter %g\n", me, x);
      ++wrong;
    }
  }
  Handle h = allgather_async("link", TensorView{const_cast<double*>(mine), DataType::kFloat64, {4}});
  h.wait();
  for (int r = 0; r < n; ++r) {
    if (std::memcmp(h.output().data.data() + r * sizeof mine, mine, sizeof mine) != 0) {
      std::fprintf(stderr, "rank %d: rank %d holds other link parameters\n", me, r);
      ++wrong;
    }
  }
  // Sum of (rank + i % 7): exact in float32 for these sizes.
  const std::size_t count = 4u << 20;
  std::vector<float> buf(count);
  for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(me + static_cast<int>(i % 7));
  TensorView v{buf.data(), DataType::kFloat32, {static_cast<std::int64_t>(count)}};
  allreduce_async("big", v, v, ReduceOp::kSum).wait();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const float expect = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 7));
    if (buf[i] != expect) ++bad;
  }
  if (bad) {
    std::fprintf(stderr, "rank %d: %zu wrong elements\n", me, bad);
    ++wrong;
  }
  // Every rank's count of problems, so rank 0's line covers the job.
  std::int32_t total = wrong;
  TensorView t{&total, DataType::kInt32, {1}};
  allreduce_async("wrong", t, t, ReduceOp::kSum).wait();
  shutdown();
  if (me == 0) {
    std::printf("link_probe_check: %s, network %.1f us %.3f GB/s, shared memory %.1f us %.2f GB/s: "
                "%d problems\n",
                st.link_source.c_str(), st.net_alpha_s * 1e6, st.net_bytes_per_s / 1e9,
                st.shm_alpha_s * 1e6, st.shm_bytes_per_s / 1e9, total);
  }
  return total == 0 ? 0 : 1;
}
