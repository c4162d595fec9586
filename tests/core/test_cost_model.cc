// The cost model that picks flat or hierarchical under
// GYRE_HIERARCHICAL_ALLREDUCE/_ALLGATHER=-1 (backends/hierarchical/cost_model.h):
// its formulas at hand-computed points, and the choices it makes.
#include <catch2/catch.hpp>

#include "backends/hierarchical/cost_model.h"

using namespace gyre::core;

namespace {

LayoutCost layout(int hosts, int per_host, double net_gbs, double shm_gbs) {
  LayoutCost c;
  c.hosts = hosts;
  c.per_host = per_host;
  c.net = {10e-6, 1.0 / (net_gbs * 1e9)};
  c.shm = {1e-6, 1.0 / (shm_gbs * 1e9)};
  c.small_bytes = 64 << 10;
  return c;
}

}  // namespace

TEST_CASE("cost model: the formulas at hand-computed points", "[cost_model]") {
  const LayoutCost c = layout(2, 2, 1.0, 10.0);  // 1 ns/B network, 0.1 ns/B shm
  // Ring over 4 ranks, 1 MB: 6 steps of (10 us + 250 KB * 1 ns).
  CHECK(flat_allreduce_s(c, 1e6) == Approx(6 * (10e-6 + 250e3 * 1e-9)));
  // Recursive doubling over 4 ranks, 1 KB: 2 steps of (10 us + 1 us).
  CHECK(flat_allreduce_s(c, 1e3) == Approx(2 * (10e-6 + 1e3 * 1e-9)));
  // Hierarchical, 1 MB: two shm passes (1 us + 100 us), then 2 steps of
  // (10 us + 2 shards of 250 KB over the link).
  CHECK(hierarchical_allreduce_s(c, 1e6) == Approx(2 * (1e-6 + 100e-6) + 2 * (10e-6 + 500e3 * 1e-9)));
  // Allgather of 4 MB: flat 3 steps of one 1 MB block; hierarchical 1 step
  // of 2 blocks over the link, then one shm pass over the 4 MB.
  CHECK(flat_allgather_s(c, 4e6) == Approx(3 * (10e-6 + 1e6 * 1e-9)));
  CHECK(hierarchical_allgather_s(c, 4e6) == Approx((10e-6 + 2e6 * 1e-9) + (1e-6 + 4e6 * 0.1e-9)));
}

TEST_CASE("cost model: the defaults choose hierarchical on 2 hosts x 2 ranks at every size",
          "[cost_model]") {
  const LayoutCost c = default_layout_cost(2, 2, 64 << 10);
  for (double bytes = 8; bytes <= 1e9; bytes *= 4) {
    INFO(bytes << " bytes");
    CHECK(hierarchical_allreduce_s(c, bytes) <= flat_allreduce_s(c, bytes));
    CHECK(hierarchical_allgather_s(c, bytes) <= flat_allgather_s(c, bytes));
  }
}

TEST_CASE("cost model: a network faster than shared memory, or many ranks per host on few "
          "hosts with large buffers, choose flat",
          "[cost_model]") {
  // Shared memory slower than the network: never hierarchical for large buffers.
  const LayoutCost fast_net = layout(2, 2, 50.0, 5.0);
  CHECK(flat_allreduce_s(fast_net, 64e6) < hierarchical_allreduce_s(fast_net, 64e6));
  // 8 hosts x 8 ranks on 12.5 GB/s links, 20 GB/s shared memory: the ring
  // moves about as many bytes per link and has no shared-memory passes.
  const LayoutCost dc = layout(8, 8, 12.5, 20.0);
  CHECK(flat_allreduce_s(dc, 64e6) < hierarchical_allreduce_s(dc, 64e6));
  // ... while on 512 hosts the ring's 2(N-1) latency terms make it slower.
  const LayoutCost big = layout(512, 8, 12.5, 20.0);
  CHECK(hierarchical_allreduce_s(big, 64e6) < flat_allreduce_s(big, 64e6));
}
